"""The RoCE fuzzer's seed corpus: the in-process RoCE tests' scenarios (tests/unit/test_roce_inprocess.py) written in
roce_fuzz.c's input format, so that the fuzzer starts from traffic that reaches every part of the transport.

``python -m fuzz.roce.seeds`` writes fuzz/corpus/roce/seed-*. Each scenario is a header (the path both hosts'
QPs are connected with) and operations, one byte each and their operands, as roce_fuzz.c reads them.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "corpus" / "roce"

# Operation bytes (roce_fuzz.c's ops[]: op = byte % 10).
POST_SEND, POST_RECV, POLL, MIGRATE, NETWORK, FORGE, TICK = 0, 2, 3, 4, 5, 8, 9
# The opcodes' indexes in rc_opcodes[].
WRITE, WRITE_IMM, SEND, SEND_IMM, READ, CMP_SWAP, FETCH_ADD = range(7)
# How the network treats the packets in flight (low three bits).
DELIVER, LOSE, DUPLICATE, HOLD_BACK, SWAP, ALL = 0, 3, 4, 5, 6, 7


class Scenario:
    def __init__(self, mtu: int = 3, psn: tuple[int, int, int, int] = (0, 100, 5000, 0xFFFFF0), rd_atomic: int = 4,
                 timeout: int = 10, retry_cnt: int = 7, rnr_retry: int = 6, min_rnr_timer: int = 1,
                 uc: bool = False) -> None:
        self.data = bytearray([2 if uc else 0, (mtu - 1) % 5])
        for value in psn:
            self.data += struct.pack("<I", value)
        self.data += bytes([rd_atomic - 1, timeout - 1, retry_cnt, rnr_retry, min_rnr_timer])

    @staticmethod
    def _range(offset: int, length: int) -> bytes:
        """mr_range: a length over 255 is read as 16 bits (flag 1)."""
        if length > 255:
            return bytes([1]) + struct.pack("<H", length) + struct.pack("<I", offset)
        return bytes([0, length]) + struct.pack("<I", offset)

    def send(self, host: int, qp: int, wqes: list[tuple[int, int, int, int]], fence: bool = False) -> Scenario:
        """Up to four WQEs (opcode, local offset, length, remote offset) on a host's QP, and the doorbell."""
        self.data += bytes([POST_SEND, host | qp << 1, 1 if fence else 0, len(wqes) - 1])
        for opcode, offset, length, remote in wqes:
            self.data += bytes([opcode]) + struct.pack("<I", 0x1234) + self._range(offset, length) + \
                self._range(remote, length)
            if opcode in (CMP_SWAP, FETCH_ADD):
                self.data += bytes([5, 9])
        return self

    def recv(self, host: int, qp: int, count: int = 1, length: int = 16000) -> Scenario:
        self.data += bytes([POST_RECV, host | qp << 1, count - 1])
        for k in range(count):
            self.data += self._range(0x20000 + k * 0x1000, length)
        return self

    def poll(self, host: int) -> Scenario:
        self.data += bytes([POLL, host])
        return self

    def net(self, how: int, count: int = 1) -> Scenario:
        self.data += bytes([NETWORK, how | (count - 1) << 3])
        return self

    def forge(self, how: int, what: int, pick: int, *operands: int) -> Scenario:
        self.data += bytes([FORGE, how, what, pick, *operands])
        return self

    def migrate(self, host: int, reload: bool = True) -> Scenario:
        """The host's VM saved and, with ``reload``, loaded into its device reopened (else resumed as it was)."""
        self.data += bytes([MIGRATE, host, 1 if reload else 0])
        return self

    def tick(self, to_timer: bool = True, micros: int = 0) -> Scenario:
        self.data += bytes([TICK, 1 if to_timer else (micros << 1) & 0xFE])
        return self

    def rounds(self, n: int, how: int = ALL) -> Scenario:
        """n rounds of both hosts polling and the network carrying what they sent."""
        for _ in range(n):
            self.poll(0).poll(1).net(how)
        return self


def every_operation() -> Scenario:
    s = Scenario().recv(1, 0, 2).recv(0, 0, 2)
    s.send(0, 0, [(SEND, 0, 10000, 0), (WRITE, 0, 10000, 0x8000), (READ, 0x10000, 5000, 0x8000),
                  (FETCH_ADD, 0x18000, 8, 0x100)])
    s.send(1, 0, [(SEND_IMM, 0, 64, 0), (WRITE_IMM, 0, 3000, 0x4000), (CMP_SWAP, 0x18000, 8, 0x100)])
    return s.rounds(12)


def lossy(how: int) -> Scenario:
    s = Scenario(mtu=1).recv(1, 0, 1)
    s.send(0, 0, [(WRITE, 0, 4000, 0x8000), (SEND, 0, 3000, 0), (READ, 0x10000, 4000, 0x8000)])
    for _ in range(6):
        s.poll(0).poll(1).net(DELIVER).net(how).net(DELIVER, 4)
    for _ in range(6):
        s.tick().rounds(3)
    return s


def the_stall() -> Scenario:
    """A WRITE, then a READ; the responder's answers held while a duplicate's ACK overtakes them."""
    s = Scenario(rd_atomic=1)
    s.send(0, 0, [(WRITE, 0, 64, 0x20000), (READ, 0x10000, 4096, 0x8000)])
    s.poll(0).net(DELIVER, 2).poll(1).net(HOLD_BACK, 5)
    s.forge(0, 7, 0)  # the WRITE again, as a duplicate
    s.rounds(4)
    s.send(0, 0, [(READ, 0x10000, 2048, 0x8000), (FETCH_ADD, 0x18000, 8, 0x100)])
    return s.rounds(8)


def rnr() -> Scenario:
    s = Scenario(rnr_retry=2, min_rnr_timer=1)
    s.send(0, 0, [(SEND, 0, 300, 0)])
    for _ in range(3):
        s.rounds(2).tick()
    return s.recv(1, 0, 1).rounds(4)


def wrap_and_uc() -> Scenario:
    s = Scenario(psn=(0xFFFFFE, 0xFFFFFD, 0xFFFFF8, 0xFFFFFF), uc=True, mtu=1).recv(1, 1, 2)
    s.send(0, 1, [(SEND, 0, 2000, 0), (WRITE_IMM, 0, 1500, 0x8000)])
    s.send(0, 0, [(WRITE, 0, 3000, 0x8000), (READ, 0x10000, 3000, 0x8000)])
    return s.rounds(10, how=DELIVER)


def retries_run_out() -> Scenario:
    s = Scenario(retry_cnt=2, timeout=3)
    s.send(0, 0, [(WRITE, 0, 100, 0), (SEND, 0, 100, 0)])
    for _ in range(5):
        s.poll(0).poll(1).net(LOSE).tick()
    return s


def forged() -> Scenario:
    s = Scenario()
    s.send(0, 0, [(WRITE, 0, 3000, 0x8000), (READ, 0x10000, 2000, 0)])
    s.poll(0)
    for what in range(8):
        s.forge(0, what, what, 3, 0x10, 0, 0, 0)
        s.forge(4, what, what, 7, 0, 0x55)
    return s.rounds(8)


def migrated() -> Scenario:
    """Every operation in flight, half of it delivered, then each host's VM saved and loaded (the responder's with
    packets dropped while it was away), and the transport making up for it."""
    s = Scenario(mtu=1).recv(1, 0, 2)
    s.send(0, 0, [(SEND, 0, 3000, 0), (WRITE, 0, 3000, 0x8000), (READ, 0x10000, 3000, 0x8000),
                  (FETCH_ADD, 0x18000, 8, 0x100)])
    s.poll(0).net(DELIVER, 3).migrate(1).net(DELIVER, 4).poll(1).migrate(0).rounds(3)
    s.migrate(1, reload=False)
    for _ in range(4):
        s.tick().rounds(3)
    return s


SCENARIOS = {"every-operation": every_operation, "migrated": migrated, "loss": lambda: lossy(LOSE),
             "duplication": lambda: lossy(DUPLICATE), "reordering": lambda: lossy(SWAP),
             "held-back": lambda: lossy(HOLD_BACK), "duplicate-ack-overtakes-a-read": the_stall, "rnr": rnr,
             "psn-wrap-and-uc": wrap_and_uc, "retries-run-out": retries_run_out, "forged": forged}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, make in SCENARIOS.items():
        (OUT / f"seed-{name}").write_bytes(bytes(make().data))
    print(f"{len(SCENARIOS)} seeds in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
