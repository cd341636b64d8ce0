"""Run inside two guests: one guest attacks the other's memory through RDMA WRITE and READ. Modes:

  victim GID PORT          register memory, serve one QP per attack, report checksums of the memory attacked
  attacker GID HOST PORT   for each attack, connect a fresh QP and try it; report the completion status

GID is the index of vrdma0's RoCE v2 IPv4 GID (the host looks it up: vrdma.harness.verbs.ipv4_gid_index).

Attacks (each with RDMA WRITE and with RDMA READ): a wrong rkey, a valid rkey of another PD, a range past the
end of the MR, an MR registered without remote access. After them, one legitimate write into a scratch MR shows
both guests are still served. Each side prints one JSON object.
"""

import hashlib
import json
import socket
import sys

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

SIZE = 64 * 1024
REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
ATTACKS = [(kind, op) for kind in ("wrong rkey", "rkey of another PD", "past the end", "no remote access")
           for op in ("write", "read")]


def new_qp(pd, cq):
    """An RC QP in INIT that lets its peer write and read (the MRs decide what may really be touched)."""
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=4, max_recv_wr=4)))
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index, attr.port_num, attr.qp_access_flags = 0, 1, e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    qp.to_init(attr)
    return qp


def to_rts(qp, remote_qpn, remote_gid, index):
    attr = QPAttr(qp_state=e.IBV_QPS_RTR)
    attr.path_mtu, attr.dest_qp_num, attr.rq_psn, attr.max_dest_rd_atomic, attr.min_rnr_timer = 3, remote_qpn, 0, 1, 12
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=remote_gid, sgid_index=index), is_global=1, port_num=1)
    qp.to_rtr(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = 14, 7, 7, 0, 1
    qp.to_rts(attr)


class Peer:
    """The other side's TCP connection, one JSON object per line. Both sides send before they read, so the peer can
    be a whole message ahead and one recv() can hold two lines: lines are read through a buffered file."""

    def __init__(self, sock):
        self.sock, self.lines = sock, sock.makefile("rb")

    def exchange(self, message):
        self.sock.sendall((json.dumps(message) + "\n").encode())
        line = self.lines.readline()
        if not line.endswith(b"\n"):
            sys.exit("peer closed the connection")
        return json.loads(line)


def digest(mr):
    return hashlib.sha256(mr.read(SIZE, 0)).hexdigest()


def victim(index, port):
    ctx = Context(name="vrdma0")
    pd, other_pd = PD(ctx), PD(ctx)
    cq = CQ(ctx, 16)
    target = MR(pd, SIZE, REMOTE)
    other = MR(other_pd, SIZE, REMOTE)
    local_only = MR(pd, SIZE, e.IBV_ACCESS_LOCAL_WRITE)
    scratch = MR(pd, SIZE, REMOTE)
    for n, mr in enumerate((target, other, local_only)):
        mr.write(hashlib.sha256(str(n).encode()).digest() * (SIZE // 32), SIZE)
    before = {name: digest(mr) for name, mr in (("target", target), ("other", other), ("local_only", local_only))}
    keys = {"target": [target.buf, target.rkey], "other": [other.buf, other.rkey],
            "local_only": [local_only.buf, local_only.rkey], "scratch": [scratch.buf, scratch.rkey]}
    listener = socket.create_server(("", port))
    conn = Peer(listener.accept()[0])
    gid = str(ctx.query_gid(1, index))
    qps = []
    for _ in range(len(ATTACKS) + 1):
        qp = new_qp(pd, cq)
        peer = conn.exchange({"qpn": qp.qp_num, "gid": gid, "keys": keys})
        to_rts(qp, peer["qpn"], GID(peer["gid"]), index)
        qps.append(qp)
        conn.exchange({"ready": True})    # in RTS: the attacker may post (its answer says it is in RTS too)
        conn.exchange({"waiting": True})  # returns once the attacker saw its completion
    after = {name: digest(mr) for name, mr in (("target", target), ("other", other), ("local_only", local_only))}
    print(json.dumps({"before": before, "after": after, "scratch": scratch.read(32, 0).decode(errors="replace")}))


def attacker(index, host, port):
    ctx = Context(name="vrdma0")
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    local = MR(pd, SIZE, REMOTE)
    conn = Peer(socket.create_connection((host, port)))
    gid = str(ctx.query_gid(1, index))
    results = {}
    for attack in [*ATTACKS, ("legitimate", "write")]:
        qp = new_qp(pd, cq)
        peer = conn.exchange({"qpn": qp.qp_num, "gid": gid})
        to_rts(qp, peer["qpn"], GID(peer["gid"]), index)
        conn.exchange({"rts": True})  # returns once the victim's QP is in RTS too
        kind, op = attack
        addr, rkey = peer["keys"]["target"]
        length = 64
        if kind == "wrong rkey":
            rkey ^= 0x5A5A0000
        elif kind == "rkey of another PD":
            addr, rkey = peer["keys"]["other"]
        elif kind == "past the end":
            addr += SIZE - 32
        elif kind == "no remote access":
            addr, rkey = peer["keys"]["local_only"]
        elif kind == "legitimate":
            addr, rkey = peer["keys"]["scratch"]
            local.write(b"written by the attacker, legally", 32)
            length = 32
        wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE if op == "write" else e.IBV_WR_RDMA_READ, num_sge=1,
                    sg=[SGE(local.buf, length, local.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(rkey, addr)
        qp.post_send(wr)
        while True:
            n, wcs = cq.poll(1)
            if n:
                break
        results[f"{kind} / {op}"] = int(wcs[0].status)
        conn.exchange({"done": True})
    print(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[1] == "victim":
        victim(int(sys.argv[2]), int(sys.argv[3]))
    else:
        attacker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
