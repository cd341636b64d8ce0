"""An idle backend: the doorbell recheck only for the drivers that ask for it (VRDMA_F_DOORBELL_RECHECK).

A parked engine normally sleeps until a guest's kick wakes it; a driver whose memory fences may be dropped (a TCG
guest) accepts the recheck feature, and for as long as such a driver is connected the parked engine looks at the
doorbells every park_recheck_ms without being woken. A simulated driver here plays either kind.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
from backend_process import GID, BackendProcess, connect_sides, start_side, wait_cqes
from polling import wait_until

from vrdma.device import abi
from vrdma.testing.frontend import FrontendError
from vrdma.testing.simulated_guest import SimVerbs

pytestmark = pytest.mark.backend

RECHECK = 1 << abi.const("VRDMA_F_DOORBELL_RECHECK")
WINDOW = 0.5  # seconds of idle counted: 50 rechecks at park_recheck_ms = 10


def voluntary_switches(pid: int) -> int:
    """The process's voluntary context switches, all its threads (the engine's among them) together."""
    total = 0
    for thread in psutil.Process(pid).threads():
        status = Path(f"/proc/{pid}/task/{thread.id}/status").read_text()
        total += int(next(line.split()[1] for line in status.splitlines()
                          if line.startswith("voluntary_ctxt_switches:")))
    return total


def wakeups(pid: int, seconds: float) -> int:
    """How many times the process's threads went to sleep and were woken over ``seconds``."""
    before = voluntary_switches(pid)
    time.sleep(seconds)  # the window counted, not a wait for readiness
    return voluntary_switches(pid) - before


def test_the_recheck_is_chosen_per_driver(tmp_path: Path) -> None:
    """vm0's driver accepts the recheck and vm1's declines it: the backend says so per VM; parked with only vm1
    connected it sleeps (a handful of wake-ups in half a second, from nothing it was asked), and with vm0 connected it
    wakes every park_recheck_ms."""
    backend = BackendProcess(tmp_path)
    try:
        pid = backend.daemon.process.pid
        with backend.frontend("vm1") as fe1:
            fe1.start()
            verbs1 = SimVerbs(fe1, backend.directory / "vm1.doorbell")
            verbs1.create_cq()  # a queue in its doorbell page: the engine marks the pages queues use as parked
            wait_until("the engine parks", verbs1.parked, timeout=10, interval=0.01)
            counters = backend.admin_ask("counters")["vms"]
            assert counters["vm1"]["doorbell_recheck"] is False
            assert not counters["vm1"]["connection"]["features"] & RECHECK
            quiet = wakeups(pid, WINDOW)
            with backend.frontend("vm0") as fe0:
                fe0.start(device_features=RECHECK)
                verbs0 = SimVerbs(fe0, backend.directory / "vm0.doorbell")
                verbs0.create_cq()
                wait_until("the engine parks", verbs0.parked, timeout=10, interval=0.01)
                counters = backend.admin_ask("counters")["vms"]
                assert counters["vm0"]["doorbell_recheck"] is True and counters["vm1"]["doorbell_recheck"] is False
                assert counters["vm0"]["connection"]["features"] & RECHECK
                rechecking = wakeups(pid, WINDOW)
        assert quiet <= 5, f"{quiet} wake-ups in {WINDOW} s with no driver asking for the recheck"
        assert rechecking >= 20, f"only {rechecking} wake-ups in {WINDOW} s with a driver asking for the recheck"
    finally:
        assert backend.stop() == 0, backend.log_text()


def test_an_arm_that_its_completion_missed_still_gets_its_event(tmp_path: Path) -> None:
    """A guest whose fences are emulated away (TCG drops a one-vCPU guest's barriers) can arm a CQ so late that the
    completion it waited for has already looked at the arm slot, and have polled the ring before that completion
    was there: it sleeps with a completion in its ring. Played here in that order: vm0's receive completes unarmed
    and unpolled, then vm0 arms. The engine's arm sweep (every 100 ms; here at the parked engine's recheck, which
    vm0's driver asked for) finds an arm newer than the last completion over a ring not polled, and raises the event.
    An arm over a ring the consumer emptied raises none."""
    backend = BackendProcess(tmp_path)
    try:
        with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
            a = start_side(fe0, backend, "vm0", GID["vm0"], 64 << 10, device_features=RECHECK)
            b = start_side(fe1, backend, "vm1", GID["vm1"], 64 << 10)
            connect_sides(a, GID["vm0"], b, GID["vm1"])
            a.verbs.post_event_buffers()
            a.verbs.wait_events()  # PORT_ACTIVE
            a.verbs.post_recv(a.qp, [(a.mr.addr, 64, a.mr.lkey)], wr_id=7)
            b.verbs.post_send(b.qp, abi.const("VRDMA_WR_SEND"), [(b.mr.addr, 8, b.mr.lkey)])
            wait_cqes(b.verbs, b.cq, 1)
            wait_until("vm0's receive completion in its ring", lambda: a.verbs.cq_header(a.cq).prod == 1, timeout=10,
                       interval=0.01)
            wait_until("the engine parks", a.verbs.parked, timeout=10, interval=0.01)
            a.verbs.arm_cq(a.cq)
            (event,) = a.verbs.wait_events(timeout=5)
            assert (event.type, event.handle) == (abi.const("VRDMA_EVENT_CQ_COMP"), a.cq.handle)
            assert [cqe.wr_id for cqe in wait_cqes(a.verbs, a.cq, 1)] == [7]
            a.verbs.arm_cq(a.cq)
            with pytest.raises(FrontendError):
                a.verbs.wait_events(timeout=0.5)
    finally:
        assert backend.stop() == 0, backend.log_text()
