"""`make qemu`: QEMU 10.0.x from Debian's trixie source package, with the project's patch, x86_64 system only.

The unpacked, patched source tree is kept next to the binary: the backend builds its libvhost-user binding
from ``subprojects/libvhost-user`` of exactly this tree.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from vrdma import paths
from vrdma.buildchain import apt
from vrdma.buildchain.cache import CachedProduct, file_digest, record_product, run, step
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

SUITE = "trixie"
# The QEMU line this project targets; a newer upstream series is a deliberate change, not an archive move.
SERIES = "10.0."
# QEMU's configure installs meson from python/wheels when the system's is older than it needs (>= 1.5);
# Debian's source package drops the bundled wheels, so the build puts this one back from PyPI.
MESON_WHEEL = "meson==1.5.0"
CONFIGURE_ARGS = [
    "--target-list=x86_64-softmmu",
    "--disable-install-blobs",   # firmware comes from Debian's seabios and qemu-system-data packages
    "--disable-docs",
    "--disable-debug-info",
    "--disable-werror",
    "--disable-user",
    "--disable-tools",
    "--enable-kvm",
    "--enable-vhost-user",
    "--disable-download",        # never fetch subprojects (dtc, slirp, ...) from the network: fail instead
]
TARGET = "qemu-system-x86_64"
# Bump when the build steps below change in a way that changes the product.
RECIPE_VERSION = 1
# Firmware search path at run time (-L): option ROMs (linuxboot_dma.bin, kvmvapic.bin) and the BIOS.
FIRMWARE_DIRS = ["/usr/share/qemu", "/usr/share/seabios"]


def patch_file() -> Path:
    return paths.qemu_configs_dir() / "vrdma-qemu.patch"


def build() -> dict[str, Any]:
    archive = apt.PrivateArchive.for_suite(SUITE)
    with step(f"resolving the QEMU source package in Debian {SUITE}"):
        archive.update()
        version = archive.source_version("qemu")
    upstream = version.split(":", 1)[-1].split("+", 1)[0].split("-", 1)[0]
    if not upstream.startswith(SERIES):
        raise BuildError(f"Debian {SUITE} now has QEMU {version}, not the {SERIES}x series this project patches; "
                         "update qemu-configs/vrdma-qemu.patch and SERIES in backend/vrdma/buildchain/qemu.py")
    product = CachedProduct("qemu", {
        "source": f"qemu={version}",
        "patch": file_digest(patch_file()),
        "configure": CONFIGURE_ARGS,
        "meson": MESON_WHEEL,
        "recipe": RECIPE_VERSION,
    })
    info = {
        "version": version,
        "binary_path": str(product.path / "bin" / TARGET),
        "source_dir": str(product.path / "src"),
        "firmware_dirs": FIRMWARE_DIRS,
    }
    if product.complete:
        log.info("QEMU %s with the vrdma patch is cached in %s", version, product.path)
    else:
        log.info("building QEMU %s (x86_64 system emulator only); this takes about 5 minutes on 2 cores", version)
        with product.building() as scratch:
            _build_into(archive, version, scratch)
    record_product("qemu", info)
    return info


def _build_into(archive: apt.PrivateArchive, version: str, out: Path) -> None:
    logs = out / "logs"
    src = out / "src"
    with step("downloading the QEMU source package and unpacking it with Debian's patches"):
        archive.unpack_source("qemu", version, out / "dl", src, logs / "unpack.log")
    with step("applying qemu-configs/vrdma-qemu.patch"):
        run(["patch", "-p1", "--forward", "--batch", "-i", patch_file()], cwd=src, log_file=logs / "patch.log")
    with step(f"fetching the {MESON_WHEEL} wheel for QEMU's configure"):
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d",
             src / "python" / "wheels", MESON_WHEEL], log_file=logs / "wheels.log")
    builddir = src / "build"
    builddir.mkdir()
    with step("configuring"):
        run(["../configure", *CONFIGURE_ARGS], cwd=builddir, log_file=logs / "configure.log")
    with step(f"compiling {TARGET} with ninja"):
        _ninja_with_progress(builddir, logs / "ninja.log")
    (out / "bin").mkdir()
    (builddir / TARGET).rename(out / "bin" / TARGET)
    # Object files are not needed after linking; the source tree (libvhost-user) is.
    subprocess.run(["find", builddir, "-name", "*.o", "-delete"], check=False)


def _ninja_with_progress(builddir: Path, log_file: Path) -> None:
    """Run ninja, logging a progress line every tenth of the way; the full output goes to ``log_file``."""
    argv = ["ninja", "-j2", TARGET]
    progress = re.compile(r"^\[(\d+)/(\d+)\]")
    last_decile = -1
    tail: list[str] = []
    with log_file.open("w") as out, subprocess.Popen(argv, cwd=builddir, stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            tail = [*tail[-24:], line.rstrip()]
            match = progress.match(line)
            if match:
                done, total = int(match.group(1)), int(match.group(2))
                decile = done * 10 // total
                if decile > last_decile:
                    last_decile = decile
                    log.info("  ninja: %d/%d steps (%d%%)", done, total, done * 100 // total)
        status = proc.wait()
    if status != 0:
        raise BuildError(f"ninja failed with exit status {status} (full log: {log_file})\n" + "\n".join(tail))
