"""`make kernel`: the Debian guest kernel and the linux-headers that match it exactly.

The kernel ABI is resolved from the archive's current ``linux-image-amd64`` meta package every time (the archive
moves: an ABI that vanishes from it must not be hard-coded); the headers come from ``linux-headers-amd64``
and must name the same ABI and version.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vrdma.buildchain import apt
from vrdma.buildchain.cache import CachedProduct, capture, record_product, run, step
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

IMAGE_META = "linux-image-amd64"
HEADERS_META = "linux-headers-amd64"
# Bump when the unpacking or relocation steps change.
RECIPE_VERSION = 2


def resolve() -> tuple[str, list[str], str]:
    """Return (image package, [header packages], version) for the archive's current guest kernel."""
    metas = apt.candidates([IMAGE_META, HEADERS_META])
    image_pkg, headers_pkg = metas[IMAGE_META].depends[0], metas[HEADERS_META].depends[0]
    if not image_pkg.startswith("linux-image-") or not headers_pkg.startswith("linux-headers-"):
        raise BuildError(f"unexpected dependencies of the kernel meta packages: {image_pkg!r}, {headers_pkg!r}")
    release = image_pkg.removeprefix("linux-image-")
    image_version, headers_version = metas[IMAGE_META].version, metas[HEADERS_META].version
    if headers_pkg.removeprefix("linux-headers-") != release or headers_version != image_version:
        raise BuildError(f"{IMAGE_META} {image_version} ({image_pkg}) and {HEADERS_META} {headers_version} "
                         f"({headers_pkg}) do not match; wait for the archive to settle or run `apt-get update`")
    real = apt.candidates([image_pkg, headers_pkg])
    # linux-headers-<abi>-amd64 needs its -common part and the kbuild tools of the same version.
    header_pkgs = [headers_pkg] + [d for d in real[headers_pkg].depends
                                   if d.startswith(("linux-headers-", "linux-kbuild-"))]
    return image_pkg, header_pkgs, real[image_pkg].version


def build() -> dict[str, Any]:
    with step("resolving the current Debian guest kernel"):
        image_pkg, header_pkgs, version = resolve()
    release = image_pkg.removeprefix("linux-image-")
    log.info("guest kernel: %s %s (headers: %s)", image_pkg, version, ", ".join(header_pkgs))
    product = CachedProduct("kernel", {"packages": [image_pkg, *header_pkgs], "version": version,
                                       "recipe": RECIPE_VERSION})
    if not product.complete:
        with product.building() as scratch:
            with step("downloading the kernel and header packages"):
                debs = apt.download([image_pkg, *header_pkgs], scratch / "debs")
            with step("unpacking them"):
                for deb in debs:
                    dest = scratch / ("root" if deb.name.startswith("linux-image-") else "headers")
                    run(["dpkg-deb", "-x", deb, dest])
                # The package leaves modules.dep to its postinst; generate it as an install would.
                run(["depmod", "-b", scratch / "root", "-F", scratch / "root" / "boot" / f"System.map-{release}",
                     release])
                _relocate_headers(scratch / "headers" / "usr" / "src" / f"linux-headers-{release}")
            with step("checking that the headers build a module for this kernel"):
                _check_headers(scratch / "headers" / "usr" / "src" / f"linux-headers-{release}", release,
                               scratch / "headers-check")
    root = product.path / "root"
    headers = product.path / "headers" / "usr" / "src" / f"linux-headers-{release}"
    info = {
        "release": release,
        "version": version,
        "vmlinuz_path": str(root / "boot" / f"vmlinuz-{release}"),
        "modules_dir": str(root / "lib" / "modules" / release),
        "headers_dir": str(headers),
    }
    for key in ("vmlinuz_path", "modules_dir", "headers_dir"):
        if not Path(info[key]).exists():
            raise BuildError(f"kernel product is incomplete: {info[key]} is missing")
    record_product("kernel", info)
    return info


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


def _check_headers(headers: Path, release: str, workdir: Path) -> None:
    """Build an empty module against the headers and check its vermagic names the kernel release."""
    workdir.mkdir()
    (workdir / "probe.c").write_text('#include <linux/module.h>\nMODULE_LICENSE("GPL");\n')
    (workdir / "Kbuild").write_text("obj-m := probe.o\n")
    run(["make", "-C", headers, f"M={workdir}", "modules"], log_file=workdir / "build.log")
    vermagic = capture(["modinfo", "-F", "vermagic", workdir / "probe.ko"]).split()
    if not vermagic or vermagic[0] != release:
        raise BuildError(f"headers in {headers} build modules for {vermagic[:1]}, not {release}")
