"""VMs come and go on a running backend (docs/operating.md): a guest added with `vm-add` boots and uses its device
(the generic vhost-user device of older QEMUs beside the others' vhost-user-rdma-pci),
and another guest's device is removed while its QEMU is still connected, both while a third guest runs
ibv_rc_pingpong with every byte checked; the third sees no error, no device event, no reset."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.verbs import PingPongResult
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm
log = logging.getLogger(__name__)

DEVICE = "vrdma0"
RUN_ITERATIONS = 300  # one ibv_rc_pingpong run of the third guest: a few seconds under TCG


@pytest.fixture(scope="module")
def guests(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(2, tmp_path_factory.mktemp("runtime-vms"), products=products) as cluster:
        yield cluster


def wait_for(condition: object, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.05)  # polling the backend's counters, which another process changes


def test_a_vm_added_and_another_removed_while_a_third_runs_rc_pingpong(guests: Cluster) -> None:
    backend = guests.backend
    assert backend is not None
    third, removed = guests["vm0"], guests["vm1"]
    gid = verbs.ipv4_gid_index(third, DEVICE)
    before = vm_counters(backend, "vm0")
    runs: list[PingPongResult] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def keep_pinging() -> None:
        """Back-to-back ibv_rc_pingpong runs in the third guest (both ends in it, -c: every byte checked) until
        told to stop; the first failure ends it."""
        try:
            while not stop.is_set():
                runs.append(verbs.rc_pingpong(third, third, DEVICE, gid, iterations=RUN_ITERATIONS, extra=("-c",)))
        except BaseException as err:  # reported by the test's thread
            errors.append(err)

    def run_under_way() -> bool:
        assert not errors, errors
        return bool(vm_counters(backend, "vm0")["objects"]["qp"] >= 2)

    pinger = threading.Thread(target=keep_pinging, name="pinger")
    pinger.start()
    try:
        wait_for(run_under_way, "a pingpong run in vm0")
        # The added guest has the device as a QEMU without vhost-user-rdma-pci gives it (generic device and
        # ivshmem): the backend serves both at once.
        added = guests.add(2, device="generic")
        info = added.run(["ibv_devinfo", "-d", DEVICE])
        assert info.exit_status == 0 and "PORT_ACTIVE" in info.stdout, info
        own = verbs.rc_pingpong(added, added, DEVICE, verbs.ipv4_gid_index(added, DEVICE), iterations=50,
                                extra=("-c",))
        assert own.iterations == 50
        wait_for(run_under_way, "a pingpong run in vm0")
        runs_at_removal = len(runs)
        guests.remove("vm1", shut_down_first=False)
        # The run under way at the removal and one started after it complete, every byte checked.
        wait_for(lambda: len(runs) >= runs_at_removal + 2 or errors, "two more pingpong runs in vm0")
    finally:
        stop.set()
        pinger.join()
    assert not errors, errors
    assert all(run.iterations == RUN_ITERATIONS for run in runs)
    after = vm_counters(backend, "vm0")
    for counter in ("closed", "device_resets", "protocol_errors", "memory_faults"):
        assert after["connection"][counter] == before["connection"][counter], (counter, after["connection"])
    for counter in ("error_cqes", "qp_fatal", "events_dropped"):
        assert after["engine"][counter] == before["engine"][counter], (counter, after["engine"])
    dmesg = third.run(["dmesg"]).stdout
    assert "device lost" not in dmesg, dmesg[-3000:]
    served = {vm["name"] for vm in backend_vms(guests)}
    assert served == {"vm0", "vm2"}, served
    log.info("vm0: %d pingpong runs of %d iterations across vm2's arrival and vm1's removal", len(runs),
             RUN_ITERATIONS)
    assert removed.process is None, "the removed guest was not stopped"


def backend_vms(guests: Cluster) -> list[dict[str, object]]:
    from vrdma.harness.daemon import admin

    assert guests.backend is not None
    reply = admin(guests.backend, {"command": "vm-list"})
    assert reply["ok"], reply
    return reply["vms"]  # type: ignore[return-value]
