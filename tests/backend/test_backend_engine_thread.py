"""The data engine in threads of its own beside the event loop (engine/thread.c): the control path answers while
data moves, a device takes several commands at once, and control changes racing traffic (a new memory table, objects
made and destroyed) move not one wrong byte, with one engine thread and with two (each VM on its own thread: a WRITE
from one into the other is one thread delivering into the other's device); with two, busy VMs spread over both.
The sanitizer tier runs this module against the ASan build too; the engine's threads under ThreadSanitizer are
`make fuzz`'s engine-threads interface.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from backend_process import GID, BackendProcess, start_side, two_vms
from backend_process import SimSide as Side

from vrdma.device import abi
from vrdma.device.constants import CommandOpcode
from vrdma.testing.frontend import Frontend, FrontendError
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend

GIB, MIB = 1 << 30, 1 << 20
WRITE = abi.const("VRDMA_WR_RDMA_WRITE")
SUCCESS = abi.const("VRDMA_WC_SUCCESS")


def make_side(fe: Frontend, backend: BackendProcess, name: str) -> Side:
    return start_side(fe, backend, name, GID[name], 64 << 10)


@pytest.fixture(params=[1, 2], ids=["one engine thread", "two engine threads"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Side, Side]]:
    backend = BackendProcess(tmp_path, options=["--engine-threads", str(request.param)])
    with two_vms(backend, make_side, GID) as sides:
        yield sides
    assert backend.stop() == 0, backend.log_text()


def query_device() -> bytes:
    return abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": CommandOpcode.QUERY_DEVICE}))


def test_commands_are_answered_while_gigabytes_are_copied(pair: tuple[Side, Side]) -> None:
    """vm1 queues eight 1 GiB WRITEs into vm0; vm0's and vm1's commands (a device query, and a QP query the engine
    answers) are answered while they are copied, not after: the engine's thread moves the data, the event loop
    answers."""
    a, b = pair
    backing_b, backing_a = b.verbs.alloc(16 * 4096), a.verbs.alloc(16 * 4096)
    src = b.verbs.reg_mr_cycled(b.pd, GIB, backing_b)
    dst = a.verbs.reg_mr_cycled(a.pd, GIB, backing_a)
    for i in range(8):
        b.verbs.post_send(b.qp, WRITE, [(src.addr, GIB, src.lkey)], wr_id=i, remote_addr=dst.addr, rkey=dst.rkey,
                          signaled=i == 7)
    answered = 0
    deadline = time.monotonic() + 120
    while not (done := b.verbs.poll_cq(b.cq)):
        assert time.monotonic() < deadline, "8 GiB of WRITEs did not complete within 120 s"
        if answered < 50:  # (each command takes guest memory of the simulated frontend for good)
            a.verbs.fe.command(query_device(), abi.sizeof("vrdma_resp_query_device"))
            assert b.verbs.query_qp(b.qp).qp_state == abi.const("VRDMA_QPS_RTS")  # the engine's QP state
            answered += 1
        else:
            time.sleep(0.01)  # polling for the completion
    assert [(c.wr_id, c.status) for c in done] == [(7, SUCCESS)]
    assert answered >= 3, f"only {answered} rounds of commands answered while 8 GiB were copied"


def test_two_commands_of_one_device_in_flight_at_once_are_both_answered(pair: tuple[Side, Side]) -> None:
    """Two control chains posted with one kick: the device answers both, each in its own chain."""
    a, _ = pair
    fe = a.verbs.fe
    vq = fe.queues[abi.const("VRDMA_QUEUE_CONTROL")]
    port = abi.to_bytes(abi.new("vrdma_cmd_query_port", hdr={"opcode": CommandOpcode.QUERY_PORT, "seq": 2},
                                port=1))
    device = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": CommandOpcode.QUERY_DEVICE, "seq": 1}))
    first, first_in = vq.add([device], [abi.sizeof("vrdma_resp_query_device")])
    second, second_in = vq.add([port], [abi.sizeof("vrdma_resp_query_port")])
    vq.notify()
    used: dict[int, int] = {}
    deadline = time.monotonic() + 10
    while len(used) < 2 and time.monotonic() < deadline:
        used.update(vq.wait_used(10))
    assert set(used) == {first, second}
    answers = {head: abi.from_bytes("vrdma_resp_hdr", fe.memory.read(gpas[0], abi.sizeof("vrdma_resp_hdr")))
               for head, gpas in ((first, first_in), (second, second_in))}
    assert (answers[first].opcode, answers[first].seq, answers[first].status) == (CommandOpcode.QUERY_DEVICE, 1, 0)
    assert (answers[second].opcode, answers[second].seq, answers[second].status) == (CommandOpcode.QUERY_PORT, 2, 0)


def test_an_event_a_command_posts_reaches_the_guest_while_the_threads_are_parked(pair: tuple[Side, Side]) -> None:
    """An event posted by the event loop's own call into the engine (a QP of an SRQ moved to the error state by
    MODIFY_QP: its last WQE reached) is told by the next pass of the device's thread, which the command's kick wakes:
    the threads tell of every posted event, not only of those they posted themselves (thread.c's tell_events)."""
    a, _ = pair
    srq = a.verbs.create_srq(a.pd)
    qp = a.verbs.create_qp(a.pd, a.cq, a.cq, srq=srq)
    a.verbs.post_event_buffers()
    deadline = time.monotonic() + 10
    while not a.verbs.parked():  # nothing to do: the device's thread parks
        assert time.monotonic() < deadline, "the engine never parked"
        time.sleep(0.001)
    a.verbs.modify_qp(qp, abi.const("VRDMA_QP_STATE"), qp_state=abi.const("VRDMA_QPS_ERR"))
    last_wqe = abi.const("VRDMA_EVENT_QP_LAST_WQE")
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 10
    while (last_wqe, qp.handle) not in seen:
        try:
            events = a.verbs.wait_events(timeout=max(deadline - time.monotonic(), 0.001))
        except FrontendError:
            pytest.fail(f"no QP_LAST_WQE event for QP {qp.handle} within 10 s; events (type, handle): {seen}")
        seen += [(int(event.type), int(event.handle)) for event in events]


def test_memory_tables_and_destroys_racing_traffic_move_no_wrong_byte(pair: tuple[Side, Side]) -> None:
    """vm1 keeps 512 KiB WRITEs of distinct patterns flowing into vm0 while vm0's memory table is sent again and
    again (libvhost-user maps it anew: every host address the engine holds changes) and MRs and CQs are made and
    destroyed on both: every WRITE completes and every byte in vm0 is the one written."""
    a, b = pair
    chunks, size = 12, 512 << 10
    src = b.verbs.reg_mr(b.pd, chunks * size)
    dst = a.verbs.reg_mr(a.pd, chunks * size)
    patterns = [hashlib.sha256(bytes([i])).digest() * (size // 32) for i in range(chunks)]
    for i, pattern in enumerate(patterns):
        b.verbs.memory.write(src.addr + i * size, pattern)
    region = protocol.MEMORY_HEADER.pack(1, 0) + a.verbs.fe.memory.region()
    posted = completed = 0

    def reap(at_least: int) -> None:
        nonlocal completed
        deadline = time.monotonic() + 10
        while completed < at_least:
            for cqe in b.verbs.poll_cq(b.cq):
                assert cqe.status == SUCCESS, cqe
                completed += 1
            assert time.monotonic() < deadline, f"{completed} of {at_least} WRITEs completed"

    for _ in range(24):
        for i in range(chunks):
            b.verbs.post_send(b.qp, WRITE, [(src.addr + i * size, size, src.lkey)], wr_id=posted,
                              remote_addr=dst.addr + i * size, rkey=dst.rkey)
            posted += 1
        a.verbs.fe.acked(Request.SET_MEM_TABLE, region, fds=[a.verbs.fe.memory.fd])  # mapped anew
        extra = a.verbs.reg_mr(a.pd, 64 * 4096)
        cq = b.verbs.create_cq(16)
        a.verbs.call("VRDMA_CMD_DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=extra.handle)
        b.verbs.call("VRDMA_CMD_DESTROY_CQ", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=cq.handle)
        reap(posted - chunks)  # the round before this one: this one's WRITEs may still be moving meanwhile
    reap(posted)
    for i, pattern in enumerate(patterns):
        assert a.verbs.memory.read(dst.addr + i * size, size) == pattern, f"chunk {i} holds other bytes"


def test_two_engine_threads_run_two_busy_vms_one_each(tmp_path: Path) -> None:
    """Two pairs, vm0 -> vm1 and vm2 -> vm3, each flooding 1 MiB WRITEs, with two engine threads: the VMs are given
    out in turn (vm0 and vm2 to one thread), and the other thread, with nothing to do, takes one of the two busy
    senders, and each receiver follows its sender's thread; every WRITE completes and both threads moved data."""
    backend = BackendProcess(tmp_path, names=("vm0", "vm1", "vm2", "vm3"), options=["--engine-threads", "2"])
    try:
        with (backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1, backend.frontend("vm2") as fe2,
              backend.frontend("vm3") as fe3):
            sides = [start_side(fe, backend, f"vm{i}", GID[f"vm{i}"], 4 * MIB) for i, fe in enumerate((fe0, fe1, fe2,
                                                                                                       fe3))]
            for sender, receiver in ((0, 1), (2, 3)):
                a, b = sides[sender], sides[receiver]
                a.verbs.connect(a.qp, b.qp.qpn, GID[f"vm{receiver}"])
                b.verbs.connect(b.qp, a.qp.qpn, GID[f"vm{sender}"])
            threads = {name: vm["engine_thread"] for name, vm in backend.admin_ask("counters")["vms"].items()}
            assert threads == {"vm0": 0, "vm1": 1, "vm2": 0, "vm3": 1}, threads
            rounds, depth = 16, 32
            for _ in range(rounds):
                for sender, receiver in ((0, 1), (2, 3)):
                    a, b = sides[sender], sides[receiver]
                    for i in range(depth):
                        a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, MIB, a.mr.lkey)], wr_id=i,
                                          remote_addr=b.mr.addr + (i % 4) * MIB, rkey=b.mr.rkey,
                                          signaled=i == depth - 1)
                for sender in (0, 2):
                    a = sides[sender]
                    done = a.verbs.poll_cq(a.cq)
                    deadline = time.monotonic() + 60
                    while not done:
                        assert time.monotonic() < deadline, f"vm{sender}'s {depth} WRITEs did not complete"
                        time.sleep(0.001)  # the engine runs in the backend process: poll what it wrote
                        done = a.verbs.poll_cq(a.cq)
                    assert [(c.wr_id, c.status) for c in done] == [(depth - 1, SUCCESS)]
            counters = backend.admin_ask("counters")
        threads = {name: vm["engine_thread"] for name, vm in counters["vms"].items()}
        assert threads["vm0"] != threads["vm2"], f"both busy senders on one thread: {threads}"
        # Each receiver followed its sender to its thread (req.c's follow), so no lock crosses between them.
        assert (threads["vm1"], threads["vm3"]) == (threads["vm0"], threads["vm2"]), threads
        assert sum(t["devices_taken"] for t in counters["engine_threads"]) >= 1, counters["engine_threads"]
        assert all(t["work"] > 0 for t in counters["engine_threads"]), counters["engine_threads"]
    finally:
        assert backend.stop() == 0, backend.log_text()
