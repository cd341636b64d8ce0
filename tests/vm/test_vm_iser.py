"""iSER over vrdma0 between two guests: the kernel's SCSI target (LIO with ib_isert, set up by targetcli) in vm0
exports a RAM disk, open-iscsi's initiator in vm1 logs in over iser (ib_iser) and fio writes and reads the LUN,
verifying every block. iSER needs the memory-management extensions: the initiator registers every command's pages
with IB_WR_REG_MR and the target moves the data with RDMA READ and WRITE into them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from storage_checks import VERIFY, check_host_objects_gone, check_verified_through_the_device, counters

from vrdma.harness import fio, iser
from vrdma.harness.cluster import Cluster

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
    before = counters(two_guests)
    with iser.initiator(initiator, target) as device:
        assert iser.session_transport(initiator) == "iser"
        job = fio.job(initiator, device, *pattern, *VERIFY)
    after = counters(two_guests)
    check_verified_through_the_device(job, pattern, before, after)
    # Logged out and unloaded, the initiator holds nothing on the device but the RDMA core's shared CQ pool.
    check_host_objects_gone(before, after)
    assert initiator.run(["sh", "-c", "lsmod | grep -c '^ib_iser' || true"]).stdout.strip() == "0"
