"""`make provider`: libvrdma, the rdma-core provider, built inside the guest's own rdma-core source tree.

rdma-core has no interface for out-of-tree providers: a provider includes ``infiniband/driver.h`` and links
against the private ``IBVERBS_PRIVATE_<N>`` symbols, neither of which a -dev package ships, and the layout of
``struct verbs_context_ops`` may change between releases that keep the same private ABI number. So the
provider is compiled in the source tree of exactly the rdma-core the guest image installs: the source package
of the guest suite's libibverbs1, downloaded from Debian, with Debian's patches, plus
``providers/vrdma`` (guest-driver/provider) and the shared ABI header as ``kernel-headers/rdma/vrdma-abi.h``.
Only libibverbs and the provider are compiled; the product is ``libvrdma-rdmav<N>.so`` and ``vrdma.driver``.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from vrdma.buildchain import apt
from vrdma.buildchain.cache import CachedProduct, record_product, run, step
from vrdma.buildchain.driver import source_root, sources_digest
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
SOURCE_DIRS = ("provider", "include")
ABI_HEADER = Path("include/uapi/rdma/vrdma-abi.h")
CMAKE_ARGS = [
    "-GNinja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DNO_MAN_PAGES=1",
    "-DNO_PYVERBS=1",
    "-DENABLE_STATIC=0",
    "-DENABLE_WERROR=1",      # the provider compiles without a warning under rdma-core's own flags
    "-DCMAKE_INSTALL_PREFIX=/usr",
    "-DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu",
]


def rdma_core_source(archive: apt.PrivateArchive) -> str:
    """The rdma-core source version behind the guest suite's libibverbs1."""
    candidate = archive.candidates(["libibverbs1"])["libibverbs1"]
    match = re.fullmatch(r"(\S+)(?: \((\S+)\))?", candidate.source or "rdma-core")
    if not match or match.group(1) != "rdma-core":
        raise BuildError(f"libibverbs1 in {archive.suite} comes from '{candidate.source}', not rdma-core")
    return match.group(2) or candidate.version


def build() -> dict[str, Any]:
    archive = apt.PrivateArchive.for_suite(apt.GUEST_SUITE)
    with step(f"resolving rdma-core in Debian {apt.GUEST_SUITE}"):
        archive.update()
        version = rdma_core_source(archive)
    cached = CachedProduct("provider", {"rdma-core": version, "sources": sources_digest(SOURCE_DIRS),
                                        "cmake": CMAKE_ARGS, "recipe": RECIPE_VERSION})
    if cached.complete:
        log.info("libvrdma for rdma-core %s is cached in %s", version, cached.path)
    else:
        with cached.building() as scratch:
            _build_into(archive, version, scratch)
    (library,) = sorted(cached.path.glob("libvrdma-rdmav*.so"))
    info = {"library_path": str(library), "driver_file": str(cached.path / "vrdma.driver"),
            "rdma_core_version": version, "key": cached.key}
    record_product("provider", info)
    return info


def _build_into(archive: apt.PrivateArchive, version: str, out: Path) -> None:
    logs = out / "logs"
    src = out / "rdma-core"
    with step(f"downloading rdma-core {version} and unpacking it with Debian's patches"):
        archive.unpack_source("rdma-core", version, out / "dl", src, logs / "unpack.log")
    with step("adding providers/vrdma and the vrdma ABI header to the tree"):
        _add_provider(src)
    pabi = _private_abi(src)
    target = f"vrdma-rdmav{pabi}"
    builddir = src / "build"
    with step("configuring rdma-core (cmake)"):
        builddir.mkdir()
        run(["cmake", *CMAKE_ARGS, ".."], cwd=builddir, log_file=logs / "cmake.log")
    with step(f"compiling {target} and the libibverbs it links against"):
        run(["ninja", "-j2", target], cwd=builddir, log_file=logs / "ninja.log")
    library = builddir / "lib" / f"lib{target}.so"
    if not library.is_file():
        raise BuildError(f"ninja finished but {library} is missing (log: {logs / 'ninja.log'})")
    shutil.copy2(library, out / library.name)
    (out / "vrdma.driver").write_text("driver vrdma\n")
    shutil.rmtree(src)
    shutil.rmtree(out / "dl")


def _add_provider(src: Path) -> None:
    shutil.copytree(source_root() / "provider", src / "providers" / "vrdma")
    shutil.copy2(source_root() / ABI_HEADER, src / "kernel-headers" / "rdma" / "vrdma-abi.h")
    with (src / "kernel-headers" / "CMakeLists.txt").open("a") as f:
        f.write("\npublish_internal_headers(rdma rdma/vrdma-abi.h)\n")
    top = src / "CMakeLists.txt"
    text = top.read_text()
    anchor = re.search(r"^add_subdirectory\(providers/rxe\)\n", text, flags=re.M)
    if not anchor:
        raise BuildError("rdma-core's CMakeLists.txt no longer adds providers/rxe: update build/provider.py")
    top.write_text(text[:anchor.start()] + "add_subdirectory(providers/vrdma)\n" + text[anchor.start():])


def _private_abi(src: Path) -> str:
    match = re.search(r'^set\(IBVERBS_PABI_VERSION "(\d+)"\)', (src / "CMakeLists.txt").read_text(), flags=re.M)
    if not match:
        raise BuildError("cannot find IBVERBS_PABI_VERSION in rdma-core's CMakeLists.txt")
    return match.group(1)
