"""A backend upgrade with live QPs (issue 28): `vrdma admin upgrade` starts a new backend process, which takes every
VM over (their sockets, guest memory, eventfds, doorbell regions and device states: vrdma.daemon.upgrade) while the
old one exits. The simulated frontends, playing QEMU, notice nothing: the same connections, the same QPs, keys and
handles, the WRITEs in flight complete, and new ones go both ways."""

from __future__ import annotations

import os
import threading
from typing import Any

import psutil
import pytest
from backend_process import BackendProcess, connect_sides, start_side, wait_cqes
from polling import wait_until

from vrdma.device import abi
from vrdma.testing.frontend import Frontend

pytestmark = pytest.mark.backend

GIDS = {"vm0": bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]), "vm1": bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])}
WRITE = abi.const("VRDMA_WR_RDMA_WRITE")
SUCCESS = abi.const("VRDMA_WC_SUCCESS")
MR_SIZE = 1 << 20
WRITES = 32
PIECE = MR_SIZE // WRITES


def test_an_upgrade_hands_two_vms_with_writes_in_flight_to_a_new_process(backend: BackendProcess) -> None:
    """vm0 keeps rounds of WRITEs flowing into vm1 (each round's bytes checked) from before the upgrade until two
    rounds after it, across the hand-over: every WRITE completes with its bytes, in one process or the other."""
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        a, b = start_side(fe0, backend, "vm0", GIDS["vm0"], MR_SIZE), start_side(fe1, backend, "vm1", GIDS["vm1"],
                                                                              MR_SIZE)
        connect_sides(a, GIDS["vm0"], b, GIDS["vm1"])
        q = a.verbs.query_qp(a.qp)
        qp_before = (q.qp_state, q.dest_qp_num)
        before = {name: backend.counters(name) for name in ("vm0", "vm1")}
        old = backend.daemon.process
        assert old is not None
        upgraded: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: upgraded.update(backend.upgrade()))
        worker.start()
        posted, after_it = 0, 0
        pattern = b""
        while worker.is_alive() or after_it < 2:  # through the hand-over, and two rounds after it
            pattern = os.urandom(MR_SIZE)
            fe0.memory.write(a.mr.addr, pattern)
            for i in range(WRITES):
                a.verbs.post_send(a.qp, WRITE, [(a.mr.addr + i * PIECE, PIECE, a.mr.lkey)], wr_id=posted + i,
                                  signaled=True, remote_addr=b.mr.addr + i * PIECE, rkey=b.mr.rkey, ring=False)
            a.verbs.ring_send(a.qp)
            completions = wait_cqes(a.verbs, a.cq, WRITES)
            assert sorted(c.wr_id for c in completions) == list(range(posted, posted + WRITES))
            assert all(c.status == SUCCESS for c in completions), completions
            assert fe1.memory.read(b.mr.addr, MR_SIZE) == pattern
            posted += WRITES
            after_it = after_it + 1 if not worker.is_alive() else 0
        worker.join()
        status = upgraded
        assert status["pid"] != old.pid and status["serving"] == ["vm0", "vm1"], status
        assert status["upgrade"]["state"] == "took over" and status["upgrade"]["from_pid"] == old.pid, status
        assert status["upgrade"]["pause_ms"] is not None
        assert posted > 4 * WRITES, f"only {posted} WRITEs ran while the upgrade did"
        with pytest.raises(psutil.NoSuchProcess):
            old.status()  # (reaped by the harness: it exited)
        q = a.verbs.query_qp(a.qp)
        assert (q.qp_state, q.dest_qp_num) == qp_before
        # vm1 WRITEs into vm0 through the new process: the same QPs, keys and route.
        fe1.memory.write(b.mr.addr, pattern[::-1])
        b.verbs.post_send(b.qp, WRITE, [(b.mr.addr, MR_SIZE, b.mr.lkey)], wr_id=99, signaled=True,
                          remote_addr=a.mr.addr, rkey=a.mr.rkey)
        assert [c.status for c in wait_cqes(b.verbs, b.cq, 1)] == [SUCCESS]
        assert fe0.memory.read(a.mr.addr, MR_SIZE) == pattern[::-1]
        mr2 = a.verbs.reg_mr(a.pd, 4096)  # new keys and handles, none repeating one of before
        assert mr2.lkey != a.mr.lkey
        for name in ("vm0", "vm1"):
            after = backend.counters(name)
            assert after["commands"] >= before[name]["commands"]
            assert {k: after["connection"][k] for k in ("accepted", "closed", "device_resets", "protocol_errors")} \
                == {k: before[name]["connection"][k] for k in ("accepted", "closed", "device_resets",
                                                                 "protocol_errors")}, after["connection"]
            assert after["objects"]["qp"] == before[name]["objects"]["qp"]
    assert "took over 2 VM(s)" in backend.log_text()


def test_an_upgrade_is_refused_while_a_vm_migrates_and_a_failed_one_leaves_the_backend_serving(
        backend: BackendProcess) -> None:
    """Refused while a second QEMU of a VM is connected (a migration within the backend); a new process that dies
    before taking over leaves the old one serving, its QPs running."""
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        a, b = start_side(fe0, backend, "vm0", GIDS["vm0"], 4096), start_side(fe1, backend, "vm1", GIDS["vm1"], 4096)
        connect_sides(a, GIDS["vm0"], b, GIDS["vm1"])
        with Frontend(str(backend.sockets["vm0"]), memory_size=4096) as dest:
            dest.negotiate()
            reply = backend.admin_ask("upgrade")
            assert not reply["ok"] and "vm0 is migrating" in reply["error"], reply
        wait_until("the destination's device dropped", lambda: not backend.connection("vm0")["incoming"], 10)
        old_pid = backend.admin_ask("status")["pid"]
        reply = backend.admin_ask("upgrade")
        assert reply["ok"], reply
        psutil.Process(reply["pid"]).kill()  # before it is ready: as a new program that cannot start
        wait_until("the failed upgrade reported",
                   lambda: (backend.admin_ask("status").get("upgrade") or {}).get("state") == "failed", 30)
        status = backend.admin_ask("status")
        assert status["pid"] == old_pid and "ended before taking over" in status["upgrade"]["error"], status
        fe0.memory.write(a.mr.addr, b"U" * 4096)
        a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 4096, a.mr.lkey)], wr_id=1, signaled=True,
                          remote_addr=b.mr.addr, rkey=b.mr.rkey)
        assert [c.status for c in wait_cqes(a.verbs, a.cq, 1)] == [SUCCESS]
        assert fe1.memory.read(b.mr.addr, 4096) == b"U" * 4096
