"""SMB Direct (SMB3 over RDMA) over vrdma0 between two guests: the kernel's SMB server (ksmbd, with ksmbd-tools'
ksmbd.mountd) in vm0 shares a directory, the kernel's SMB client (cifs, mounted with mount.cifs -o rdma) in vm1
writes a file there and reads one back that the server wrote, each checked by its digest on the other side, and the
backend's counters show the data went through the device. Debian builds neither module with SMB Direct: the image
carries both built out of tree from the kernel's own source with it on (buildchain/smb.py, docs/storage.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.vm import Vm

pytestmark = pytest.mark.vm

SHARE = "/srv/share"
MOUNT = "/mnt/smb"
MIB = 8  # each way


def sh(vm: Vm, script: str, timeout: float = 180.0) -> str:
    return vm.run(["sh", "-c", script], timeout=timeout).check(script).stdout


@pytest.fixture(scope="module")
def smb_mount(two_guests: Cluster) -> Iterator[Cluster]:
    server, client = two_guests[0], two_guests[1]
    sh(server, f"modprobe ksmbd && mkdir -p {SHARE} /etc/ksmbd /run/ksmbd && chmod 0777 {SHARE} && "
               f"ksmbd.addshare -a share -o 'path={SHARE}' -o 'read only=no' && "
               "ksmbd.adduser -a tester -p secret && ksmbd.mountd")
    sh(client, f"modprobe cifs && mkdir -p {MOUNT} && mount -t cifs //{server.address}/share {MOUNT} "
               "-o rdma,vers=3.1.1,username=tester,password=secret")
    yield two_guests
    sh(client, f"umount {MOUNT}")
    sh(server, "ksmbd.control --shutdown || true; rmmod ksmbd || true")


def test_the_mount_runs_over_smb_direct(smb_mount: Cluster) -> None:
    debug = sh(smb_mount[1], "cat /proc/fs/cifs/DebugData")
    # transport status 2: SMBD_CONNECTED (the RDMA connection is up), and the session's channel is an RDMA one.
    assert "SMBDirect (in hex) protocol version: 100 transport status: 2" in debug, debug
    assert "Capabilities: rdma" in debug, debug


def test_data_written_and_read_both_ways_through_vrdma(smb_mount: Cluster) -> None:
    server, client = smb_mount[0], smb_mount[1]
    assert smb_mount.backend is not None
    before = {vm: vm_counters(smb_mount.backend, vm)["engine"]["bytes"] for vm in ("vm0", "vm1")}
    written = sh(client, f"dd if=/dev/urandom of={MOUNT}/from-client bs=1M count={MIB} 2>/dev/null && sync && "
                         f"md5sum < {MOUNT}/from-client").split()[0]
    assert sh(server, f"md5sum < {SHARE}/from-client").split()[0] == written
    stored = sh(server, f"dd if=/dev/urandom of={SHARE}/from-server bs=1M count={MIB} 2>/dev/null && sync && "
                        f"md5sum < {SHARE}/from-server").split()[0]
    # Dropping the client's page cache makes the read go to the server.
    assert sh(client, f"echo 3 > /proc/sys/vm/drop_caches && md5sum < {MOUNT}/from-server").split()[0] == stored
    after = {vm: vm_counters(smb_mount.backend, vm)["engine"]["bytes"] for vm in ("vm0", "vm1")}
    # SMB Direct moves large reads and writes with RDMA READ and WRITE, both ways: each VM's memory took part.
    for vm in ("vm0", "vm1"):
        assert after[vm] - before[vm] >= 2 * MIB << 20, (vm, before, after)
