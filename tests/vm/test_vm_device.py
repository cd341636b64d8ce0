"""A guest with the vrdma device: PCI identity, config space read from the guest, and backend restarts."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from vrdma.device import abi
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm

# Run in the guest: a minimal user-space virtio-pci driver for the 1af4:106a device. It maps the BAR that holds
# the virtio structures (after unbinding virtio_pci, which claims the BARs: the Debian kernel's IO_STRICT_DEVMEM
# then refuses user mappings) and either prints the device config space as hex ("config"), read with 32-bit
# loads as a driver does, or negotiates VIRTIO_F_VERSION_1 and sets DRIVER_OK ("negotiate").
GUEST_DRIVER = r"""
import ctypes, glob, mmap, os, struct, sys
mode, size = sys.argv[1], int(sys.argv[2])
for dev in glob.glob("/sys/bus/pci/devices/*"):
    if [open(f"{dev}/{f}").read().strip() for f in ("vendor", "device")] == ["0x1af4", "0x106a"]:
        break
else:
    sys.exit("no 1af4:106a device")
cfg = open(f"{dev}/config", "rb").read()
caps, ptr = {}, cfg[0x34]
while ptr:
    if cfg[ptr] == 0x09:  # virtio vendor capability: cfg_type, bar, offset, length
        caps[cfg[ptr + 3]] = (cfg[ptr + 4], *struct.unpack_from("<II", cfg, ptr + 8))
    ptr = cfg[ptr + 1]
if os.path.exists(f"{dev}/driver"):
    open(f"{dev}/driver/unbind", "w").write(os.path.basename(dev))
if open(f"{dev}/enable").read().strip() != "1":
    open(f"{dev}/enable", "w").write("1")
regions = {}
def region(bar):
    if bar not in regions:
        fd = os.open(f"{dev}/resource{bar}", os.O_RDWR | os.O_SYNC)
        regions[bar] = mmap.mmap(fd, os.fstat(fd).st_size)
    return regions[bar]
def reg(cap, offset, ctype):
    bar, base, _ = caps[cap]
    return ctype.from_buffer(region(bar), base + offset)
if mode == "config":
    bar, base, length = caps[4]  # VIRTIO_PCI_CAP_DEVICE_CFG
    words = [reg(4, i, ctypes.c_uint32).value for i in range(0, min(size, length), 4)]
    print(struct.pack(f"<{len(words)}I", *words).hex())
elif mode == "negotiate":
    status = reg(1, 0x14, ctypes.c_uint8)  # VIRTIO_PCI_CAP_COMMON_CFG: device_status
    status.value = 0
    status.value = 1 | 2  # ACKNOWLEDGE | DRIVER
    reg(1, 0x00, ctypes.c_uint32).value = 1  # device_feature_select: bits 32..63
    offered = reg(1, 0x04, ctypes.c_uint32).value
    reg(1, 0x08, ctypes.c_uint32).value = 1  # driver_feature_select
    reg(1, 0x0C, ctypes.c_uint32).value = offered & 1  # VIRTIO_F_VERSION_1 only
    status.value = 1 | 2 | 8  # FEATURES_OK
    if not status.value & 8:
        sys.exit(f"device refused the features (status {status.value:#x})")
    status.value = 1 | 2 | 8 | 4  # DRIVER_OK
    print(f"status {status.value:#x}")
"""


@pytest.fixture(scope="module")
def guest(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(1, tmp_path_factory.mktemp("device"), products=products) as cluster:
        yield cluster


def connection(cluster: Cluster) -> dict[str, Any]:
    """vm0's connection counters in the running backend (docs/backend.md)."""
    assert cluster.backend is not None
    return vm_counters(cluster.backend, "vm0")["connection"]  # type: ignore[no-any-return]


def wait_for_connection(cluster: Cluster, holds: Callable[[dict[str, Any]], bool], what: str,
                        timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not holds(counters := connection(cluster)):
        assert time.monotonic() < deadline, f"vm0: {what} did not happen within {timeout} s: {counters}"
        time.sleep(0.05)
    return counters


def read_config(cluster: Cluster) -> object:
    size = abi.sizeof("vrdma_config")
    result = cluster[0].run(["python3", "-c", GUEST_DRIVER, "config", str(size)]).check("reading config space")
    return abi.from_bytes("vrdma_config", bytes.fromhex(result.stdout.strip()))


def test_guest_driver_binds_pairs_and_queries_the_device(guest: Cluster) -> None:
    """vrdma.ko (loaded at boot) bound the device, found its doorbell region and ran QUERY_DEVICE/QUERY_PORT."""
    dmesg = guest[0].run(["dmesg"]).check("dmesg").stdout
    assert "vrdma virtio" in dmesg and "doorbell region: " in dmesg, dmesg
    limits = DEFAULT_LIMITS
    assert f"vrdma device: max_qp {limits.max_qp} max_cq {limits.max_cq} max_mr {limits.max_mr} max_pd " \
           f"{limits.max_pd}, port state 4, MAC {guest[0].identity.mac}" in dmesg, dmesg
    bound = guest[0].run(["ls", "/sys/bus/virtio/drivers/vrdma/"]).check("vrdma driver in sysfs").stdout.split()
    assert any(name.startswith("virtio") for name in bound), bound
    assert "control" in connection(guest)["queues_started"]


def test_guest_sees_the_device_and_its_doorbell_region(guest: Cluster) -> None:
    lspci = guest[0].run(["lspci", "-n"]).check("lspci").stdout
    # One device (vhost-user-rdma-pci): no ivshmem device beside it; the doorbell region is its BAR 2.
    assert "1af4:106a" in lspci and "1af4:1110" not in lspci, lspci
    ids = guest[0].sh("cat /sys/bus/virtio/devices/*/device").check("virtio device ids").stdout.split()
    assert "0x002a" in ids
    assert connection(guest)["protocol_features"]
    # The patched PCI proxy gives one MSI-X vector per queue plus one for config changes (stock: 1).
    verbose = guest[0].run(["lspci", "-vv", "-d", "1af4:106a"]).check("lspci -vv").stdout
    assert "MSI-X: Enable" in verbose and f"Count={abi.const('VRDMA_NUM_QUEUES') + 1}" in verbose, verbose
    assert re.search(r"Region 2: Memory at \w+ \(64-bit, prefetchable\) \[size=4M\]", verbose), verbose
    assert connection(guest)["shared_memory_maps"] == 1


def test_guest_reads_the_config_space(guest: Cluster) -> None:
    config = read_config(guest)
    assert config.abi_version == abi.const("VRDMA_ABI_VERSION")  # type: ignore[attr-defined]
    assert bytes(config.mac) == bytes.fromhex(guest[0].identity.mac.replace(":", ""))  # type: ignore[attr-defined]
    assert connection(guest)["config_reads"] >= 1
    doorbell = Path(guest.directory / "backend" / "vm0.doorbell").read_bytes()
    header = abi.from_bytes("vrdma_doorbell_header", doorbell[:abi.sizeof("vrdma_doorbell_header")])
    assert header.pairing_id == config.pairing_id  # type: ignore[attr-defined]


def test_guest_negotiates_features(guest: Cluster) -> None:
    result = guest[0].run(["python3", "-c", GUEST_DRIVER, "negotiate", "0"]).check("feature negotiation")
    assert result.stdout.strip() == "status 0xf"
    features = wait_for_connection(guest, lambda c: c["features"] is not None, "feature negotiation")["features"]
    assert features & (1 << 32)  # VIRTIO_F_VERSION_1, as the guest wrote it (QEMU adds PROTOCOL_FEATURES)


def test_backend_killed_and_restarted_serves_the_guest_again(guest: Cluster) -> None:
    assert guest.backend is not None
    before = read_config(guest)
    guest.backend.kill()
    assert guest[0].run(["true"]).exit_status == 0  # the guest keeps running without its backend
    guest.backend.start()
    # QEMU reconnects by itself: the new backend's first connection of vm0.
    wait_for_connection(guest, lambda c: c["accepted"] == 1 and c["state"] == "connected", "QEMU's reconnection")
    after = read_config(guest)
    assert after.pairing_id == before.pairing_id  # type: ignore[attr-defined]
    assert guest[0].run(["cat", "/proc/uptime"]).exit_status == 0
    assert guest[0].running
