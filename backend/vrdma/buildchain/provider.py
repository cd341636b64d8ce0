"""`make provider`: libvrdma, the rdma-core provider, built inside the guest's own rdma-core source tree.

rdma-core has no interface for out-of-tree providers: a provider includes ``infiniband/driver.h`` and links
against the private ``IBVERBS_PRIVATE_<N>`` symbols, neither of which a -dev package ships, and the layout of
``struct verbs_context_ops`` may change between releases that keep the same private ABI number. So the
provider is compiled in the source tree of exactly the rdma-core the guest image installs: the source package
of the guest suite's libibverbs1, downloaded from Debian, with Debian's patches, plus
``providers/vrdma`` (guest-driver/provider, with the device API header vrdma_dev_api.h beside it) and the user ABI
header as ``kernel-headers/rdma/vrdma-abi.h``, registered as a kernel provider ABI so that rdma-core generates the
``kernel-abi/vrdma-abi.h`` its ``DECLARE_DRV_CMD`` wrappers are made from, as it does for in-tree providers.
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

RECIPE_VERSION = 4  # 4: libvrdma-compchan beside the provider
SOURCE_DIRS = ("provider", "include")
USER_ABI_HEADER = Path("include/uapi/rdma/vrdma-abi.h")
# The device API: vrdma_dev_api.h and the two it includes.
DEVICE_API_HEADERS = [Path("include") / name for name in ("vrdma_dev_api.h", "vrdma_dev_ring.h", "vrdma_dev_cmd.h")]
CHANNEL_HEADER = Path("include") / "vrdma_channel.h"  # a container's device (provider/channel.c)
COMPCHAN = "vrdma-compchan"  # completion channels for a container's device, preloaded by its image (compchan.c)
CMAKE_ARGS = [
    "-GNinja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DNO_MAN_PAGES=1",
    "-DNO_PYVERBS=1",
    "-DENABLE_STATIC=0",
    "-DENABLE_WERROR=1",      # the provider compiles without a warning under rdma-core's own flags
    "-DCMAKE_INSTALL_PREFIX=/usr",
    "-DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu",
    "-DCMAKE_SKIP_RPATH=ON",  # no RUNPATH to the build tree in the library (the guest finds libibverbs itself)
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
            "compchan_path": str(cached.path / f"lib{COMPCHAN}.so"),
            "rdma_core_version": version, "key": cached.key}
    record_product("provider", info)
    return info


def _build_into(archive: apt.PrivateArchive, version: str, out: Path) -> None:
    logs = out / "logs"
    src = out / "rdma-core"
    with step(f"downloading rdma-core {version} and unpacking it with Debian's patches"):
        archive.unpack_source("rdma-core", version, out / "dl", src, logs / "unpack.log")
    with step("adding providers/vrdma and the vrdma headers to the tree"):
        _add_provider(src)
    pabi = _private_abi(src)
    target = f"vrdma-rdmav{pabi}"
    builddir = src / "build"
    with step("configuring rdma-core (cmake)"):
        builddir.mkdir()
        run(["cmake", *CMAKE_ARGS, ".."], cwd=builddir, log_file=logs / "cmake.log")
    with step(f"compiling {target}, the libibverbs it links against, and {COMPCHAN}"):
        run(["ninja", "-j2", target, COMPCHAN], cwd=builddir, log_file=logs / "ninja.log")
    for library in (builddir / "lib" / f"lib{target}.so", builddir / "providers" / "vrdma" / f"lib{COMPCHAN}.so"):
        if not library.is_file():
            raise BuildError(f"ninja finished but {library} is missing (log: {logs / 'ninja.log'})")
        shutil.copy2(library, out / library.name)
    (out / "vrdma.driver").write_text("driver vrdma\n")
    shutil.rmtree(src)
    shutil.rmtree(out / "dl")


def _add_provider(src: Path) -> None:
    provider = src / "providers" / "vrdma"
    shutil.copytree(source_root() / "provider", provider)
    for header in [*DEVICE_API_HEADERS, CHANNEL_HEADER]:
        shutil.copy2(source_root() / header, provider / header.name)
    shutil.copy2(source_root() / USER_ABI_HEADER, src / "kernel-headers" / "rdma" / USER_ABI_HEADER.name)
    headers = src / "kernel-headers" / "CMakeLists.txt"
    text = headers.read_text()
    # rdma_kernel_provider_abi() may be called only once (it defines the kern-abi target): join its list.
    call = re.search(r"^rdma_kernel_provider_abi\(\n", text, flags=re.M)
    if not call:
        raise BuildError("rdma-core's kernel-headers/CMakeLists.txt no longer calls rdma_kernel_provider_abi(): "
                         "update buildchain/provider.py")
    text = text[:call.end()] + "  rdma/vrdma-abi.h\n" + text[call.end():]
    headers.write_text(text + "\npublish_internal_headers(rdma rdma/vrdma-abi.h)\n")
    top = src / "CMakeLists.txt"
    text = top.read_text()
    anchor = re.search(r"^add_subdirectory\(providers/rxe\)\n", text, flags=re.M)
    if not anchor:
        raise BuildError("rdma-core's CMakeLists.txt no longer adds providers/rxe: update buildchain/provider.py")
    top.write_text(text[:anchor.start()] + "add_subdirectory(providers/vrdma)\n" + text[anchor.start():])


def _private_abi(src: Path) -> str:
    match = re.search(r'^set\(IBVERBS_PABI_VERSION "(\d+)"\)', (src / "CMakeLists.txt").read_text(), flags=re.M)
    if not match:
        raise BuildError("cannot find IBVERBS_PABI_VERSION in rdma-core's CMakeLists.txt")
    return match.group(1)
