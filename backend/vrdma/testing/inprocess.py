"""Hosts in process: the RoCE transport between backends with no sockets, no namespaces and no processes.

A ``LocalHost`` is what one backend is on one host, less its sockets: the C data engine (its network captured,
engine.h's vre_net_capture, and its clock fixed, vre_clock_set), the real device model of one VM (vrdma.device's
RdmaDevice, commands going straight into its ``execute``) and that VM's guest memory (a memfd mapped here, given to
the engine as the VM's memory table). A ``SimVerbs`` drives it through a ``LocalPort`` as the simulated guest driver
drives a backend process through vhost-user.

A ``Wire`` joins hosts: it polls their engines, takes the packets they sent, lets the test drop, duplicate, reorder
or hold them (a ``Link`` policy, or by hand), and gives each to the host holding its destination GID through
``Engine.roce_input``. Time moves only when the test moves it (``Wire.advance``, or ``Wire.run`` stepping to the
next timer when nothing is in flight), so retransmission and RNR timers run in microseconds of real time and the
same test takes the same steps every time.
"""

from __future__ import annotations

import ctypes
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from vrdma.device.device import RdmaDevice
from vrdma.device.fabric import Fabric
from vrdma.device.gid import gid_of_address as gid_of
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.engine.native import Engine, ffi, lib
from vrdma.testing.frontend import GuestMemory
from vrdma.testing.simulated_guest import SimCq, SimMr, SimQp, SimVerbs

START_NS = 1_000_000_000  # the fixed clock starts here (0 would mean CLOCK_MONOTONIC)
POLL_BUDGET = 64
AETH_SYNDROME_SHIFT = 24


@dataclass
class Packet:
    """A RoCE v2 packet between two GIDs: its UDP payload (BTH, extension headers, payload, ICRC) and its fields as
    the engine's own parser reads them."""

    data: bytes
    src: bytes
    dst: bytes
    opcode: int = 0
    psn: int = 0
    dest_qpn: int = 0
    aeth: int = 0
    ackreq: int = 0
    payload_len: int = 0
    sport: int = 4791  # its UDP source port (the ICRC covers it): the sending QP's (engine.h)

    @classmethod
    def parsed(cls, data: bytes, src: bytes, dst: bytes, sport: int = 4791) -> Packet:
        pkt = ffi.new("struct vre_roce_pkt *")
        err = lib.vre_roce_parse(data, len(data), _addr(src, dst, sport), pkt)
        if err:
            raise ValueError(f"not a RoCE v2 packet the engine parses ({err}): {data[:16].hex()}")
        return cls(data, src, dst, pkt.opcode, pkt.psn, pkt.dest_qpn, pkt.aeth, pkt.ackreq, pkt.payload_len, sport)

    @property
    def kind(self) -> str:
        """What the opcode says in a word (RC's and UC's low five bits)."""
        return OPCODE_KINDS.get(self.opcode & 0x1F, f"opcode {self.opcode:#x}")

    @property
    def syndrome(self) -> int:
        return self.aeth >> AETH_SYNDROME_SHIFT

    def __repr__(self) -> str:
        extra = f" syndrome {self.syndrome:#x}" if self.kind in ("ACK", "ATOMIC_ACK") else ""
        return f"<{self.kind} psn {self.psn} qpn {self.dest_qpn:#x}{extra} {self.payload_len} B>"


OPCODE_KINDS = {0x00: "SEND_FIRST", 0x01: "SEND_MIDDLE", 0x02: "SEND_LAST", 0x03: "SEND_LAST_IMM",
                0x04: "SEND_ONLY", 0x05: "SEND_ONLY_IMM", 0x06: "WRITE_FIRST", 0x07: "WRITE_MIDDLE",
                0x08: "WRITE_LAST", 0x09: "WRITE_LAST_IMM", 0x0A: "WRITE_ONLY", 0x0B: "WRITE_ONLY_IMM",
                0x0C: "READ_REQUEST", 0x0D: "READ_RESPONSE_FIRST", 0x0E: "READ_RESPONSE_MIDDLE",
                0x0F: "READ_RESPONSE_LAST", 0x10: "READ_RESPONSE_ONLY", 0x11: "ACK", 0x12: "ATOMIC_ACK",
                0x13: "CMP_SWAP", 0x14: "FETCH_ADD"}


def _addr(src: bytes, dst: bytes, sport: int = 4791) -> Any:
    return ffi.new("struct vre_roce_addr *", {"src": list(src), "dst": list(dst), "sport": sport, "dport": 4791,
                                               "ip_id": 0, "ip_frag": 0x4000})


def build(src: bytes, dst: bytes, **fields: int) -> Packet:
    """A packet built by the engine's own builder from ``fields`` of struct vre_roce_pkt (opcode, dest_qpn, psn,
    aeth, ...): what a peer, honest or not, could send."""
    payload = bytes(fields.pop("payload_len", 0))
    pkt = ffi.new("struct vre_roce_pkt *", {"pkey": 0xFFFF, **fields})
    buf = ffi.new("uint8_t[]", 9216)
    n = lib.vre_roce_build(buf, 9216, _addr(src, dst), pkt, payload, len(payload))
    if n < 0:
        raise ValueError(f"the engine builds no such packet ({n}): {fields}")
    return Packet.parsed(bytes(ffi.buffer(buf, n)), src, dst)


class LocalPort:
    """A SimVerbs' way to a device model in process (vrdma.testing.simulated_guest.DevicePort)."""

    def __init__(self, device: RdmaDevice, memory: GuestMemory) -> None:
        self.device = device
        self.memory = memory

    def command(self, request: bytes, response_size: int) -> bytes:
        return self.device.execute(request, response_size)

    def wake(self) -> None:
        """Nothing to kick: the test polls the engine itself."""


@dataclass
class Side:
    """One VM ready for RC traffic: a PD, a CQ, a QP on it, one MR (as tests/backend_process.SimSide)."""

    verbs: SimVerbs
    pd: int
    cq: SimCq
    qp: SimQp
    mr: SimMr

    def completions(self) -> list[Any]:
        return self.verbs.poll_cq(self.cq)


class LocalHost:
    """One backend on one host, in process: an engine with a captured network and a fixed clock, one VM's device
    model and guest memory, and a driver for it. A context manager: leaving it frees the engine, then the memory."""

    def __init__(self, address: str, memory_size: int = 16 << 20) -> None:
        self.address = address
        self.gid = gid_of(address)
        self.engine = Engine(1)
        self.engine.capture_network()
        self.now = START_NS
        self.engine.set_clock(self.now)
        self.fabric = Fabric(self.engine, 1, DEFAULT_LIMITS)
        self.device = RdmaDevice(f"vm@{address}", fabric=self.fabric)
        self.memory = GuestMemory(memory_size)
        self._view = ctypes.c_char.from_buffer(self.memory.map)
        self.device.set_memory([(0, memory_size, ctypes.addressof(self._view))])
        self.port = LocalPort(self.device, self.memory)
        self.verbs = SimVerbs(self.port, self.device.doorbells)
        self.verbs.add_gid(0, self.gid)

    def __enter__(self) -> LocalHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.device.close()
        del self.engine, self.fabric  # the engine goes first: it must not outlive the memory it maps
        del self._view
        self.memory.close()

    def side(self, mr_size: int = 1 << 20, depth: int = 64, cq_entries: int = 256, qp_type: str = "RC") -> Side:
        pd = self.verbs.alloc_pd()
        cq = self.verbs.create_cq(cq_entries)
        qp = self.verbs.create_qp(pd, cq, cq, depth=depth, qp_type=qp_type)
        return Side(self.verbs, pd, cq, qp, self.verbs.reg_mr(pd, mr_size))

    def set_clock(self, now_ns: int) -> None:
        self.now = now_ns
        self.engine.set_clock(now_ns)

    def poll(self) -> int:
        """One pass of the engine (every send queue, READ responses owed, timers) and its events delivered."""
        work = self.engine.poll(POLL_BUDGET)
        for event in self.engine.take_events():
            self.device.post_event(event.type, handle=event.handle, data=event.data)
        return work

    def sent(self) -> list[Packet]:
        return [Packet.parsed(data, src, dst, sport) for data, src, dst, sport in self.engine.take_packets()]

    def deliver(self, packet: Packet) -> int:
        """Give the engine one packet as if it had arrived: 0, or the negative reason it was refused."""
        reason = self.engine.roce_input(packet.data, packet.src, packet.dst, packet.sport)
        self.engine.check()
        return reason

    def roce(self) -> dict[str, int]:
        return self.engine.roce_counters(0)

    def qp_state(self, side: Side) -> int:
        return int(self.verbs.query_qp(side.qp).qp_state)


@dataclass
class LocalVm:
    """One VM of a LocalVms: its device model, guest memory, driver and GID."""

    name: str
    gid: bytes
    device: RdmaDevice
    memory: GuestMemory
    verbs: SimVerbs
    view: Any

    @property
    def dev(self) -> int:
        return self.device.engine_index

    def side(self, mr_size: int = 1 << 20, depth: int = 64, cq_entries: int = 256) -> Side:
        pd = self.verbs.alloc_pd()
        cq = self.verbs.create_cq(cq_entries)
        qp = self.verbs.create_qp(pd, cq, cq, depth=depth)
        return Side(self.verbs, pd, cq, qp, self.verbs.reg_mr(pd, mr_size))


class LocalVms:
    """Several VMs on one backend, in process: one engine (fixed clock, no network) and its fabric, each VM a real
    device model with guest memory of its own, as the daemon serves them (tests of how the engine shares itself).
    The test polls the engine (``poll``) and moves the clock (``advance``). A context manager."""

    def __init__(self, count: int, memory_size: int = 16 << 20) -> None:
        self.engine = Engine(count)
        self.now = START_NS
        self.engine.set_clock(self.now)
        self.fabric = Fabric(self.engine, count, DEFAULT_LIMITS)
        self.vms: list[LocalVm] = []
        for i in range(count):
            device = RdmaDevice(f"vm{i}", fabric=self.fabric)
            memory = GuestMemory(memory_size)
            view = ctypes.c_char.from_buffer(memory.map)
            device.set_memory([(0, memory_size, ctypes.addressof(view))])
            verbs = SimVerbs(LocalPort(device, memory), device.doorbells)
            gid = gid_of(f"10.98.0.{i + 1}")
            verbs.add_gid(0, gid)
            self.vms.append(LocalVm(f"vm{i}", gid, device, memory, verbs, view))

    def __enter__(self) -> LocalVms:
        return self

    def __exit__(self, *exc: object) -> None:
        for vm in self.vms:
            vm.device.close()
        del self.engine, self.fabric  # the engine goes first: it must not outlive the memory it maps
        for vm in self.vms:
            del vm.view
            vm.memory.close()

    def connect(self, a: LocalVm, qa: SimQp, b: LocalVm, qb: SimQp) -> None:
        """Two RC QPs to RTS, each aimed at the other."""
        a.verbs.connect(qa, qb.qpn, b.gid)
        b.verbs.connect(qb, qa.qpn, a.gid)

    def pair(self, a: LocalVm, b: LocalVm, mr_size: int = 1 << 20, depth: int = 64) -> tuple[Side, Side]:
        """A Side on each of two VMs (CQs of 1,024 entries), their QPs connected to each other."""
        sa, sb = a.side(mr_size, depth=depth, cq_entries=1024), b.side(mr_size, depth=depth, cq_entries=1024)
        self.connect(a, sa.qp, b, sb.qp)
        return sa, sb

    def poll(self) -> int:
        """One pass of the engine (every device's turn) and its events delivered."""
        work = self.engine.poll(POLL_BUDGET)
        for event in self.engine.take_events():
            self.vms[event.device].device.post_event(event.type, handle=event.handle, data=event.data)
        self.engine.check()
        return work

    def advance(self, ns: int) -> None:
        self.now += ns
        self.engine.set_clock(self.now)


# What the wire does with one packet: deliver it as it is (a list of one), lose it (empty) or more than once.
Policy = Callable[[Packet], list[Packet]]


@dataclass
class Link:
    """A seeded impaired link: each packet is lost, duplicated or held back behind the next with these chances."""

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    seed: int = 1
    counts: dict[str, int] = field(default_factory=lambda: {"lost": 0, "duplicated": 0, "reordered": 0})

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._held: Packet | None = None

    def __call__(self, packet: Packet) -> list[Packet]:
        draw = self._random.random()
        if draw < self.loss:
            self.counts["lost"] += 1
            return []
        out = [packet, packet] if draw < self.loss + self.duplicate else [packet]
        self.counts["duplicated"] += len(out) - 1
        if self._held is not None:
            out.append(self._held)  # the one held back arrives after this one
            self._held = None
        elif self._random.random() < self.reorder:
            self.counts["reordered"] += 1
            self._held = packet
            return out[1:]
        return out

    def flush(self) -> list[Packet]:
        held, self._held = self._held, None
        return [held] if held else []


@dataclass
class LoseOnce:
    """Loses the first packet of ``kind`` (at ``psn``, when given) and passes every other; ``lost`` holds it."""

    kind: str
    psn: int | None = None
    lost: list[Packet] = field(default_factory=list)

    def __call__(self, packet: Packet) -> list[Packet]:
        if not self.lost and packet.kind == self.kind and self.psn in (None, packet.psn):
            self.lost.append(packet)
            return []
        return [packet]


class Wire:
    """Hosts joined by one network the test controls. ``log`` keeps every packet the hosts sent, in order."""

    def __init__(self, hosts: Iterable[LocalHost], policy: Policy | None = None) -> None:
        self.hosts = list(hosts)
        self.policy = policy
        self.log: list[Packet] = []
        self.work = 0

    def host_of(self, gid: bytes) -> LocalHost | None:
        return next((h for h in self.hosts if h.gid == gid), None)

    def collect(self) -> list[Packet]:
        """Poll every host once and take what each sent (not delivered yet); every QP's transport state is held to
        its invariants before and after. ``work`` is what the engines did (WQEs, packets, flushes)."""
        out: list[Packet] = []
        self.work = 0
        for host in self.hosts:
            host.engine.check()
            self.work += host.poll()
            host.engine.check()
            out += host.sent()
        self.log += out
        return out

    def deliver(self, packets: Iterable[Packet]) -> None:
        for packet in packets:
            host = self.host_of(packet.dst)
            if host is not None:
                host.deliver(packet)

    def step(self) -> int:
        """One round: poll, take, apply the policy, deliver. What happened: packets sent and work done."""
        sent = self.collect()
        for packet in sent:
            self.deliver(self.policy(packet) if self.policy else [packet])
        return len(sent) + self.work

    def advance(self, ns: int) -> None:
        """Move every host's clock forward by ``ns``."""
        for host in self.hosts:
            host.set_clock(host.now + ns)

    def next_deadline(self) -> int | None:
        deadlines = [d for h in self.hosts if (d := h.engine.next_deadline_ns()) is not None]
        return min(deadlines) if deadlines else None

    def run(self, until: Callable[[], bool], max_steps: int = 10_000) -> int:
        """Step until ``until()`` holds; when a round sends nothing, jump the clocks to the next timer (a
        retransmission or an RNR wait). Fails after ``max_steps`` rounds or when nothing is left to happen: the
        steps it took otherwise."""
        for steps in range(max_steps):
            if until():
                return steps
            if self.step():
                continue
            flush = getattr(self.policy, "flush", None)
            held = flush() if flush else []
            if held:
                self.deliver(held)
                continue
            deadline = self.next_deadline()
            if deadline is None:
                raise AssertionError(f"stalled after {steps} steps: nothing in flight, no timer armed")
            self.advance(max(1, deadline - max(h.now for h in self.hosts)))
        raise AssertionError(f"not done after {max_steps} steps")


def connect(a: Side, a_host: LocalHost, b: Side, b_host: LocalHost, **attrs: Any) -> None:
    """Both QPs to RTS, each aimed at the other across the wire."""
    a.verbs.connect(a.qp, b.qp.qpn, b_host.gid, **attrs)
    b.verbs.connect(b.qp, a.qp.qpn, a_host.gid, **attrs)


@contextmanager
def two_hosts(memory_size: int = 16 << 20, **connect_attrs: Any) -> Iterator[tuple[LocalHost, Side, LocalHost, Side]]:
    """Host a (10.0.0.1) and host b (10.0.0.2), one VM each with an RC QP connected to the other's."""
    with ExitStack() as stack:
        a_host = stack.enter_context(LocalHost("10.0.0.1", memory_size))
        b_host = stack.enter_context(LocalHost("10.0.0.2", memory_size))
        a, b = a_host.side(), b_host.side()
        connect(a, a_host, b, b_host, **connect_attrs)
        yield a_host, a, b_host, b

