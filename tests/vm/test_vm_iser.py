"""iSER over vrdma0 between two guests: the kernel's SCSI target (LIO with ib_isert, set up by targetcli) in vm0
exports a RAM disk, open-iscsi's initiator in vm1 logs in over iser (ib_iser) and fio writes and reads the LUN,
verifying every block. iSER needs the memory-management extensions: the initiator registers every command's pages
with IB_WR_REG_MR and the target moves the data with RDMA READ and WRITE into them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vrdma.harness import fio, iser
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def target(two_guests: Cluster) -> Iterator[iser.Target]:
    with iser.target(two_guests[0], size_mib=64) as exported:
        yield exported


@pytest.mark.parametrize("pattern", [("--rw=randwrite", "--bs=4k", "--iodepth=16", "--size=16M"),
                                     ("--rw=write", "--bs=256k", "--iodepth=4", "--size=48M")],
                         ids=["4 KiB random, depth 16", "256 KiB sequential, depth 4"])
def test_fio_verifies_every_block_written_to_the_remote_lun(two_guests: Cluster, target: iser.Target,
                                                            pattern: tuple[str, ...]) -> None:
    initiator = two_guests[1]
    assert two_guests.backend is not None
    before = {vm: vm_counters(two_guests.backend, vm) for vm in ("vm0", "vm1")}
    with iser.initiator(initiator, target) as device:
        assert iser.session_transport(initiator) == "iser"
        job = fio.job(initiator, device, *pattern, "--verify=crc32c", "--verify_fatal=1", "--do_verify=1")
    size = int(next(arg for arg in pattern if arg.startswith("--size=")).removeprefix("--size=").removesuffix("M"))
    assert job["write"]["io_bytes"] == job["read"]["io_bytes"] == size << 20, job
    after = {vm: vm_counters(two_guests.backend, vm) for vm in ("vm0", "vm1")}
    for vm in ("vm0", "vm1"):
        moved = after[vm]["engine"]["bytes"] - before[vm]["engine"]["bytes"]
        assert moved >= 2 * size << 20, (vm, moved)  # every byte went through the device, both ways
    # Logged out and unloaded, the initiator holds nothing on the device but the RDMA core's shared CQ pool.
    assert {k: v for k, v in after["vm1"]["objects"].items() if k != "cq"} == \
        {k: v for k, v in before["vm1"]["objects"].items() if k != "cq"}
    assert initiator.run(["sh", "-c", "lsmod | grep -c '^ib_iser' || true"]).stdout.strip() == "0"
