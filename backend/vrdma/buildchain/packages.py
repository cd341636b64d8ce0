"""`make packages`: the Debian packages an operator installs on a host and a user installs in a guest
(docs/packaging.md).

Two source packages, each built with dpkg-buildpackage and debhelper in a build root of its target release
(buildchain.buildroot), so that its compiler, Python and the shared-library dependencies dh_shlibdeps computes are
that release's:

- ``vrdma`` (packaging/debian): ``vrdma-dkms``, the guest driver's source that DKMS builds in the guest for every
  kernel with headers, and ``vrdma-backend``, the host side (the backend with its C engine and libvhost-user
  binding, the ``vrdma`` command, the systemd unit, its drop-in for RoCE, its sysusers file, the configuration file,
  manual pages from help2man). Built for bookworm (the hosts this project runs on) and trixie.
- ``libvrdma`` (packaging/libvrdma): the rdma-core provider `make provider` compiles in the source tree of the guest
  release's rdma-core, depending on exactly that upstream release. Built for trixie only: the provider needs the
  rdma-core source its guests run, and Debian's mirror no longer has bookworm's (docs/guest-driver.md).

Each .deb is checked with lintian; a tag that remains is explained in the package's lintian-overrides, and any
other warning or error fails the build. The packages are also copied to build/packages/<release>/.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrdma import paths
from vrdma.buildchain import apt, buildroot
from vrdma.buildchain.cache import CachedProduct, product, record_product, step
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
# What a package build root holds: the packaging tools and the build dependencies of both source packages.
BUILD_ROOT_PACKAGES = ["build-essential", "debhelper", "dh-dkms", "dh-python", "help2man", "python3-all-dev",
                       "python3-cffi", "python3-setuptools"]
# The checkout's files each source package is made of (directories copied whole, without build output).
VRDMA_SOURCES = ["backend/vrdma", "setup.py", "pyproject.toml", "README.md", "docs", "guest-driver/kernel",
                 "guest-driver/include", "packaging/backend.toml", "packaging/systemd", "packaging/libvirt"]
LIBVRDMA_SOURCES = ["docs/guest-driver.md"]
IGNORED = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "*.pyc", ".*")


@dataclass(frozen=True)
class Target:
    release: str
    sources: tuple[str, ...]  # the source packages built for it


TARGETS = {t.release: t for t in (Target("bookworm", ("vrdma",)), Target("trixie", ("vrdma", "libvrdma")))}


def build(release: str = "all") -> list[dict[str, Any]]:
    releases = list(TARGETS) if release == "all" else [release]
    unknown = [r for r in releases if r not in TARGETS]
    if unknown:
        raise BuildError(f"no package target {unknown[0]!r}: one of {', '.join(TARGETS)} or all")
    return [_build_release(TARGETS[r]) for r in releases]


def _build_release(target: Target) -> dict[str, Any]:
    archive = apt.PrivateArchive.for_suite(target.release)
    with step(f"resolving the packaging tools of Debian {target.release}"):
        archive.update()
        tools = {p: c.version for p, c in archive.candidates(BUILD_ROOT_PACKAGES).items()}
    provider = product("provider") if "libvrdma" in target.sources else None
    root_packages = list(BUILD_ROOT_PACKAGES)
    if provider:
        # dh_shlibdeps reads the libibverbs1 the provider was built for.
        root_packages.append(f"libibverbs1={provider['rdma_core_version']}")
    libvhost_user = Path(product("qemu")["source_dir"]) / "subprojects" / "libvhost-user"
    inputs = {"release": target.release, "tools": tools, "root": root_packages, "recipe": RECIPE_VERSION,
              "vrdma": _digest([paths.project_root() / s for s in VRDMA_SOURCES] + [libvhost_user,
                                                                                  _packaging("debian")]),
              "libvrdma": _digest([_packaging("libvrdma"), *(paths.project_root() / s for s in LIBVRDMA_SOURCES)])
              if provider else None,
              "provider": provider["key"] if provider else None}
    cached = CachedProduct("packages", inputs)
    if cached.complete:
        log.info("packages for %s are cached in %s", target.release, cached.path)
    else:
        build_root = _package_root(archive, root_packages, tools)
        with cached.building() as scratch:
            tree = scratch / "src"
            _stage_vrdma(tree / "vrdma", libvhost_user)
            if provider:
                _stage_libvrdma(tree / "libvrdma", provider)
            for source in target.sources:
                with step(f"building the {source} packages for {target.release} (dpkg-buildpackage)"):
                    buildroot.run_in(build_root, tree, ["dpkg-buildpackage", "-b", "-us", "-uc"],
                                     scratch / "logs" / f"{source}.log", cwd=source)
            out = scratch / "debs"
            out.mkdir()
            for deb in tree.glob("*.deb"):
                deb.rename(out / deb.name)
            shutil.rmtree(tree)
            with step(f"checking the {target.release} packages with lintian"):
                _lintian(sorted(out.glob("*.deb")), scratch / "logs" / "lintian.log")
    debs = sorted((cached.path / "debs").glob("*.deb"))
    published = paths.build_dir() / "packages" / target.release
    shutil.rmtree(published, ignore_errors=True)
    published.mkdir(parents=True)
    for deb in debs:
        shutil.copy2(deb, published / deb.name)
    info = {"packages_dir": str(published), "debs": [d.name for d in debs], "key": cached.key}
    record_product(f"packages/{target.release}", info)
    log.info("packages for Debian %s in %s: %s", target.release, published, ", ".join(info["debs"]))
    return info


def _package_root(archive: apt.PrivateArchive, packages: list[str], tools: dict[str, str]) -> Path:
    """The release's build root for packages, made once per set of tool versions."""
    cached = CachedProduct("package-root", {"suite": archive.suite, "packages": packages, "tools": tools,
                                            "recipe": RECIPE_VERSION})
    if not cached.complete:
        with cached.building() as scratch, step(f"making a {archive.suite} build root with debhelper (mmdebstrap)"):
            buildroot.make(archive, packages, scratch / "root", scratch / "logs" / "mmdebstrap.log")
    return cached.path / "root"


def _packaging(name: str) -> Path:
    return paths.project_root() / "packaging" / name


def _digest(sources: list[Path]) -> str:
    """Hash of the named files and directories' files (names and contents), build output left out."""
    digest = hashlib.sha256()
    for source in sources:
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
        for path in files:
            if any(part == "__pycache__" or part.startswith(".") for part in path.parts[-3:]) or \
                    path.suffix in (".so", ".o", ".pyc"):
                continue
            name = path.relative_to(source.parent)  # not the checkout's own path: a fresh clone hits the cache
            digest.update(f"{name}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _copy(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, dest, ignore=IGNORED)
    else:
        shutil.copy2(source, dest)


def _stage_vrdma(dest: Path, libvhost_user: Path) -> None:
    """The vrdma source package: the checkout's files it is made of, libvhost-user's source, and debian/ (the
    systemd unit, the sysusers file and dkms.conf renamed as debhelper finds them)."""
    root = paths.project_root()
    for source in VRDMA_SOURCES:
        _copy(root / source, dest / source)
    _copy(libvhost_user, dest / "libvhost-user")
    _copy(_packaging("debian"), dest / "debian")
    shutil.copy2(root / "packaging" / "systemd" / "vrdma-backend.service", dest / "debian" / "vrdma-backend.service")
    shutil.copy2(root / "packaging" / "systemd" / "vrdma.sysusers", dest / "debian" / "vrdma-backend.sysusers")
    shutil.copy2(root / "guest-driver" / "dkms.conf", dest / "debian" / "vrdma-dkms.dkms")


def _stage_libvrdma(dest: Path, provider: dict[str, Any]) -> None:
    root = paths.project_root()
    for source in LIBVRDMA_SOURCES:
        _copy(root / source, dest / source)
    _copy(_packaging("libvrdma") / "debian", dest / "debian")
    prebuilt = dest / "prebuilt"
    prebuilt.mkdir()
    shutil.copy2(provider["library_path"], prebuilt)
    shutil.copy2(provider["driver_file"], prebuilt / "vrdma.driver")
    (prebuilt / "rdma-core-version").write_text(provider["rdma_core_version"] + "\n")


def _lintian(debs: list[Path], log_file: Path) -> None:
    """lintian on each package: errors and warnings fail the build (what remains is overridden in the package,
    with the reason beside it); informational tags are logged."""
    proc = subprocess.run(["lintian", "--info", "--display-info", "--fail-on", "error,warning", *debs],
                          capture_output=True, text=True, check=False)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(proc.stdout + proc.stderr)
    for line in proc.stdout.splitlines():
        if line[:2] in ("E:", "W:", "I:", "X:", "P:", "O:"):  # the tags (their explanations stay in the log)
            log.info("lintian: %s", line)
    if proc.returncode != 0:
        raise BuildError(f"lintian found problems in the packages (full log: {log_file}):\n{proc.stdout[-3000:]}"
                         f"{proc.stderr[-1000:]}")
