"""NVMe over Fabrics over vrdma0 between two guests: the kernel's NVMe target (nvmet-rdma) in vm0 exports a
RAM-backed namespace, the kernel's host (nvme-rdma, connected with nvme-cli) in vm1 writes and reads it with fio
verifying every block. nvme-rdma and nvmet-rdma need the memory-management extensions: every I/O's pages are
registered with IB_WR_REG_MR, and invalidated locally or by the target's SEND_WITH_INV."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from polling import wait_until
from storage_checks import VERIFY, check_host_objects_gone, check_verified_through_the_device, counters

from vrdma.harness import fio, nvmeof
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def target(two_guests: Cluster) -> Iterator[nvmeof.Target]:
    with nvmeof.target(two_guests[0], "rdma", size_mib=64) as exported:
        yield exported


@pytest.mark.parametrize("pattern", [("--rw=randwrite", "--bs=4k", "--iodepth=32", "--size=32M"),
                                     ("--rw=write", "--bs=128k", "--iodepth=8", "--size=64M")],
                         ids=["4 KiB random, depth 32", "128 KiB sequential, depth 8"])
def test_fio_verifies_every_block_written_to_the_remote_namespace(two_guests: Cluster, target: nvmeof.Target,
                                                                   pattern: tuple[str, ...]) -> None:
    host = two_guests[1]
    before = counters(two_guests)
    with nvmeof.host(host, target) as device:
        job = fio.job(host, device, *pattern, *VERIFY)
    after = counters(two_guests)
    check_verified_through_the_device(job, pattern, before, after)
    for vm in ("vm0", "vm1"):
        # No error completion but the host's receives flushed when it disconnected.
        errors = after[vm]["engine"]["error_cqes"] - before[vm]["engine"]["error_cqes"]
        assert errors == after[vm]["engine"]["flushed"] - before[vm]["engine"]["flushed"], after[vm]["engine"]
    # Disconnected and unloaded, the host holds nothing on the device any more but the RDMA core's shared CQ pool.
    check_host_objects_gone(before, after)
    assert host.run(["sh", "-c", "lsmod | grep -c '^nvme_rdma' || true"]).stdout.strip() == "0"


def test_the_target_survives_a_host_that_dies_mid_io(products: Products,
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    """The host guest's QEMU is killed while fio writes to the remote namespace: the backend drops that VM, the
    target's QPs to it fail (no responder: retries run out) and nvmet tears the controller down; the target guest,
    its device and the backend go on, and the target unloads cleanly."""
    with Cluster(2, tmp_path_factory.mktemp("nvmeof-host-dies"), products=products) as cluster:
        target_vm, host_vm = cluster[0], cluster[1]
        assert cluster.backend is not None
        with nvmeof.target(target_vm, "rdma", size_mib=64) as exported:
            host_vm.run(["modprobe", "nvme_rdma"]).check("modprobe nvme_rdma")
            host_vm.run(["nvme", "connect", "-t", "rdma", "-a", target_vm.address, "-s", str(nvmeof.PORT),
                         "-n", exported.nqn]).check("nvme connect")
            host_vm.agent.spawn(["fio", "--name=until-killed", "--filename=/dev/nvme0n1", "--direct=1",
                                 "--ioengine=libaio", "--rw=randwrite", "--bs=4k", "--iodepth=32",
                                 "--time_based", "--runtime=600"])
            wait_until("the target busy with the host's writes",
                       lambda: vm_counters(cluster.backend, "vm0")["engine"]["recv_wqes"] > 2000, 120)
            assert host_vm.process is not None
            host_vm.process.kill()  # the host VM is gone, mid-I/O
            wait_until("nvmet to drop the dead host's controller",
                       lambda: "nvmet: ctrl 1" in target_vm.run(["dmesg"]).stdout
                       and vm_counters(cluster.backend, "vm0")["objects"]["qp"] <= 1, 180)
        # The target unloaded (the context above tore it down); its device and the backend serve on.
        log = target_vm.run(["dmesg"]).check("dmesg").stdout
        assert "WARNING" not in log and "BUG" not in log, log[-3000:]
        target_vm.run(["modprobe", "vrdma_kverbs_test", "messages=8"]).check("the target's device after the host died")
        target_vm.run(["rmmod", "vrdma_kverbs_test"]).check("rmmod vrdma_kverbs_test")
        assert cluster.backend.running
