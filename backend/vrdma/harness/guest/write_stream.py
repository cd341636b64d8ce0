"""Run inside a guest (by tests/vm/test_vm_migration.py and `vrdma bench`): a stream of RDMA WRITEs whose receiver
checks every byte it is given, since perftest checks nothing. Modes:

  recv DEVICE GID PORT BLOCKS SIZE [FILE]   listen on TCP PORT for the sender, then check BLOCKS blocks (FILE: where
                                            the count of blocks checked so far is written, every 64)
  send DEVICE GID ADDRESS PORT BLOCKS SIZE  connect to the receiver at ADDRESS:PORT and write BLOCKS blocks

GID is the index of the device's RoCE v2 IPv4 GID. The sender ends the stream, once every block it wrote is
acknowledged, with an empty WRITE WITH IMMEDIATE of END, which the receiver waits for; BLOCKS 0: the sender writes
until SIGTERM (at any time: one during its set-up ends the stream before its first block), and the receiver takes as
many as come. A receiver whose sender closes the TCP connection without the end stops there, with an error.

One RC QP each way of the stream: the sender writes block N (SIZE bytes, each 8 of them N's pattern and their
offset, so that a block left stale, torn or misplaced is seen) into slot N % SLOTS of the receiver's buffer with
WRITE WITH IMMEDIATE (N), keeping at most SLOTS blocks unchecked; the receiver checks each block when its immediate
arrives and acknowledges it with an empty SEND carrying N, which frees the slot. The TCP connection carries only the
QPs' addresses, before the stream.

Each side prints one JSON object: blocks done, the first wrong block (if any: its number, the offset of its first
wrong byte, what was there), completions in error, and the longest gap between two of its completions (the pause
its peer's migration, or a backend upgrade, cost it), with the time of that gap. Exit status 0 only when every block
was written, checked and right.
"""

import json
import os
import signal
import socket
import struct
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

SLOTS = 8
SCRATCH = 64  # bytes after the slots: what acknowledgements and the end carry (pyverbs wants an SGE in every WR)
END = 0xFFFFFFFF  # the immediate of the stream's end (a block's is its number modulo 2^32, never END in a test)
TIMEOUT = 600.0  # seconds without a completion before the stream gives up


class Patterns:
    """Block N's bytes: per 8 bytes (little-endian), N in the high 40 bits and the offset / 8 in the low 24. Made as
    one big integer (N times a word of 1 << 24 in every place, or'd with the offsets), which costs a guest under TCG
    far less than packing each word."""

    def __init__(self, size):
        words = size // 8
        self.size = size
        self.offsets = int.from_bytes(struct.pack(f"<{words}Q", *(i & 0xFFFFFF for i in range(words))), "little")
        self.spread = int.from_bytes(struct.pack(f"<{words}Q", *([1 << 24] * words)), "little")

    def block(self, n):
        return ((n & 0xFFFFFFFFFF) * self.spread | self.offsets).to_bytes(self.size, "little")


def setup(device, gid_index, slots_bytes):
    ctx = Context(name=device)
    pd = PD(ctx)
    cq = CQ(ctx, 4 * SLOTS)
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    mr = MR(pd, slots_bytes + SCRATCH, access)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                           cap=QPCap(max_send_wr=SLOTS, max_recv_wr=SLOTS, max_send_sge=1, max_recv_sge=1)))
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index, attr.port_num, attr.qp_access_flags = 0, 1, access
    qp.to_init(attr)
    gid = ctx.query_gid(1, gid_index)
    return {"ctx": ctx, "pd": pd, "cq": cq, "mr": mr, "qp": qp, "gid": gid,
            "scratch": [SGE(mr.buf + slots_bytes, 8, mr.lkey)],
            "me": {"qpn": qp.qp_num, "gid": str(gid), "addr": mr.buf, "rkey": mr.rkey}}


def to_rts(qp, peer, gid_index):
    attr = QPAttr(qp_state=e.IBV_QPS_RTR)
    attr.path_mtu, attr.dest_qp_num, attr.rq_psn, attr.max_dest_rd_atomic, attr.min_rnr_timer = \
        3, peer["qpn"], 0, 1, 12
    dgid = GID(peer["gid"])
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=dgid, sgid_index=gid_index), is_global=1, port_num=1)
    qp.to_rtr(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = 14, 7, 7, 0, 1
    qp.to_rts(attr)


def exchange(sock, me):
    sock.sendall((json.dumps(me) + "\n").encode())
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise SystemExit("the peer closed the connection before sending its address")
        line += chunk
    return json.loads(line)


class Clock:
    """The longest gap between two completions, and when it ended (seconds since the stream began)."""

    def __init__(self):
        self.start = self.last = time.monotonic()
        self.gap, self.gap_at = 0.0, 0.0

    def tick(self):
        now = time.monotonic()
        if now - self.last > self.gap:
            self.gap, self.gap_at = now - self.last, now - self.start
        self.last = now

    def report(self):
        return {"max_gap_ms": round(self.gap * 1e3, 2), "max_gap_at_s": round(self.gap_at, 2),
                "elapsed_s": round(time.monotonic() - self.start, 2)}


def sender_gone(conn):
    """ConnectionError if the sender closed its TCP connection (it ended, or died, without the end)."""
    try:
        if conn.recv(1, socket.MSG_PEEK) == b"":
            raise ConnectionError("the sender closed its connection without ending the stream")
    except BlockingIOError:
        pass


def poll(cq, clock, errors, idle=None):
    """The next completions (those in error go to ``errors``); ``idle``: called while there are none."""
    looks = 0
    while True:
        n, wcs = cq.poll(2 * SLOTS)
        if n:
            clock.tick()
            good = []
            for wc in wcs[:n]:
                if wc.status != e.IBV_WC_SUCCESS:
                    errors.append({"wr_id": wc.wr_id, "status": wc.status, "opcode": wc.opcode})
                else:
                    good.append(wc)
            return good
        if time.monotonic() - clock.last > TIMEOUT:
            raise TimeoutError(f"no completion in {TIMEOUT:g} s")
        looks += 1
        if idle is not None and looks % 4096 == 0:
            idle()


def progress_writer(path):
    """Write the blocks checked so far to ``path`` (atomically), or nothing without one."""
    def write(count):
        if path:
            with open(path + ".tmp", "w") as out:
                out.write(f"{count}\n")
            os.replace(path + ".tmp", path)
    return write


def receive(device, gid_index, port, blocks, size, progress_file=None):
    side = setup(device, gid_index, SLOTS * size)
    mr, qp, cq = side["mr"], side["qp"], side["cq"]
    listener = socket.create_server(("", port), reuse_port=True)
    conn, _ = listener.accept()
    peer = exchange(conn, side["me"])
    for slot in range(SLOTS):
        qp.post_recv(RecvWR(wr_id=slot, num_sge=1, sg=side["scratch"]))
    to_rts(qp, peer, gid_index)
    conn.sendall(b"ready\n")
    conn.setblocking(False)
    progress = progress_writer(progress_file)
    progress(0)
    patterns = Patterns(size)
    clock, errors, wrong, checked, ended = Clock(), [], None, 0, False
    try:
        while not ended and not errors and wrong is None:
            completions = poll(cq, clock, errors, lambda: sender_gone(conn))
            for wc in completions:
                if wc.opcode != e.IBV_WC_RECV_RDMA_WITH_IMM:
                    continue  # an acknowledgement's send completion
                block = socket.ntohl(wc.imm_data)  # (pyverbs hands the immediate in network order)
                if block == END:
                    ended = True
                    break
                slot = block % SLOTS
                got = mr.read(size, slot * size)
                want = patterns.block(checked)
                if block != checked & 0xFFFFFFFF or got != want:
                    at = next((i for i in range(0, size, 8) if got[i:i + 8] != want[i:i + 8]), None)
                    wrong = {"block": checked, "immediate": block, "offset": at,
                             "found": got[at:at + 8].hex() if at is not None else None}
                    break
                checked += 1
                if checked % 64 == 0:
                    progress(checked)
                qp.post_recv(RecvWR(wr_id=slot, num_sge=1, sg=side["scratch"]))
                qp.post_send(SendWR(wr_id=block, opcode=e.IBV_WR_SEND_WITH_IMM, num_sge=1, sg=side["scratch"],
                                    imm_data=socket.htonl(block)))
    except (TimeoutError, ConnectionError) as err:
        errors.append({"stopped": str(err)})
    progress(checked)
    return {"role": "recv", "blocks": checked, "ended": ended, "wrong": wrong, "errors": errors[:10],
            **clock.report()}


def send(device, gid_index, address, port, blocks, size, stopping):
    side = setup(device, gid_index, SLOTS * size)
    mr, qp, cq = side["mr"], side["qp"], side["cq"]
    conn = socket.create_connection((address, port), timeout=60)
    peer = exchange(conn, side["me"])
    for slot in range(SLOTS):
        qp.post_recv(RecvWR(wr_id=slot, num_sge=1, sg=side["scratch"]))
    to_rts(qp, peer, gid_index)
    if conn.recv(16) != b"ready\n":
        raise SystemExit("the receiver did not get ready")
    patterns = Patterns(size)
    limit = blocks or END
    clock, errors, written, acked = Clock(), [], 0, 0
    try:
        while acked < written or (written < limit and not stopping):
            if errors:
                break
            while written < limit and written - acked < SLOTS and not stopping:
                slot = written % SLOTS
                mr.write(patterns.block(written), size, slot * size)
                wr = SendWR(wr_id=written, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                            sg=[SGE(mr.buf + slot * size, size, mr.lkey)], imm_data=socket.htonl(written & 0xFFFFFFFF))
                wr.set_wr_rdma(peer["rkey"], peer["addr"] + slot * size)
                qp.post_send(wr)
                written += 1
            for wc in poll(cq, clock, errors):
                if wc.opcode == e.IBV_WC_RECV:
                    acked += 1
                    qp.post_recv(RecvWR(wr_id=wc.wr_id, num_sge=1, sg=side["scratch"]))
        if not errors:  # every block acknowledged: the end
            wr = SendWR(wr_id=END, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=side["scratch"],
                        imm_data=socket.htonl(END))
            wr.set_wr_rdma(peer["rkey"], peer["addr"])
            qp.post_send(wr)
            while not any(wc.wr_id == END for wc in poll(cq, clock, errors)) and not errors:
                pass
    except TimeoutError as err:
        errors.append({"timeout": str(err)})
    return {"role": "send", "blocks": acked, "stopped": bool(stopping), "errors": errors[:10], **clock.report()}


def main():
    mode, device, gid_index = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stopping = []  # (from the start: a SIGTERM during the set-up ends the stream at its first block)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    if mode == "recv":
        result = receive(device, gid_index, int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
                         sys.argv[7] if len(sys.argv) > 7 else None)
        wanted = int(sys.argv[5])
        ok = result["wrong"] is None and not result["errors"] and result["ended"] and wanted in (0, result["blocks"])
    else:
        result = send(device, gid_index, sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), stopping)
        ok = not result["errors"] and (result["blocks"] == int(sys.argv[6]) or result["stopped"])
    print(json.dumps(result))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
