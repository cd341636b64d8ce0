"""Scale in one guest, as MPI and UCX jobs use a device (a QP per peer): one process creates, connects and destroys
10,000 RC QPs with traffic on every one, and a process that creates QPs until the device's limit gets ENOMEM there
(not EIO), with every QP it made given back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vrdma.device.params import DEFAULT_LIMITS
from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm

QP_SCALE = (Path(verbs.__file__).parent / "guest" / "qp_scale.py").read_text()
MANY = 10_000


# 32,767 QPs pin three ring pages each and cost the guest kernel and pyverbs a few KiB more: about 0.7 GiB, next
# to the guest's RAM disk. The default 1 GiB guest runs out of memory before the device runs out of QPs.
GUEST_MEMORY_MIB = 2048


@pytest.fixture(scope="module")
def guest(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(1, tmp_path_factory.mktemp("scale"), products=products, memory_mib=GUEST_MEMORY_MIB) as cluster:
        yield cluster


def qp_scale(guest: Cluster, *args: str, timeout: float = 900) -> dict[str, Any]:
    result = guest[0].run(["python3", "-c", QP_SCALE, *args], timeout=timeout).check("qp_scale " + " ".join(args))
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_one_process_creates_connects_and_destroys_ten_thousand_rc_qps(guest: Cluster) -> None:
    assert guest.backend is not None
    before = vm_counters(guest.backend, "vm0")
    index = verbs.ipv4_gid_index(guest[0], "vrdma0")
    result = qp_scale(guest, "connect", "vrdma0", str(index), str(MANY))
    assert result["distinct_qpn"] == MANY and result["completions"] == 2 * MANY, result
    assert result["failed"] == [] and result["wrong_data"] == [], result
    after = vm_counters(guest.backend, "vm0")
    # Twenty thousand queues needed about twenty doorbell pages; the process took them and gave them all back.
    assert after["objects"] == before["objects"] and after["doorbell_pages"] == before["doorbell_pages"] == []
    assert after["by_opcode"]["CREATE_QP"] - before["by_opcode"]["CREATE_QP"] == MANY
    assert after["engine"]["error_cqes"] == before["engine"]["error_cqes"]
    print(f"{MANY} RC QPs: created and moved to INIT in {result['create_s']:.1f} s, connected in "
          f"{result['connect_s']:.1f} s, traffic in {result['traffic_s']:.1f} s, destroyed in "
          f"{result['destroy_s']:.1f} s")


def test_creating_qps_until_the_device_limit_ends_in_enomem(guest: Cluster) -> None:
    assert guest.backend is not None
    before = vm_counters(guest.backend, "vm0")
    result = qp_scale(guest, "exhaust", "vrdma0")
    # Every QP the device has room for (the kernel's QP1 holds one), then ENOMEM: the device's limit, not a
    # doorbell page or an I/O error.
    assert result == {**result, "errno": "ENOMEM", "created": DEFAULT_LIMITS.max_qp - before["objects"]["qp"]}
    after = vm_counters(guest.backend, "vm0")
    assert after["objects"] == before["objects"] and after["doorbell_pages"] == []
    print(f"{result['created']} RC QPs created in {result['create_s']:.1f} s, then ENOMEM")


@pytest.fixture(scope="module")
def two_vcpus(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A guest of two vCPUs: commands of processes on both are made at the same moment (with one vCPU a command
    polling for its answer keeps the others from being made until it sleeps)."""
    with Cluster(1, tmp_path_factory.mktemp("smp"), products=products, cpus=2) as cluster:
        yield cluster


def test_processes_creating_qps_at_once_have_commands_in_flight_together(two_vcpus: Cluster) -> None:
    """Four processes on two vCPUs create and destroy 200 QPs each at the same time: every QP is made and given back,
    and the device found several of their commands waiting at once (vrdma.ko no longer runs one command at a
    time)."""
    guest = two_vcpus
    assert guest.backend is not None
    before = vm_counters(guest.backend, "vm0")
    result = guest[0].run(["/bin/sh", "-c", 'for i in 1 2 3 4; do python3 -c "$QP_SCALE" rate vrdma0 200 '
                           '> /tmp/qp_rate.$i & done; wait; cat /tmp/qp_rate.1 /tmp/qp_rate.2 /tmp/qp_rate.3 '
                           '/tmp/qp_rate.4'], env=[f"QP_SCALE={QP_SCALE}"], timeout=900).check("4 x qp_scale rate")
    runs = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert len(runs) == 4 and all(run["qps"] == 200 for run in runs), runs
    after = vm_counters(guest.backend, "vm0")
    assert after["objects"] == before["objects"]
    assert after["by_opcode"]["CREATE_QP"] - before["by_opcode"]["CREATE_QP"] == 800
    assert after["commands_at_once_max"] >= 2, after["commands_at_once_max"]
