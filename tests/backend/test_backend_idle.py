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
from backend_process import BackendProcess
from polling import wait_until

from vrdma.device import abi
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
