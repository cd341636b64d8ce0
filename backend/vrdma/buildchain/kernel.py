"""`make kernel`: the Debian guest kernels and what builds modules for each.

vrdma.ko supports the guest kernels from Debian 12's 6.1 to the newest Debian carries; ``GUEST_KERNELS`` names the
ones every build makes and the tests boot, each after the Debian suite that carries it, never after its ABI
number: the ABI is resolved from the suite's current ``linux-image-amd64`` meta package every time (the archive
moves: an ABI that vanishes from it must not be hard-coded), and ``linux-headers-amd64`` must name the same ABI and
version.

A kernel's modules are built with its own release's compiler. Bookworm's kernel is the host's own release: its
headers are unpacked and used with the host's gcc-12. A newer release's headers need that release's compiler
(trixie's want gcc-14) and their kbuild tools link against its libc, so those kernels come with a build root: a
chroot of their release (buildchain.buildroot) with the headers installed, in which ``kbuild()`` runs make.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrdma.buildchain import apt, buildroot
from vrdma.buildchain.cache import CachedProduct, capture, product, record_product, run, step
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

IMAGE_META = "linux-image-amd64"
HEADERS_META = "linux-headers-amd64"
# Bump when the unpacking, relocation or build root steps change.
RECIPE_VERSION = 3
# What a build root holds beside the headers (which bring their compiler and kbuild tools): make, binutils (7.x's
# headers name gcc-14-for-host, which does not bring the plain `as` gcc runs), and perl, whose
# full library kernel-doc needs (W=1 runs it on every source file).
BUILD_ROOT_PACKAGES = ["make", "perl", "binutils"]


@dataclass(frozen=True)
class GuestKernel:
    name: str
    suite: str | None     # the private archive's suite (apt.PrivateArchive); None: the machine's own apt
    release: str | None   # the suite within it to take the kernel from first (the backports suite), if not the main
    summary: str


GUEST_KERNELS = {k.name: k for k in (
    GuestKernel("bookworm", None, None, "Debian 12's kernel (6.1), the oldest vrdma supports"),
    GuestKernel("trixie", "trixie", None, "Debian 13's kernel (6.12), the one Debian's users run"),
    GuestKernel("trixie-backports", "trixie", "trixie-backports", "the newest kernel Debian carries"),
)}
# The kernel the guest image boots unless a test asks for another.
DEFAULT_KERNEL = "trixie"


def guest_kernel(name: str) -> GuestKernel:
    try:
        return GUEST_KERNELS[name]
    except KeyError:
        raise BuildError(f"no guest kernel {name!r}: one of {', '.join(GUEST_KERNELS)}") from None


def product_kind(kind: str, kernel: str) -> str:
    """The products.json name of a per-kernel product: ``kernel/trixie``, ``driver/trixie``, ``image/trixie``.
    The default kernel's are also recorded under the bare kind, which the harness uses unless told otherwise."""
    return f"{kind}/{kernel}"


def record_kernel_product(kind: str, kernel: str, info: dict[str, Any]) -> None:
    record_product(product_kind(kind, kernel), info)
    if kernel == DEFAULT_KERNEL:
        record_product(kind, info)


def kernel_product(kind: str, kernel: str | None) -> dict[str, Any]:
    """The recorded per-kernel product (the default kernel's when ``kernel`` is None)."""
    return product(kind if kernel is None else product_kind(kind, kernel))


def resolve(kernel: GuestKernel) -> tuple[list[str], list[str], str]:
    """Return ([image packages], [header packages], version) for the suite's current guest kernel.

    The image packages are ``linux-image-<abi>`` and, from 7.x on, the parts it is split into and depends on
    (``linux-binary-<abi>``, ``linux-modules-<abi>``, ``linux-base-<abi>``): every dependency named after the ABI.
    """
    archive = kernel_archive(kernel)
    query = (lambda names: archive.candidates(names, kernel.release)) if archive else apt.candidates
    metas = query([IMAGE_META, HEADERS_META])
    image_pkg = next((d for d in metas[IMAGE_META].depends if d.startswith("linux-image-")), "")
    headers_pkg = next((d for d in metas[HEADERS_META].depends if d.startswith("linux-headers-")), "")
    if not image_pkg or not headers_pkg:
        raise BuildError(f"unexpected dependencies of the kernel meta packages in {kernel.name}: "
                         f"{metas[IMAGE_META].depends}, {metas[HEADERS_META].depends}")
    release = image_pkg.removeprefix("linux-image-")
    image_version, headers_version = metas[IMAGE_META].version, metas[HEADERS_META].version
    if headers_pkg.removeprefix("linux-headers-") != release or headers_version != image_version:
        raise BuildError(f"{IMAGE_META} {image_version} ({image_pkg}) and {HEADERS_META} {headers_version} "
                         f"({headers_pkg}) do not match in {kernel.name}; wait for the archive to settle or run "
                         "`apt-get update`")
    real = query([image_pkg, headers_pkg])
    # linux-headers-<abi>-amd64 needs its -common part and the kbuild tools of the same version.
    header_pkgs = [headers_pkg] + [d for d in real[headers_pkg].depends
                                   if d.startswith(("linux-headers-", "linux-kbuild-"))]
    image_pkgs = [image_pkg] + [d for d in real[image_pkg].depends if d.endswith(f"-{release}")]
    return image_pkgs, header_pkgs, real[image_pkg].version


def kernel_archive(kernel: GuestKernel) -> apt.PrivateArchive | None:
    """The private archive a kernel comes from (None: the machine's own apt)."""
    if not kernel.suite:
        return None
    return apt.PrivateArchive.for_suite(kernel.suite, backports=bool(kernel.release))


def build(name: str = DEFAULT_KERNEL) -> dict[str, Any]:
    kernel = guest_kernel(name)
    archive = kernel_archive(kernel)
    with step(f"resolving the current guest kernel of {name}"):
        if archive:
            archive.update()
        image_pkgs, header_pkgs, version = resolve(kernel)
    release = image_pkgs[0].removeprefix("linux-image-")
    log.info("guest kernel %s: %s %s (headers: %s)", name, ", ".join(image_pkgs), version, ", ".join(header_pkgs))
    product = CachedProduct("kernel", {"packages": [*image_pkgs, *header_pkgs], "version": version,
                                       "suite": kernel.suite, "build_root": BUILD_ROOT_PACKAGES if archive else None,
                                       "recipe": RECIPE_VERSION})
    if not product.complete:
        with product.building() as scratch:
            _build_into(scratch, kernel, archive, image_pkgs, header_pkgs, version, release)
    root = product.path / "root"
    modules = root / "lib" / "modules" / release
    info = {
        "name": name,
        "release": release,
        "version": version,
        "vmlinuz_path": str(_kernel_file(root, release, "vmlinuz")),
        "modules_dir": str(modules),
        "config_path": str(_kernel_file(root, release, "config")),
    }
    info.update(_toolchain(product.path, release, archive is not None))
    for key in ("vmlinuz_path", "modules_dir", "headers_dir", "config_path"):
        if not Path(info[key]).exists():
            raise BuildError(f"kernel product is incomplete: {info[key]} is missing")
    record_kernel_product("kernel", name, info)
    return info


def _toolchain(directory: Path, release: str, has_build_root: bool) -> dict[str, str]:
    """Where a kernel product in ``directory`` keeps what builds modules: the headers, in its build root if it has
    one (trixie's kernels) or unpacked beside it (bookworm's)."""
    if has_build_root:
        return {"build_root_dir": str(directory / "build-root"),
                "headers_dir": str(directory / "build-root" / "usr" / "src" / f"linux-headers-{release}")}
    return {"headers_dir": str(directory / "headers" / "usr" / "src" / f"linux-headers-{release}")}


def _kernel_file(root: Path, release: str, name: str) -> Path:
    """/boot/<name>-<release> until 6.x; from 7.x, /usr/lib/modules/<release>/<name>."""
    boot = root / "boot" / f"{name}-{release}"
    return boot if boot.exists() else root / "lib" / "modules" / release / name


def _build_into(scratch: Path, kernel: GuestKernel, archive: apt.PrivateArchive | None, image_pkgs: list[str],
                header_pkgs: list[str], version: str, release: str) -> None:
    with step(f"downloading {', '.join(image_pkgs)}"):
        if archive:
            debs = archive.download(dict.fromkeys(image_pkgs, version), scratch / "debs")
        else:
            debs = apt.download([*image_pkgs, *header_pkgs], scratch / "debs")
    with step("unpacking"):
        for deb in debs:
            dest = scratch / ("headers" if deb.name.startswith(("linux-headers-", "linux-kbuild-")) else "root")
            run(["dpkg-deb", "-x", deb, dest])
        # Trixie's packages ship /usr/lib only (merged /usr: base-files makes /lib a link); do the same here.
        if not (scratch / "root" / "lib").exists():
            (scratch / "root" / "lib").symlink_to("usr/lib")
        # The package leaves modules.dep to its postinst; generate it as an install would.
        run(["depmod", "-b", scratch / "root", release])
    info: dict[str, Any] = {"release": release}
    if archive:
        with step(f"making a {archive.suite} build root with the kernel's headers and compiler (mmdebstrap)"):
            # The headers' own version: the exact kernel, whichever suite of the archive holds it.
            buildroot.make(archive, [*BUILD_ROOT_PACKAGES, f"{header_pkgs[0]}={version}"], scratch / "build-root",
                           scratch / "logs" / "mmdebstrap.log")
    else:
        _relocate_headers(Path(_toolchain(scratch, release, False)["headers_dir"]))
    info.update(_toolchain(scratch, release, archive is not None))
    with step("checking that the headers build a module for this kernel"):
        _check_headers(info, scratch / "headers-check")


def kbuild(kernel: dict[str, Any], tree: Path, module_dir: str, log_file: Path, *extra: str) -> None:
    """``make -C <headers> M=<tree>/<module_dir> <extra> modules`` for the kernel product ``kernel``: on the
    host, or in the kernel's build root, which sees ``tree`` (the module's directory and the ones its Kbuild
    includes from) through buildroot.run_in's bind mount."""
    build_root = kernel.get("build_root_dir")
    if not build_root:
        run(["make", "-C", kernel["headers_dir"], f"M={tree / module_dir}", *extra, "modules"], log_file=log_file)
        return
    headers = "/" + str(Path(kernel["headers_dir"]).relative_to(build_root))
    buildroot.run_in(Path(build_root), tree, ["make", "-C", headers, f"M={buildroot.MOUNT}/{module_dir}", *extra,
                                              "modules"], log_file)


def _relocate_headers(headers: Path) -> None:
    """Make the unpacked headers usable where they are, not only under /usr/src.

    Debian's per-flavour headers Makefile includes the -common tree by absolute path; point it at the sibling
    directory unpacked next to it instead, so out-of-tree modules build without installing anything.
    """
    makefile = headers / "Makefile"
    text = makefile.read_text()
    prefix = "include /usr/src/"
    if not text.startswith(prefix):
        raise BuildError(f"unexpected {makefile}: {text[:80]!r}")
    common = text.removeprefix(prefix).strip()
    makefile.write_text(f"include $(dir $(lastword $(MAKEFILE_LIST)))../{common}\n")


def _check_headers(kernel: dict[str, Any], workdir: Path) -> None:
    """Build an empty module against the headers and check its vermagic names the kernel release."""
    workdir.mkdir()
    (workdir / "probe.c").write_text('#include <linux/module.h>\nMODULE_LICENSE("GPL");\n')
    (workdir / "Kbuild").write_text("obj-m := probe.o\n")
    kbuild(kernel, workdir, ".", workdir / "build.log")
    check_vermagic(workdir / "probe.ko", kernel["release"])


def check_vermagic(module: Path, release: str) -> None:
    vermagic = capture(["modinfo", "-F", "vermagic", module]).split()
    if not vermagic or vermagic[0] != release:
        raise BuildError(f"{module.name} was built for {vermagic[:1]}, not {release}")
