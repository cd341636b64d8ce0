"""`make debian-guest`: a full Debian guest as a user has one, to install the project's packages in.

Unlike the test image (an initramfs of unpacked packages with busybox init, `make image`), this is Debian trixie
installed by apt (mmdebstrap, maintainer scripts run): systemd as init, udev, apt and dpkg, Debian's own kernel
with its headers (for DKMS) and initramfs, and nothing of the project's. tests/vm/test_vm_debian_guest.py installs
the packages of `make packages` in it with apt, lets DKMS build vrdma.ko against the guest's own headers, reboots
it, and runs RDMA programs between two such guests and the backend's systemd service inside one.

The root filesystem is an ext4 disk image (mke2fs -d, no loop device), which guests open read-only with QEMU's
snapshot=on: each gets its own writes, kept across a reboot of the guest, gone when its QEMU exits. QEMU boots the
kernel and initramfs Debian installed in it (copied beside the disk: direct kernel boot, no boot loader).
The guest has no network to Debian's archive: the packages the project's packages depend on are installed here.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from vrdma.buildchain import apt
from vrdma.buildchain.cache import CachedProduct, content_key, file_digest, record_product, run, step
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

SUITE = "trixie"
RECIPE_VERSION = 1
DISK_SIZE = "6G"  # sparse: about 2 GiB of it is used
PACKAGES = [
    "systemd-sysv", "udev", "dbus", "kmod", "iproute2", "e2fsprogs", "initramfs-tools",
    "linux-image-amd64", "linux-headers-amd64",  # Debian's kernel and the headers DKMS builds against
    "dkms",                                      # and DKMS, with the compiler and make it depends on
    "qemu-guest-agent",                          # how the harness runs commands in the guest
    "libibverbs1", "ibverbs-providers", "ibverbs-utils", "librdmacm1t64", "rdmacm-utils",
    "nvme-cli", "fio",                           # NVMe over Fabrics, written and read back
    # What vrdma-backend depends on (the guest cannot reach the archive to fetch it when the package is installed).
    "python3", "python3-cffi", "python3-prometheus-client",
    "prometheus-node-exporter",                  # its infiniband collector reads vrdma0's port counters
]
GUEST_FILES = Path(__file__).with_name("debian_guest")
# The kernel command line the guest needs besides the harness's own (qemu_cmdline.kernel_append).
APPEND = "root=/dev/vda rw net.ifnames=0"


def build() -> dict[str, Any]:
    archive = apt.PrivateArchive.for_suite(SUITE)
    with step(f"resolving the full guest's packages in Debian {SUITE}"):
        archive.update()
        versions = {pkg: c.version for pkg, c in archive.candidates(PACKAGES).items()}
    recipe = {name: file_digest(GUEST_FILES / name) for name in sorted(p.name for p in GUEST_FILES.iterdir())}
    recipe["debian_guest.py"] = file_digest(Path(__file__))
    cached = CachedProduct("debian-guest", {"packages": versions, "recipe": content_key(recipe),
                                            "version": RECIPE_VERSION})
    if cached.complete:
        log.info("the full Debian guest is cached in %s", cached.path)
    else:
        with cached.building() as scratch:
            _build_into(scratch, archive)
    (vmlinuz,) = sorted(cached.path.glob("vmlinuz-*"))
    release = vmlinuz.name.removeprefix("vmlinuz-")
    info = {"disk_path": str(cached.path / "disk.img"), "vmlinuz_path": str(vmlinuz),
            "initrd_path": str(cached.path / f"initrd.img-{release}"), "release": release, "append": APPEND}
    record_product("debian-guest", info)
    return info


def _build_into(out: Path, archive: apt.PrivateArchive) -> None:
    root = out / "root"
    with step(f"installing Debian {SUITE} with systemd, its kernel, headers and DKMS (mmdebstrap)"):
        run(["mmdebstrap", "--variant=apt", "--include=" + ",".join(PACKAGES), SUITE, root,
             archive.binary_sources], log_file=out / "logs" / "mmdebstrap.log")
    with step("configuring it"):
        (root / "etc" / "fstab").write_text("/dev/vda / ext4 defaults,errors=remount-ro 0 1\n")
        (root / "etc" / "hostname").write_text("debian-guest\n")
        (root / "etc" / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        shutil.copy(GUEST_FILES / "vrdma-guest-setup", root / "usr" / "local" / "sbin" / "vrdma-guest-setup")
        units = root / "etc" / "systemd" / "system"
        shutil.copy(GUEST_FILES / "vrdma-guest.service", units / "vrdma-guest.service")
        wants = units / "multi-user.target.wants"
        wants.mkdir(exist_ok=True)
        (wants / "vrdma-guest.service").symlink_to("/etc/systemd/system/vrdma-guest.service")
        # No password is set: the harness works through the guest agent. The archive is out of reach.
        (root / "etc" / "machine-id").write_text("")  # each boot makes its own
    boots = sorted((root / "boot").glob("vmlinuz-*"))
    if len(boots) != 1:
        raise BuildError(f"expected one kernel in the full guest's /boot, found {[b.name for b in boots]}")
    release = boots[0].name.removeprefix("vmlinuz-")
    initrd = root / "boot" / f"initrd.img-{release}"
    if not initrd.exists():
        raise BuildError(f"{initrd} is missing: initramfs-tools did not run")
    shutil.copy2(boots[0], out / boots[0].name)
    shutil.copy2(initrd, out / initrd.name)
    with step(f"making the ext4 disk image ({DISK_SIZE}, sparse)"):
        run(["mke2fs", "-q", "-t", "ext4", "-L", "debian-guest", "-d", root, out / "disk.img", DISK_SIZE],
            log_file=out / "logs" / "mke2fs.log")
        shutil.rmtree(root)
