"""A user-space Ethernet switch between the fabric's hosts that loses, duplicates, delays and reorders IP frames by
a seeded schedule: what tc netem does on a real host, for a machine whose kernel has no sch_netem (docs/interhost.md),
and reproducible (the same seed, the same faults in the same order of frames).

It runs in the fabric's switch namespace, one AF_PACKET socket per port (the switch ends of the hosts' veth
pairs), learns which port each source MAC address lives behind, forwards unicast frames there and floods the rest.
Only IPv4 and IPv6 frames are impaired: ARP and the like pass, so that the fault under test is the one on the
traffic, not a host that never learns its neighbour. Frames the switch sends itself come back on its sockets as
outgoing and are ignored.

Run as ``python -m vrdma.harness.impair --port port0 --port port1 [--loss P] [--duplicate P] [--reorder P]
[--delay-ms MS] [--seed N]`` (vrdma.harness.hosts.HostNetwork does it); it prints ``ready`` once its sockets are bound
and stops on SIGTERM, printing what it did as one line, ``counters {"passed": ..., "lost": ..., "duplicated": ...,
"reordered": ...}`` (JSON: IP frames forwarded, dropped, sent twice, held back). A reordered frame is held 5 ms
longer than the others, so the frames after it overtake it.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import random
import selectors
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
IP_ETHERTYPES = (b"\x08\x00", b"\x86\xdd")
MAX_FRAME = 65536
REORDER_MS = 5.0


@dataclass(frozen=True)
class Impairment:
    loss: float = 0.0         # probability that an IP frame is dropped
    duplicate: float = 0.0    # ... sent twice
    reorder: float = 0.0      # ... held back REORDER_MS longer than the others, which overtake it
    delay_ms: float = 0.0     # every IP frame held this long
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} {value} is not a probability (0 to 1)")
        if self.delay_ms < 0:
            raise ValueError(f"delay {self.delay_ms} ms is negative")

    def argv(self) -> list[str]:
        return ["--loss", str(self.loss), "--duplicate", str(self.duplicate), "--reorder", str(self.reorder),
                "--delay-ms", str(self.delay_ms), "--seed", str(self.seed)]


class Switch:
    def __init__(self, ports: Sequence[str], impairment: Impairment) -> None:
        self.impairment = impairment
        self.rng = random.Random(impairment.seed)
        self.socks: dict[str, socket.socket] = {}
        self.where: dict[bytes, str] = {}
        self.pending: list[tuple[float, int, str, bytes]] = []  # (due, order, in port, frame)
        self.order = 0
        self.counters = {"passed": 0, "lost": 0, "duplicated": 0, "reordered": 0}  # IP frames
        for port in ports:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.bind((port, 0))
            sock.setblocking(False)
            self.socks[port] = sock

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()

    def forward(self, in_port: str, frame: bytes) -> None:
        """Send a frame on: to the port its destination lives behind, or to every other port."""
        self.where[frame[6:12]] = in_port
        out = self.where.get(frame[0:6]) if not frame[0] & 1 else None
        for port in ([out] if out and out != in_port else [p for p in self.socks if p != in_port]):
            with contextlib.suppress(OSError):  # a full queue or a port gone down: lost, as on a wire
                self.socks[port].send(frame)

    def take(self, in_port: str, frame: bytes, now: float) -> None:
        """A frame arrived: pass it, or impair it (IP frames only)."""
        imp = self.impairment
        if frame[12:14] not in IP_ETHERTYPES:
            self.forward(in_port, frame)
            return
        if self.rng.random() < imp.loss:
            self.counters["lost"] += 1
            return
        copies = 2 if self.rng.random() < imp.duplicate else 1
        late = REORDER_MS if self.rng.random() < imp.reorder else 0.0
        self.counters["passed"] += 1
        self.counters["duplicated"] += copies - 1
        self.counters["reordered"] += late > 0
        for _ in range(copies):
            self.order += 1
            due = now + (imp.delay_ms + late) / 1000
            heapq.heappush(self.pending, (due, self.order, in_port, frame))

    def release(self, now: float) -> float | None:
        """Send what is due; the seconds until the next frame is, or None."""
        while self.pending and self.pending[0][0] <= now:
            _, _, in_port, frame = heapq.heappop(self.pending)
            self.forward(in_port, frame)
        return max(0.0, self.pending[0][0] - now) if self.pending else None

    def serve(self, stopping: list[bool]) -> None:
        selector = selectors.DefaultSelector()
        for port, sock in self.socks.items():
            selector.register(sock, selectors.EVENT_READ, port)
        timeout: float | None = None
        while not stopping:
            for key, _ in selector.select(timeout):
                port = key.data
                while True:
                    try:
                        frame, address = self.socks[port].recvfrom(MAX_FRAME)
                    except BlockingIOError:
                        break
                    if address[2] != PACKET_OUTGOING:
                        self.take(port, frame, time.monotonic())
            timeout = self.release(time.monotonic())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vrdma.harness.impair", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", action="append", required=True, help="a switch port (interface) to serve")
    parser.add_argument("--loss", type=float, default=0.0, help="probability that an IP frame is dropped")
    parser.add_argument("--duplicate", type=float, default=0.0, help="probability that an IP frame is sent twice")
    parser.add_argument("--reorder", type=float, default=0.0,
                        help="probability that an IP frame goes out after the next one")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="delay of every IP frame (ms)")
    parser.add_argument("--seed", type=int, default=0, help="the schedule's seed")
    args = parser.parse_args(argv)
    try:
        impairment = Impairment(args.loss, args.duplicate, args.reorder, args.delay_ms, args.seed)
    except ValueError as err:
        parser.error(str(err))
    stopping: list[bool] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(True)
        raise SystemExit(0)  # out of select(), which a handler that returns would only resume

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    switch = Switch(args.port, impairment)
    try:
        print("ready", flush=True)
        switch.serve(stopping)
    finally:
        switch.close()
        print(f"counters {json.dumps(switch.counters)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
