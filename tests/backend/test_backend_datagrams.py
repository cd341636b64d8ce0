"""UD and GSI datagrams through the data engine, between two simulated VMs on one backend.

A datagram goes to the QP its address vector names (destination GID, QPN, Q_Key); the receiver gets the 40-byte
network header a RoCE NIC writes, made from the sender's own GID table, then the payload. What nobody takes is
dropped and counted, and the sender's completion is a success all the same, as UD defines.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from backend_process import GID, BackendProcess, pattern, two_vms, wait_cqes

from vrdma.device import abi
from vrdma.testing.frontend import Frontend
from vrdma.testing.simulated_guest import SimCq, SimMr, SimQp, SimVerbs

pytestmark = pytest.mark.backend

LINK_LOCAL = bytes.fromhex("fe800000000000005054" + "00fffe767200")
QKEY = 0x11223344
GSI_QKEY = abi.const("VRDMA_GSI_QKEY")
GRH = abi.const("VRDMA_GRH_SIZE")
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR")}
FLAG = {name: abi.const(f"VRDMA_WC_{name}") for name in ("GRH", "WITH_IMM")}
NET = {name: abi.const(f"VRDMA_NETWORK_{name}") for name in ("ROCE_V1", "IPV4", "IPV6")}


@dataclass
class UdSide:
    """One simulated VM with a UD QP (and its kernel's GSI QP), a CQ and an MR."""

    name: str
    verbs: SimVerbs
    cq: SimCq
    qp: SimQp
    mr: SimMr
    kernel: SimVerbs
    kcq: SimCq
    gsi: SimQp


def make_side(fe: Frontend, backend: BackendProcess, name: str) -> UdSide:
    fe.start()
    verbs = SimVerbs(fe, backend.directory / f"{name}.doorbell")
    verbs.add_gid(0, GID[name])
    pd, cq = verbs.alloc_pd(), verbs.create_cq(64)
    qp = verbs.create_qp(pd, cq, cq, qp_type="UD")
    verbs.ud_ready(qp, QKEY)
    kernel = SimVerbs(fe, backend.directory / f"{name}.doorbell", kernel=True)
    kcq = kernel.create_cq(64)
    gsi = kernel.create_qp(kernel.alloc_pd(), kcq, kcq, qp_type="GSI")
    kernel.ud_ready(gsi, GSI_QKEY, gsi=True)
    return UdSide(name, verbs, cq, qp, verbs.reg_mr(pd, 64 << 10), kernel, kcq, gsi)


@pytest.fixture
def pair(backend: BackendProcess) -> Iterator[tuple[UdSide, UdSide]]:
    with two_vms(backend, make_side, GID, connect=False) as sides:
        yield sides


def no_cqe(verbs: SimVerbs, cq: SimCq) -> None:
    """Nothing arrived: the engine decides a datagram's fate before it completes the send, so the receiver's CQ is
    final once the sender has its completion."""
    assert verbs.poll_cq(cq) == []


def send(side: UdSide, dgid: bytes, qpn: int, payload: bytes, qkey: int = QKEY, **kw: Any) -> Any:
    side.verbs.memory.write(side.mr.addr, payload)
    side.verbs.post_ud_send(side.qp, [(side.mr.addr, len(payload), side.mr.lkey)], dgid, qpn, qkey, wr_id=5, **kw)
    (sent,) = wait_cqes(side.verbs, side.cq, 1)
    return sent


def post_recv(side: UdSide, size: int = 4096 + GRH, offset: int = 32 << 10) -> None:
    side.verbs.post_recv(side.qp, [(side.mr.addr + offset, size, side.mr.lkey)], wr_id=6)


def dropped(backend: BackendProcess, vm: str) -> int:
    return int(backend.counters(vm)["engine"]["ud_dropped"])


def test_a_datagram_arrives_behind_the_ipv4_header_of_the_senders_gid(pair: tuple[UdSide, UdSide]) -> None:
    a, b = pair
    payload = bytes(range(256)) * 8
    post_recv(b)
    sent = send(a, GID["vm1"], b.qp.qpn, payload, imm=0xC0DE)
    (got,) = wait_cqes(b.verbs, b.cq, 1)
    assert (sent.wr_id, sent.status, sent.byte_len) == (5, WC["SUCCESS"], len(payload))
    assert (got.wr_id, got.status, got.byte_len, got.qp_num, got.src_qp) == \
        (6, WC["SUCCESS"], GRH + len(payload), b.qp.qpn, a.qp.qpn)
    assert got.wc_flags == FLAG["GRH"] | FLAG["WITH_IMM"] and got.imm_data == 0xC0DE
    assert got.network_hdr_type == NET["IPV4"]
    header = b.verbs.memory.read(b.mr.addr + (32 << 10), GRH)
    ip = header[20:]
    assert ip[0] == 0x45 and ip[9] == 17 and sum(struct.unpack("!10H", ip)) % 0xFFFF == 0  # a valid checksum
    assert ipaddress.IPv4Address(ip[12:16]) == ipaddress.IPv4Address("169.254.100.1")  # vm0's, not chosen by vm0
    assert ipaddress.IPv4Address(ip[16:20]) == ipaddress.IPv4Address("169.254.100.2")
    assert b.verbs.memory.read(b.mr.addr + (32 << 10) + GRH, len(payload)) == payload


def test_a_roce_v1_source_gets_a_grh(pair: tuple[UdSide, UdSide]) -> None:
    a, b = pair
    a.verbs.call("VRDMA_CMD_ADD_GID", "vrdma_cmd_add_gid", "vrdma_resp_hdr", index=1,
                 type=abi.const("VRDMA_GID_TYPE_ROCE_V1"), gid=list(LINK_LOCAL))
    post_recv(b)
    send(a, GID["vm1"], b.qp.qpn, b"hello", sgid_index=1)
    (got,) = wait_cqes(b.verbs, b.cq, 1)
    header = b.verbs.memory.read(b.mr.addr + (32 << 10), GRH)
    assert got.network_hdr_type == NET["ROCE_V1"] and header[0] >> 4 == 6 and header[6] == 0x1B
    assert header[8:24] == LINK_LOCAL and header[24:40] == GID["vm1"]


@pytest.mark.parametrize("case", ["unknown GID", "unknown QPN", "wrong Q_Key", "an RC QP", "no receive posted"])
def test_a_datagram_nobody_takes_is_dropped_and_counted(backend: BackendProcess, pair: tuple[UdSide, UdSide],
                                                        case: str) -> None:
    a, b = pair
    if case != "no receive posted":
        post_recv(b)
    rc_qpn = b.verbs.create_qp(b.verbs.alloc_pd(), b.cq, b.cq).qpn
    dgid, qpn, qkey = {
        "unknown GID": (bytes(16), b.qp.qpn, QKEY), "unknown QPN": (GID["vm1"], b.qp.qpn ^ 0x100000, QKEY),
        "wrong Q_Key": (GID["vm1"], b.qp.qpn, QKEY + 1), "an RC QP": (GID["vm1"], rc_qpn, QKEY),
        "no receive posted": (GID["vm1"], b.qp.qpn, QKEY)}[case]
    before = dropped(backend, "vm0")
    sent = send(a, dgid, qpn, b"lost", qkey=qkey)
    assert sent.status == WC["SUCCESS"]  # UD: the sender does not learn what became of it
    assert dropped(backend, "vm0") == before + 1
    no_cqe(b.verbs, b.cq)
    # The receive (if any) is still there for the next datagram that is right.
    if case != "no receive posted":
        send(a, GID["vm1"], b.qp.qpn, b"found")
        (got,) = wait_cqes(b.verbs, b.cq, 1)
        assert got.status == WC["SUCCESS"] and got.byte_len == GRH + 5


def test_a_receive_too_small_completes_in_error_at_the_receiver_only(backend: BackendProcess,
                                                                     pair: tuple[UdSide, UdSide]) -> None:
    a, b = pair
    post_recv(b, size=GRH + 8)
    sent = send(a, GID["vm1"], b.qp.qpn, b"nine byte")
    (got,) = wait_cqes(b.verbs, b.cq, 1)
    assert sent.status == WC["SUCCESS"] and got.status == WC["LOC_LEN_ERR"]


@pytest.mark.parametrize("case", ["source GID index not in the table", "source GID index past the table",
                                  "payload past the path MTU"])
def test_a_bad_send_completes_in_error_at_the_sender(pair: tuple[UdSide, UdSide], case: str) -> None:
    a, b = pair
    post_recv(b)
    size, sgid_index, status = {"source GID index not in the table": (8, 5, WC["LOC_QP_OP_ERR"]),
                                "source GID index past the table": (8, 200, WC["LOC_QP_OP_ERR"]),
                                "payload past the path MTU": (4097, 0, WC["LOC_LEN_ERR"])}[case]
    sent = send(a, GID["vm1"], b.qp.qpn, bytes(size), sgid_index=sgid_index)
    assert sent.status == status
    no_cqe(b.verbs, b.cq)


def test_gsi_datagrams_reach_qp1_with_the_senders_real_source(pair: tuple[UdSide, UdSide]) -> None:
    """The kernels' QP1s talk (as the MAD layer does); a user QP can reach QP1 too (any node can send a MAD), but
    the receiver sees that QP's own number and its VM's own GID as the source: nothing names another sender."""
    a, b = pair
    assert a.gsi.qpn == b.gsi.qpn == abi.const("VRDMA_GSI_QPN")
    kbuf = b.kernel.alloc(8192)
    b.kernel.post_recv(b.gsi, [(kbuf.gpa, 4096, abi.const("VRDMA_LOCAL_DMA_LKEY"))], wr_id=1)
    b.kernel.post_recv(b.gsi, [(kbuf.gpa + 4096, 4096, abi.const("VRDMA_LOCAL_DMA_LKEY"))], wr_id=2)
    src = a.kernel.alloc(4096)
    a.kernel.memory.write(src.gpa, b"M" * 256)
    a.kernel.post_ud_send(a.gsi, [(src.gpa, 256, abi.const("VRDMA_LOCAL_DMA_LKEY"))], GID["vm1"], 1, GSI_QKEY)
    (got,) = wait_cqes(b.kernel, b.kcq, 1)
    assert (got.status, got.src_qp, got.byte_len) == (WC["SUCCESS"], 1, GRH + 256)
    assert b.kernel.memory.read(kbuf.gpa + GRH, 256) == b"M" * 256
    # A user QP of vm0, its Q_Key set to QP1's, sends to vm1's QP1.
    a.verbs.modify_qp(a.qp, abi.const("VRDMA_QP_QKEY"), qkey=GSI_QKEY)
    send(a, GID["vm1"], 1, b"not QP1", qkey=abi.const("VRDMA_QKEY_PRIVILEGED"))
    (got,) = wait_cqes(b.kernel, b.kcq, 1)
    header = b.kernel.memory.read(kbuf.gpa + 4096, GRH)
    assert got.status == WC["SUCCESS"] and got.src_qp == a.qp.qpn != 1
    assert header[20 + 12:20 + 16] == GID["vm0"][12:]


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[tuple[BackendProcess, UdSide, UdSide, UdSide]]:
    """vm0 (the sender), vm1 (the receiver) and vm2 (a bystander) on one backend."""
    backend = BackendProcess(tmp_path, names=("vm0", "vm1", "vm2"))
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1, backend.frontend("vm2") as fe2:
        yield (backend, make_side(fe0, backend, "vm0"), make_side(fe1, backend, "vm1"),
               make_side(fe2, backend, "vm2"))
    assert backend.stop() == 0, backend.log_text()


def test_malformed_and_unwanted_datagrams_touch_no_bystander(
        trio: tuple[BackendProcess, UdSide, UdSide, UdSide]) -> None:
    """vm0 sends everything a broken or hostile guest could: datagrams nobody takes (a flood with no receives
    posted, unknown QPNs and GIDs, wrong Q_Keys, QP1 with a user Q_Key), then sends that are its own errors (a
    source GID it does not have, an oversize payload, an RDMA WRITE on a UD QP). vm1 takes nothing it did not
    accept; vm2, served by the same backend, sees nothing at all: no completion, its memory and counters as they
    were."""
    backend, a, b, c = trio
    c.verbs.memory.write(c.mr.addr, pattern(4096))
    post_recv(c)
    c.kernel.post_recv(c.gsi, [(c.kernel.alloc(4096).gpa, 4096, abi.const("VRDMA_LOCAL_DMA_LKEY"))], wr_id=3)
    bystander = backend.counters("vm2")
    for _ in range(64):  # a flood at vm1, which posted no receive
        send(a, GID["vm1"], b.qp.qpn, b"flood")
    for dgid, qpn, qkey in ((GID["vm1"], b.qp.qpn ^ 0x100000, QKEY), (bytes(16), b.qp.qpn, QKEY),
                            (GID["vm1"], b.qp.qpn, QKEY + 1), (GID["vm1"], 1, QKEY)):
        assert send(a, dgid, qpn, b"unwanted", qkey=qkey).status == WC["SUCCESS"]
    assert b.verbs.poll_cq(b.cq) == [] and b.kernel.poll_cq(b.kcq) == []
    assert send(a, GID["vm1"], b.qp.qpn, b"x", sgid_index=7).status == WC["LOC_QP_OP_ERR"]
    # Once in error, every further send of vm0's QP is flushed: nothing leaves it.
    a.verbs.post_send(a.qp, abi.const("VRDMA_WR_RDMA_WRITE"), [(a.mr.addr, 8, a.mr.lkey)], wr_id=9)
    (flushed,) = wait_cqes(a.verbs, a.cq, 1)
    assert flushed.status == abi.const("VRDMA_WC_WR_FLUSH_ERR")
    # vm2 saw nothing, and its memory is as it was.
    assert c.verbs.poll_cq(c.cq) == [] and c.kernel.poll_cq(c.kcq) == []
    assert c.verbs.memory.read(c.mr.addr, 4096) == pattern(4096)
    after = backend.counters("vm2")
    assert after["engine"] == bystander["engine"] and after["objects"] == bystander["objects"]
    assert dropped(backend, "vm1") == 64 + 3  # the flood, and the three that found vm1 but not a taker


def test_a_write_on_a_ud_qp_is_the_senders_error(pair: tuple[UdSide, UdSide]) -> None:
    a, b = pair
    post_recv(b)
    a.verbs.post_send(a.qp, abi.const("VRDMA_WR_RDMA_WRITE"), [(a.mr.addr, 8, a.mr.lkey)], wr_id=9,
                      remote_addr=b.mr.addr, rkey=b.mr.rkey)
    (sent,) = wait_cqes(a.verbs, a.cq, 1)
    assert sent.status == WC["LOC_QP_OP_ERR"]
    no_cqe(b.verbs, b.cq)
    assert b.verbs.memory.read(b.mr.addr, 8) == bytes(8)
