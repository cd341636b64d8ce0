"""RC over RoCE v2 in process: two hosts' engines joined by a wire the test controls (vrdma.testing.inprocess).

Every packet between the two goes through the engine's one input (Engine.roce_input) into its requester and
responder and comes back out of its transmit ring, with no sockets, namespaces or processes; the clock moves only
when the test moves it. So a loss, a duplicate, a reordering or a packet held back until others pass is placed
exactly, and each test runs in milliseconds on any machine. What is checked: the data (sentinel-filled buffers,
so "never written" cannot pass), the completions, the packets on the wire and the counters.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vrdma.device.constants import WcOpcode, WcStatus, WrOpcode
from vrdma.device.qp_states import QpState
from vrdma.testing.inprocess import Link, LocalHost, LoseOnce, Packet, Side, Wire, build, connect, two_hosts

pytestmark = pytest.mark.backend  # the C engine (`make backend`)

MTU = 1024  # path_mtu 3
DATA = 0x1000  # where in each MR the data goes
LOCAL = 0x80000  # where a READ lands in the requester's MR


def pattern(size: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(size))


@pytest.fixture
def pair() -> Iterator[tuple[LocalHost, Side, LocalHost, Side]]:
    with two_hosts() as hosts:
        yield hosts


def post(side: Side, opcode: WrOpcode, size: int = 0, wr_id: int = 1, offset: int = DATA, **kw: int) -> None:
    sges = [(side.mr.addr + offset, size, side.mr.lkey)] if size else []
    side.verbs.post_send(side.qp, opcode, sges, wr_id=wr_id, **kw)


def post_read(a: Side, b: Side, size: int, wr_id: int = 2, local: int = LOCAL) -> None:
    a.verbs.memory.write(a.mr.addr + local, b"\xa5" * size)  # a sentinel the READ must overwrite
    post(a, WrOpcode.RDMA_READ, size, wr_id, local, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey)


def post_fetch_add(a: Side, b: Side, add: int, wr_id: int = 3) -> None:
    a.verbs.memory.write(a.mr.addr + LOCAL, b"\xa5" * 8)
    post(a, WrOpcode.ATOMIC_FETCH_AND_ADD, 8, wr_id, LOCAL, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey,
         compare_add=add)


def run_until_completions(wire: Wire, side: Side, count: int, max_steps: int = 2000) -> list[object]:
    found: list[object] = []

    def done() -> bool:
        found.extend(side.completions())
        return len(found) >= count

    wire.run(done, max_steps)
    assert len(found) == count, found
    return found


def requests_sent(packets: list[Packet], kind: str) -> list[Packet]:
    return [p for p in packets if p.kind == kind]


# -- the READ/atomic stall -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("answered", ["READ", "atomic"])
def test_a_duplicate_ack_ahead_of_the_answer_does_not_stall_the_queue(
        pair: tuple[LocalHost, Side, LocalHost, Side], answered: str) -> None:
    """A WRITE, then a READ (or an atomic). The responder answers both, and then, for a duplicate of the WRITE (a
    retransmission whose ACK was lost), acknowledges again up to the newest PSN it has taken, which covers the READ.
    That ACK overtakes the READ's responses on the network, and both arrive in one receive batch: the READ completes
    from its responses, exactly once, and the queue goes on (a second READ and an atomic complete). It once left the
    requester's cursor on the completed READ: sent again, counted outstanding for ever, every later READ or atomic
    waiting behind it with no timer armed."""
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host])
    b.verbs.memory.write(b.mr.addr + DATA, pattern(4096) if answered == "READ" else (40).to_bytes(8, "little"))
    a.verbs.memory.write(a.mr.addr + DATA, pattern(64, seed=9))
    post(a, WrOpcode.RDMA_WRITE, 64, 1, remote_addr=b.mr.addr + 0x20000, rkey=b.mr.rkey)
    if answered == "READ":
        post_read(a, b, 4096)
    else:
        post_fetch_add(a, b, 2)
    a_host.poll()
    write, request = a_host.sent()
    b_host.deliver(write)
    b_host.deliver(request)
    b_host.poll()
    answers = b_host.sent()  # the WRITE's ACK, then the READ's four responses (or the atomic's acknowledgement)
    assert answers[0].kind == "ACK" and len(answers) == (5 if answered == "READ" else 2)
    b_host.deliver(write)  # the duplicate
    (covering,) = b_host.sent()
    assert covering.kind == "ACK" and covering.psn == answers[-1].psn, "the duplicate's ACK covers the answer"
    for packet in [covering, *answers]:  # one receive batch: no poll of a between them
        a_host.deliver(packet)
    done = run_until_completions(wire, a, 2)
    assert [(c.wr_id, c.status) for c in done] == [(1, WcStatus.SUCCESS), (2 if answered == "READ" else 3,
                                                                              WcStatus.SUCCESS)]
    if answered == "READ":
        assert a.verbs.memory.read(a.mr.addr + LOCAL, 4096) == pattern(4096)
    else:
        assert a.verbs.memory.read(a.mr.addr + LOCAL, 8) == (40).to_bytes(8, "little")
    # The queue goes on: a READ and an atomic after it complete, each asked once.
    wire.log.clear()
    post_read(a, b, 2048, wr_id=4)
    post_fetch_add(a, b, 1, wr_id=5)
    done = run_until_completions(wire, a, 2)
    assert [(c.wr_id, c.status) for c in done] == [(4, WcStatus.SUCCESS), (5, WcStatus.SUCCESS)]
    assert len(requests_sent(wire.log, "READ_REQUEST")) == 1 and len(requests_sent(wire.log, "FETCH_ADD")) == 1
    assert a_host.engine.next_deadline_ns() is None, "nothing is outstanding: no timer"


# -- the transport on a clean wire and an impaired one ---------------------------------------------------------------


def test_every_operation_on_a_clean_wire(pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host])
    data = pattern(10_000)
    a.verbs.memory.write(a.mr.addr + DATA, data)
    b.verbs.memory.write(b.mr.addr + 0x40000, b"\xa5" * len(data))
    b.verbs.post_recv(b.qp, [(b.mr.addr + 0x40000, 0x10000, b.mr.lkey)], wr_id=70)
    post(a, WrOpcode.SEND, len(data), 1)
    post(a, WrOpcode.RDMA_WRITE, len(data), 2, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey)
    done = run_until_completions(wire, a, 2)
    assert [(c.wr_id, c.status) for c in done] == [(1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS)]
    (got,) = b.completions()
    assert (got.wr_id, got.status, got.opcode, got.byte_len) == (70, WcStatus.SUCCESS, WcOpcode.RECV, len(data))
    assert b.verbs.memory.read(b.mr.addr + 0x40000, len(data)) == data
    assert b.verbs.memory.read(b.mr.addr + DATA, len(data)) == data
    post_read(a, b, 5000, wr_id=3)
    post_fetch_add(a, b, 5, wr_id=4)
    done = run_until_completions(wire, a, 2)
    assert [(c.wr_id, c.status, c.opcode) for c in done] == [(3, WcStatus.SUCCESS, WcOpcode.RDMA_READ),
                                                             (4, WcStatus.SUCCESS, WcOpcode.FETCH_ADD)]
    assert a.verbs.memory.read(a.mr.addr + LOCAL, 8) == data[:8]  # the atomic's original value
    assert b.verbs.memory.read(b.mr.addr + DATA, 8) == (int.from_bytes(data[:8], "little") + 5).to_bytes(8, "little")
    assert a_host.roce()["retransmits"] == 0 and a_host.roce()["timeouts"] == 0
    assert b_host.roce()["duplicates"] == 0 and b_host.roce()["seq_naks"] == 0
    # 10 SEND packets, 10 WRITE packets, 1 READ request, 1 atomic: each sent once
    assert a_host.roce()["tx_packets"] == 22


def test_a_lost_packet_in_a_message_gets_a_sequence_nak_and_is_sent_again(
        pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    a_host, a, b_host, b = pair
    lose = LoseOnce("WRITE_MIDDLE", psn=2)
    wire = Wire([a_host, b_host], lose)
    data = pattern(8 * MTU)
    a.verbs.memory.write(a.mr.addr + DATA, data)
    post(a, WrOpcode.RDMA_WRITE, len(data), 1, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey)
    (done,) = run_until_completions(wire, a, 1)
    assert done.status == WcStatus.SUCCESS and lose.lost
    assert b.verbs.memory.read(b.mr.addr + DATA, len(data)) == data
    naks = [p for p in wire.log if p.kind == "ACK" and p.syndrome == 0x60]
    assert [p.psn for p in naks] == [2], "one sequence NAK, for the lost PSN"
    assert b_host.roce()["seq_naks"] == 1 and a_host.roce()["timeouts"] == 0
    assert a_host.roce()["retransmits"] == 6, "go-back-N from the lost packet: PSNs 2 to 7 again"


def test_a_lost_last_packet_is_sent_again_when_the_timer_expires(
        pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    a_host, a, b_host, b = pair
    lose = LoseOnce("WRITE_ONLY")
    wire = Wire([a_host, b_host], lose)
    a.verbs.memory.write(a.mr.addr + DATA, pattern(100))
    post(a, WrOpcode.RDMA_WRITE, 100, 1, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey)
    start = a_host.now
    (done,) = run_until_completions(wire, a, 1)
    assert done.status == WcStatus.SUCCESS and lose.lost
    assert a_host.roce()["timeouts"] == 1 and a_host.roce()["retransmits"] == 1
    assert a_host.now - start >= 4096 << 14, "sent again after the QP's timeout (14: 67 ms), not before"


def test_retries_run_out_when_nothing_answers(pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host], lambda packet: [])
    post(a, WrOpcode.RDMA_WRITE, 100, 1, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey)
    post(a, WrOpcode.SEND, 100, 2)
    done = run_until_completions(wire, a, 2)
    assert [(c.wr_id, c.status) for c in done] == [(1, WcStatus.RETRY_EXC_ERR), (2, WcStatus.WR_FLUSH_ERR)]
    assert a_host.roce()["timeouts"] == 8, "retry_cnt 7: the first sending and seven more"
    assert a_host.qp_state(a) == QpState.ERR


def test_a_duplicated_atomic_runs_once_and_is_answered_twice_alike(
        pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host], lambda p: [p, p] if p.kind == "FETCH_ADD" else [p])
    b.verbs.memory.write(b.mr.addr + DATA, (1000).to_bytes(8, "little"))
    post_fetch_add(a, b, 7)
    (done,) = run_until_completions(wire, a, 1)
    assert done.status == WcStatus.SUCCESS
    assert a.verbs.memory.read(a.mr.addr + LOCAL, 8) == (1000).to_bytes(8, "little")
    assert b.verbs.memory.read(b.mr.addr + DATA, 8) == (1007).to_bytes(8, "little"), "added once"
    answers = [p for p in wire.log if p.kind == "ATOMIC_ACK"]
    assert len(answers) == 2 and answers[0].data[12:] == answers[1].data[12:], "the kept answer, again"
    assert b_host.roce()["duplicates"] == 1


def test_a_lost_read_response_is_asked_again_from_where_it_was_lost(
        pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    a_host, a, b_host, b = pair
    lose = LoseOnce("READ_RESPONSE_MIDDLE", psn=2)
    wire = Wire([a_host, b_host], lose)
    data = pattern(6 * MTU)
    b.verbs.memory.write(b.mr.addr + DATA, data)
    post_read(a, b, len(data))
    (done,) = run_until_completions(wire, a, 1)
    assert (done.status, done.byte_len) == (WcStatus.SUCCESS, len(data)) and lose.lost
    assert a.verbs.memory.read(a.mr.addr + LOCAL, len(data)) == data
    reads = requests_sent(wire.log, "READ_REQUEST")
    assert [p.psn for p in reads] == [0, 2], "asked again from the first missing response, at once"
    assert a_host.roce()["timeouts"] == 0


def test_a_send_with_no_receive_posted_waits_out_rnr_naks(pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host])
    a.verbs.memory.write(a.mr.addr + DATA, pattern(300))
    post(a, WrOpcode.SEND, 300, 1)
    wire.run(lambda: b_host.roce()["rnr_naks"] >= 2)
    assert a.completions() == [] and a_host.roce()["retransmits"] >= 1
    b.verbs.post_recv(b.qp, [(b.mr.addr + DATA, 4096, b.mr.lkey)], wr_id=9)
    (done,) = run_until_completions(wire, a, 1)
    assert done.status == WcStatus.SUCCESS
    (got,) = b.completions()
    assert (got.wr_id, got.byte_len) == (9, 300)
    assert b.verbs.memory.read(b.mr.addr + DATA, 300) == pattern(300)


def test_acks_never_overtake_the_read_responses_they_cover(pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    """A READ whose responses do not all fit the responder's transmit ring (two other QPs of its host keep it
    busy with WRITEs), then a WRITE asking for an acknowledgement: the responder sends the WRITE's ACK after the
    READ's last response (in PSN order, as the specification's responder does), not among them, where it tells
    the requester that the responses still to come were lost."""
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host])
    for _ in range(2):  # b's requesters fill its ring up to what they may take (all but VRE_TX_RESERVE)
        a_other, b_other = a_host.side(), b_host.side()
        connect(a_other, a_host, b_other, b_host)
        post(b_other, WrOpcode.RDMA_WRITE, 300 * MTU, 9, 0, remote_addr=a_other.mr.addr, rkey=a_other.mr.rkey)
    while b_host.poll():
        pass
    size = 100 * MTU
    b.verbs.memory.write(b.mr.addr + DATA, pattern(size))
    post_read(a, b, size, local=0x10000)
    post(a, WrOpcode.RDMA_WRITE, 64, 3, offset=0, remote_addr=b.mr.addr + 0xF0000, rkey=b.mr.rkey)
    a_host.poll()
    read, write = a_host.sent()
    wire.log += [read, write]
    b_host.deliver(read)
    backlog = b_host.sent()  # the ring: the other QPs' WRITEs and the READ responses that found room
    assert 0 < len([p for p in backlog if p.kind.startswith("READ_RESPONSE")]) < 100
    b_host.deliver(write)
    wire.log += backlog
    wire.deliver(backlog)
    done = run_until_completions(wire, a, 2)
    assert [(c.wr_id, c.status) for c in done] == [(2, WcStatus.SUCCESS), (3, WcStatus.SUCCESS)]
    from_b = [p for p in wire.log if p.src == b_host.gid and p.dest_qpn == a.qp.qpn]
    last = next(i for i, p in enumerate(from_b) if p.kind == "READ_RESPONSE_LAST")
    write_ack = next(i for i, p in enumerate(from_b) if p.kind == "ACK" and p.psn == write.psn)
    assert write_ack > last, "the WRITE's ACK came after the READ's last response"
    assert len(requests_sent(wire.log, "READ_REQUEST")) == 1
    assert a.verbs.memory.read(a.mr.addr + 0x10000, size) == pattern(size)


@pytest.mark.parametrize("impairment", [Link(loss=0.05, seed=3), Link(duplicate=0.05, seed=4),
                                        Link(reorder=0.05, seed=5), Link(0.03, 0.03, 0.03, seed=6)],
                         ids=["loss", "duplication", "reordering", "all"])
def test_an_impaired_link_keeps_every_operation_intact(pair: tuple[LocalHost, Side, LocalHost, Side],
                                                       impairment: Link) -> None:
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host], impairment)
    data = pattern(16 * MTU, seed=3)
    a.verbs.memory.write(a.mr.addr + DATA, data)
    b.verbs.memory.write(b.mr.addr + 0x60000, (0).to_bytes(8, "little"))
    wr_id = 0
    for round_ in range(6):
        b.verbs.post_recv(b.qp, [(b.mr.addr + 0x40000, 0x10000, b.mr.lkey)], wr_id=100 + round_)
        post(a, WrOpcode.SEND, len(data), wr_id := wr_id + 1)
        post(a, WrOpcode.RDMA_WRITE, len(data), wr_id := wr_id + 1, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey)
        a.verbs.memory.write(a.mr.addr + LOCAL, b"\xa5" * len(data))
        post(a, WrOpcode.RDMA_READ, len(data), wr_id := wr_id + 1, LOCAL, remote_addr=b.mr.addr + DATA,
             rkey=b.mr.rkey)
        post(a, WrOpcode.ATOMIC_FETCH_AND_ADD, 8, wr_id := wr_id + 1, 0x70000 + 8 * round_,
             remote_addr=b.mr.addr + 0x60000, rkey=b.mr.rkey, compare_add=1)
        done = run_until_completions(wire, a, 4, max_steps=20_000)
        assert [(c.wr_id, c.status) for c in done] == [(w, WcStatus.SUCCESS) for w in range(wr_id - 3, wr_id + 1)]
        assert a.verbs.memory.read(a.mr.addr + LOCAL, len(data)) == data
        assert a.verbs.memory.read(a.mr.addr + 0x70000 + 8 * round_, 8) == round_.to_bytes(8, "little")
        wire.run(lambda: bool(b.completions()), max_steps=20_000)
        assert b.verbs.memory.read(b.mr.addr + 0x40000, len(data)) == data
    assert b.verbs.memory.read(b.mr.addr + 0x60000, 8) == (6).to_bytes(8, "little"), "each atomic ran once"
    assert sum(impairment.counts.values()) > 0, f"the link did nothing: {impairment.counts}"
    counters = a_host.roce()
    if impairment.loss:
        assert counters["retransmits"] > 0
    if impairment.duplicate:
        assert b_host.roce()["duplicates"] + a_host.roce()["dropped"] > 0


# -- the responder's steps ------------------------------------------------------------------------------------------


def test_the_responder_counts_each_drop_under_the_step_that_dropped_it(
        pair: tuple[LocalHost, Side, LocalHost, Side]) -> None:
    """A forged SEND longer than the path MTU is dropped at the length step; a duplicate READ request whose PSN a
    WRITE took (so no READ answer is kept for it) at the duplicate step. Each drop is in `dropped` and in its
    step's counter and nowhere else, and the QP goes on."""
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host])
    post(a, WrOpcode.RDMA_WRITE, 64, 1, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey)
    a_host.poll()
    (write,) = a_host.sent()
    b_host.deliver(write)
    before = b_host.roce()
    send_only, read_request = 0x04, 0x0C
    b_host.deliver(build(write.src, write.dst, opcode=send_only, dest_qpn=write.dest_qpn,
                         psn=(write.psn + 1) & 0xFFFFFF, payload_len=2 * MTU))
    b_host.deliver(build(write.src, write.dst, opcode=read_request, dest_qpn=write.dest_qpn, psn=write.psn,
                         va=b.mr.addr + DATA, rkey=b.mr.rkey, dma_len=64))
    after = b_host.roce()
    steps = {name: after[name] - before[name] for name in after if name.startswith("resp_drop_")}
    assert steps == {"resp_drop_opcode": 0, "resp_drop_psn": 0, "resp_drop_duplicate": 1, "resp_drop_length": 1,
                     "resp_drop_sequence": 0, "resp_drop_resource": 0, "resp_drop_rkey": 0}, steps
    assert after["dropped"] - before["dropped"] == 2 and after["duplicates"] - before["duplicates"] == 1
    run_until_completions(wire, a, 1)
    post(a, WrOpcode.RDMA_WRITE, 64, 2, remote_addr=b.mr.addr + DATA, rkey=b.mr.rkey)
    assert [c.wr_id for c in run_until_completions(wire, a, 1)] == [2], "the QP goes on"


# -- a VM's device saved and loaded with its RoCE QP mid-traffic (issue 28) ----------------------------------------

@pytest.mark.parametrize("moved", ["requester", "responder"])
def test_a_rc_qp_to_another_host_survives_its_device_saved_and_loaded_mid_traffic(
        pair: tuple[LocalHost, Side, LocalHost, Side], moved: str) -> None:
    """A SEND, a WRITE, a READ and an atomic between two hosts, some of their packets on the wire, some not sent
    yet; then one side's device suspended (what arrives meanwhile is dropped), saved, reset and loaded from the state
    (its PSNs, started WQEs, READ ring, timer and receive carried): every operation completes once, with its data,
    the lost packets sent again by the transport."""
    a_host, a, b_host, b = pair
    wire = Wire([a_host, b_host])
    data = pattern(6000)
    a.verbs.memory.write(a.mr.addr + DATA, data)
    b.verbs.memory.write(b.mr.addr + DATA, pattern(4096, seed=5))
    b.verbs.memory.write(b.mr.addr + 0x30000, (7).to_bytes(8, "little"))
    b.verbs.post_recv(b.qp, [(b.mr.addr + 0x40000, 0x10000, b.mr.lkey)], wr_id=70)
    post(a, WrOpcode.SEND, len(data), 1)
    post(a, WrOpcode.RDMA_WRITE, len(data), 2, remote_addr=b.mr.addr + 0x50000, rkey=b.mr.rkey)
    post_read(a, b, 4096, wr_id=3)
    a.verbs.memory.write(a.mr.addr + LOCAL + 0x2000, b"\xa5" * 8)
    post(a, WrOpcode.ATOMIC_FETCH_AND_ADD, 8, 4, LOCAL + 0x2000, remote_addr=b.mr.addr + 0x30000, rkey=b.mr.rkey,
         compare_add=3)
    a_host.poll()
    in_flight = a_host.sent()
    wire.deliver(in_flight[:len(in_flight) // 2])  # half of the first packets arrive
    host = a_host if moved == "requester" else b_host
    host.device.suspend()
    data_state = host.device.save_state()
    wire.deliver(in_flight[len(in_flight) // 2:])  # the rest lands on a suspended device: dropped
    host.device.reset(keep_memory=True)
    host.device.load_state(data_state)
    host.device.suspend(False)
    done = run_until_completions(wire, a, 4)
    assert [(c.wr_id, c.status) for c in done] == [(i, WcStatus.SUCCESS) for i in (1, 2, 3, 4)]
    (got,) = b.completions()
    assert (got.wr_id, got.status, got.byte_len) == (70, WcStatus.SUCCESS, len(data))
    assert b.verbs.memory.read(b.mr.addr + 0x40000, len(data)) == data
    assert b.verbs.memory.read(b.mr.addr + 0x50000, len(data)) == data
    assert a.verbs.memory.read(a.mr.addr + LOCAL, 4096) == pattern(4096, seed=5)
    assert a.verbs.memory.read(a.mr.addr + LOCAL + 0x2000, 8) == (7).to_bytes(8, "little")
    assert b.verbs.memory.read(b.mr.addr + 0x30000, 8) == (10).to_bytes(8, "little")  # the atomic ran once
