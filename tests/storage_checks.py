"""What the storage protocols' VM tests check alike: fio verified every block it wrote to the remote device, every
byte went through vrdma in both guests, and the host side holds nothing on the device after it disconnected but the
RDMA core's shared CQ pool (ib_cq_pool_get: its CQs stay with the device for the next kernel user)."""

from __future__ import annotations

from typing import Any

from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters

VERIFY = ("--verify=crc32c", "--verify_fatal=1", "--do_verify=1")  # fio: checksum every block, read it all back
GUESTS = ("vm0", "vm1")


def counters(cluster: Cluster) -> dict[str, Any]:
    """Both guests' device counters and objects, as the backend has them now."""
    assert cluster.backend is not None
    return {vm: vm_counters(cluster.backend, vm) for vm in GUESTS}


def check_verified_through_the_device(job: dict[str, Any], pattern: tuple[str, ...], before: dict[str, Any],
                                      after: dict[str, Any]) -> None:
    """fio's job wrote and read back its whole --size, and both devices moved every byte of it both ways."""
    size = int(next(arg for arg in pattern if arg.startswith("--size=")).removeprefix("--size=").removesuffix("M"))
    assert job["write"]["io_bytes"] == job["read"]["io_bytes"] == size << 20, job
    for vm in GUESTS:
        moved = after[vm]["engine"]["bytes"] - before[vm]["engine"]["bytes"]
        assert moved >= 2 * size << 20, (vm, moved)


def check_host_objects_gone(before: dict[str, Any], after: dict[str, Any], vm: str = "vm1") -> None:
    assert {k: v for k, v in after[vm]["objects"].items() if k != "cq"} == \
        {k: v for k, v in before[vm]["objects"].items() if k != "cq"}
