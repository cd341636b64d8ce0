"""The C data engine through cffi (engine.h): the device's hot loop, driven by the device model.

See engine.h for what the engine owns and trusts, and vrdma.engine.api for the typed interface the model is
written against. This wrapper turns the engine's return codes into EngineError with the engine's own message, and
its structs into plain Python values.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from vrdma.engine.api import (
    COUNTERS,
    MAX_GIDS,
    MAX_REGIONS,
    MAX_THREADS,
    NET_COUNTERS,
    NO_DEVICE,
    NO_SRQ,
    QOS_COUNTERS,
    QP_COUNTERS,
    QP_GSI,
    QP_KERNEL,
    QP_UC,
    QP_UD,
    QP_XRC_INI,
    QP_XRC_TGT,
    ROCE_COUNTERS,
    SRQ_KERNEL,
    THREAD_STATS,
    CqConfig,
    EngineError,
    EngineEvent,
    EngineLimits,
    MrConfig,
    QosConfig,
    QpAttr,
    QpConfig,
    SchedConfig,
    SrqConfig,
)

try:
    from vrdma.engine._engine import ffi, lib
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("the data engine is not built: run `make backend` "
                      "(python backend/vrdma/engine/_build.py)") from err

__all__ = ["COUNTERS", "NO_DEVICE", "NO_SRQ", "Engine", "EngineError", "EngineEvent", "ffi", "lib"]

# The typed interface declares engine.h's sentinels without importing C: hold the two equal.
assert (NO_DEVICE, NO_SRQ, QP_KERNEL, QP_UD, QP_GSI, QP_UC, QP_XRC_INI, QP_XRC_TGT, SRQ_KERNEL, MAX_GIDS,
        MAX_THREADS, MAX_REGIONS) == \
    (lib.VRE_NO_DEVICE, lib.VRE_NO_SRQ, lib.VRE_QP_KERNEL, lib.VRE_QP_UD, lib.VRE_QP_GSI, lib.VRE_QP_UC,
     lib.VRE_QP_XRC_INI, lib.VRE_QP_XRC_TGT, lib.VRE_SRQ_KERNEL, lib.VRE_MAX_GIDS, lib.VRE_MAX_THREADS,
     lib.VRE_MAX_REGIONS), \
    "vrdma.engine.api disagrees with engine.h"
EVENT_BATCH = 256
PACKET_ROOM = 9216  # the largest UDP payload a RoCE packet has (a jumbo frame's)


def _free(raw: Any) -> None:
    lib.vre_thread_stop(raw)  # its thread first, if it was started: it runs on this memory
    lib.vre_engine_free(raw)


class Engine:
    """The C data engine (a vrdma.engine.api.DataEngine). Every method but the threads' own takes a lock of the
    engine's (engine.h): the device's for a method about one device (its first argument, ``dev``), every lock for the
    others; with the engine's threads running, a call waits for at most the turn in progress."""

    def __init__(self, max_devices: int) -> None:
        raw = lib.vre_engine_new(max_devices)
        if raw == ffi.NULL:
            raise MemoryError("cannot allocate the data engine")
        self._e = ffi.gc(raw, _free)
        self._events = ffi.new("struct vre_event[]", EVENT_BATCH)
        self._events_fd = -1
        self.threads = 0

    # -- the engine's threads (the daemon's; in-process tests poll the engine themselves) --------------------------

    @property
    def threaded(self) -> bool:
        return self.threads > 0

    def start_threads(self, count: int, budget: int, park_after_ns: int, cpus: list[int] | None = None) -> int:
        """Run the data path in ``count`` threads of the engine's own from now on (thread i on CPU cpus[i], if
        given); return the eventfd they make readable when events wait for take_events (the caller watches it and
        drains it before taking them). The network must be attached before."""
        if not 1 <= count <= MAX_THREADS:
            raise EngineError(f"engine threads: {count} is not 1 to {MAX_THREADS}", errno.EINVAL)
        pinned = list(cpus or [])
        if pinned and len(pinned) != count:
            raise EngineError(f"engine threads: {count} threads but {len(pinned)} CPUs", errno.EINVAL)
        self._events_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        config = ffi.new("struct vre_thread_config *", {"budget": budget, "threads": count,
                                                          "park_after_ns": park_after_ns,
                                                          "events_fd": self._events_fd})
        for i in range(MAX_THREADS):
            config.cpus[i] = pinned[i] if i < len(pinned) else -1
        ret = lib.vre_thread_start(self._e, config)
        if ret < 0:
            os.close(self._events_fd)
            self._events_fd = -1
            self._check(ret)
        self.threads = count
        return self._events_fd

    def stop_threads(self) -> None:
        """The threads finish their passes and end (the caller polls from now on). Never under a lock."""
        lib.vre_thread_stop(self._e)
        if self._events_fd >= 0:
            os.close(self._events_fd)
            self._events_fd = -1
        self.threads = 0

    def kick(self, dev: int = NO_DEVICE) -> None:
        """Wake the parked engine thread that runs ``dev`` (a guest's wake-up, a change of its deadlines), or every
        thread."""
        lib.vre_kick(self._e, dev)

    @contextlib.contextmanager
    def paused(self, dev: int = NO_DEVICE) -> Iterator[None]:
        """Hold device ``dev`` (every device, by default) between turns: no engine thread touches its guest memory
        until this ends (calls made meanwhile are fine: the locks are recursive)."""
        lib.vre_lock_device(self._e, dev)
        try:
            yield
        finally:
            lib.vre_unlock_device(self._e, dev)

    def set_recheck(self, period_ns: int) -> None:
        """While parked, look at the doorbells at least this often unwoken (0: only when woken)."""
        lib.vre_thread_recheck(self._e, period_ns)

    def thread_stats(self, thread: int | None = None) -> dict[str, int]:
        """What the threads did, summed, or what thread ``thread`` did (api.THREAD_STATS)."""
        out = ffi.new("struct vre_thread_stats *")
        if lib.vre_thread_stats(self._e, MAX_THREADS if thread is None else thread, out) < 0:
            raise EngineError(f"no engine thread {thread}", errno.ENOENT)
        return {name: int(getattr(out, name)) for name in THREAD_STATS}

    def device_owner(self, dev: int) -> int | None:
        """The engine thread that runs device ``dev`` now (None: no threads, or no such device)."""
        owner = int(lib.vre_device_owner(self._e, dev))
        return owner if owner >= 0 else None

    def _check(self, ret: int) -> int:
        if ret < 0:
            raise EngineError(ffi.string(lib.vre_error(self._e)).decode(errors="replace"), -ret)
        return ret

    # -- devices ------------------------------------------------------------------------------------------------

    def open_device(self, dev: int, limits: EngineLimits, doorbell_base: int) -> None:
        self._check(lib.vre_device_open(self._e, dev, ffi.new("struct vre_device_limits *", limits),
                                        doorbell_base))

    def close_device(self, dev: int) -> None:
        lib.vre_device_close(self._e, dev)

    def set_gid(self, dev: int, index: int, raw: bytes, gid_type: int) -> None:
        self._check(lib.vre_gid_set(self._e, dev, index, raw, gid_type))

    def route_gid(self, raw: bytes) -> int:
        """The device holding GID ``raw`` (16 bytes), or NO_DEVICE: the engine's GID index, the only routing table."""
        return int(lib.vre_gid_route(self._e, raw))

    def set_memory(self, dev: int, regions: list[tuple[int, int, int]]) -> None:
        table = ffi.new("struct vre_region[]", [{"gpa": g, "size": s, "hva": h} for g, s, h in regions] or 1)
        self._check(lib.vre_device_set_memory(self._e, dev, table, len(regions)))

    def set_dirty_log(self, dev: int, address: int, size: int) -> None:
        self._check(lib.vre_device_set_log(self._e, dev, address, size))

    def set_page_window(self, dev: int, lo: int, hi: int) -> None:
        """The device addresses page lists may name, [lo, hi]: (0, 2**64 - 1) is all of the memory table."""
        self._check(lib.vre_device_page_window(self._e, dev, lo, hi))

    def set_wake_fd(self, dev: int, fd: int) -> None:
        """Device ``dev``'s wake-up eventfd (its guest's wake queue's kick, -1: none): the parked thread that runs it
        watches a duplicate (never reads it)."""
        self._check(lib.vre_device_wake_fd(self._e, dev, fd))

    # -- a device's state (state.c: what a live migration or an upgrade carries) --------------------------------

    def suspend_device(self, dev: int, suspended: bool) -> None:
        self._check(lib.vre_device_suspend(self._e, dev, int(suspended)))

    def save_device(self, dev: int) -> bytes:
        size = self._check(lib.vre_device_save(self._e, dev, ffi.NULL, 0))
        buf = ffi.new("uint8_t[]", size)
        self._check(lib.vre_device_save(self._e, dev, buf, size))
        return bytes(ffi.buffer(buf, size))

    def load_device(self, dev: int, state: bytes, check_only: bool = False) -> None:
        self._check(lib.vre_device_load(self._e, dev, state, len(state), lib.VRE_LOAD_CHECK if check_only else 0))

    def reroute_device(self, source: int, target: int) -> None:
        self._check(lib.vre_device_reroute(self._e, source, target))

    def state_objects(self, state: bytes) -> list[tuple[str, int, dict[str, int]]]:
        kinds = {lib.VRE_STATE_MR: ("mr", "struct vre_state_mr"), lib.VRE_STATE_CQ: ("cq", "struct vre_state_cq"),
                 lib.VRE_STATE_SRQ: ("srq", "struct vre_state_srq"), lib.VRE_STATE_QP: ("qp", "struct vre_state_qp")}
        record = ffi.sizeof("struct vre_state_record")
        objects, at = [], ffi.sizeof("struct vre_state_header")
        while at + record <= len(state):
            rec = ffi.new("struct vre_state_record *")
            ffi.memmove(rec, state[at:at + record], record)
            kind, struct = kinds[rec.kind]
            body = ffi.new(f"{struct} *")
            ffi.memmove(body, state[at + record:at + record + ffi.sizeof(struct)], ffi.sizeof(struct))
            cfg = body.cfg
            objects.append((kind, int(rec.slot), {name: int(getattr(cfg, name)) for name, _ in ffi.typeof(cfg).fields
                                                  if ffi.typeof(cfg).fields and name not in ("pages", "ring")}))
            at += int(rec.bytes)
        return objects

    def counters(self, dev: int) -> dict[str, int]:
        out = ffi.new("struct vre_counters *")
        lib.vre_device_counters(self._e, dev, out)
        return {name: int(getattr(out, name)) for name in COUNTERS}

    def roce_counters(self, dev: int) -> dict[str, int]:
        out = ffi.new("struct vre_roce_counters *")
        lib.vre_device_roce_counters(self._e, dev, out)
        return {name: int(getattr(out, name)) for name in ROCE_COUNTERS}

    # -- sharing the engine -------------------------------------------------------------------------------------

    def set_schedule(self, sched: SchedConfig) -> None:
        self._check(lib.vre_sched_set(self._e, ffi.new("struct vre_sched *", sched)))

    def set_qos(self, dev: int, qos: QosConfig) -> None:
        self._check(lib.vre_device_qos(self._e, dev, ffi.new("struct vre_qos *", qos)))

    def qos_counters(self, dev: int) -> dict[str, int]:
        out = ffi.new("struct vre_qos_counters *")
        lib.vre_device_qos_counters(self._e, dev, out)
        return {name: int(getattr(out, name)) for name in QOS_COUNTERS}

    # -- the network (the daemon's: the device model never calls these) -------------------------------------

    def attach_network(self, rx_fds: Sequence[int], tx_fd: int, rx6_fds: Sequence[int] = (),
                       udp6_fd: int = -1) -> None:
        """Hand the engine its RoCE sockets (see engine.h, vre_net_attach: the receive sockets become its mapped
        rings, IPv6's as many as IPv4's or none); [], -1 takes them back."""
        fds = ffi.new("int[]", list(rx_fds)) if rx_fds else ffi.NULL
        fds6 = ffi.new("int[]", list(rx6_fds)) if rx6_fds else ffi.NULL
        if rx6_fds and len(rx6_fds) != len(rx_fds):
            raise ValueError(f"{len(rx6_fds)} IPv6 receive sockets for {len(rx_fds)} IPv4 ones")
        self._check(lib.vre_net_attach(self._e, fds, fds6, len(rx_fds), tx_fd, udp6_fd))

    def net_counters(self) -> dict[str, int]:
        out = ffi.new("struct vre_net_counters *")
        lib.vre_net_counters(self._e, out)
        return {name: int(getattr(out, name)) for name in NET_COUNTERS}

    def roce_input(self, udp_payload: bytes, src: bytes, dst: bytes, sport: int = 4791, ip_id: int = 0,
                   ip_frag: int = 0x4000) -> int:
        """Give the engine one packet as if it had arrived (tests and the fuzzer): 0 or the negative reason."""
        addr = ffi.new("struct vre_roce_addr *", {"src": list(src), "dst": list(dst), "sport": sport,
                                                   "dport": 4791, "ip_id": ip_id, "ip_frag": ip_frag})
        return int(lib.vre_roce_input(self._e, udp_payload, len(udp_payload), addr))

    def ip_input(self, ip_packet: bytes) -> int:
        """Give the engine one IP packet as its receive rings would (tests and the fuzzer): 0 or the negative
        reason (engine.h, vre_ip_input)."""
        return int(lib.vre_ip_input(self._e, ip_packet, len(ip_packet)))

    def capture_network(self) -> None:
        """A network without sockets (engine.h, vre_net_capture): what the engine sends waits for take_packets,
        and only roce_input brings packets in. For tests and fuzzers that play the other hosts in process."""
        self._check(lib.vre_net_capture(self._e))

    def take_packets(self) -> list[tuple[bytes, bytes, bytes, int]]:
        """Every packet waiting to go, oldest first: (UDP payload, source GID, destination GID, UDP source port)."""
        packets = []
        addr = ffi.new("struct vre_roce_addr *")
        buf = ffi.new("uint8_t[]", PACKET_ROOM)
        while n := int(lib.vre_net_take(self._e, buf, PACKET_ROOM, addr)):
            packets.append((bytes(ffi.buffer(buf, min(n, PACKET_ROOM))), bytes(addr.src), bytes(addr.dst),
                            int(addr.sport)))
        return packets

    def check(self) -> None:
        """Hold every QP's transport state to its invariants (engine.h, vre_check): EngineError names the first
        that does not hold."""
        self._check(lib.vre_check(self._e))

    def set_clock(self, now_ns: int) -> None:
        """Measure timers against a fixed time that only the caller moves (0: CLOCK_MONOTONIC again)."""
        lib.vre_clock_set(self._e, now_ns)

    # -- objects ------------------------------------------------------------------------------------------------

    def create_mr(self, dev: int, slot: int, config: MrConfig) -> None:
        self._check(lib.vre_mr_create(self._e, dev, slot, ffi.new("struct vre_mr_config *", config)))

    def rereg_mr(self, dev: int, slot: int, config: MrConfig) -> None:
        self._check(lib.vre_mr_rereg(self._e, dev, slot, ffi.new("struct vre_mr_config *", config)))

    def destroy_mr(self, dev: int, slot: int) -> None:
        lib.vre_mr_destroy(self._e, dev, slot)

    def create_cq(self, dev: int, slot: int, config: CqConfig) -> None:
        self._check(lib.vre_cq_create(self._e, dev, slot, ffi.new("struct vre_cq_config *", config)))

    def moderate_cq(self, dev: int, slot: int, count: int, period_us: int) -> None:
        self._check(lib.vre_cq_moderate(self._e, dev, slot, count, period_us))

    def destroy_cq(self, dev: int, slot: int) -> None:
        lib.vre_cq_destroy(self._e, dev, slot)

    def create_srq(self, dev: int, slot: int, config: SrqConfig) -> None:
        self._check(lib.vre_srq_create(self._e, dev, slot, ffi.new("struct vre_srq_config *", config)))

    def set_srq_limit(self, dev: int, slot: int, limit: int) -> None:
        self._check(lib.vre_srq_set_limit(self._e, dev, slot, limit))

    def srq_limit(self, dev: int, slot: int) -> int:
        return self._check(lib.vre_srq_limit(self._e, dev, slot))

    def destroy_srq(self, dev: int, slot: int) -> None:
        lib.vre_srq_destroy(self._e, dev, slot)

    def create_qp(self, dev: int, slot: int, config: QpConfig) -> None:
        self._check(lib.vre_qp_create(self._e, dev, slot, ffi.new("struct vre_qp_config *", config)))

    def modify_qp(self, dev: int, slot: int, attr: QpAttr) -> None:
        self._check(lib.vre_qp_modify(self._e, dev, slot, ffi.new("struct vre_qp_attr *", attr)))

    def qp_state(self, dev: int, slot: int) -> int:
        return self._check(lib.vre_qp_state(self._e, dev, slot))

    def qp_counters(self, dev: int, slot: int) -> dict[str, int]:
        out = ffi.new("struct vre_qp_counters *")
        self._check(lib.vre_qp_counters(self._e, dev, slot, out))
        return {name: int(getattr(out, name)) for name in QP_COUNTERS}

    def destroy_qp(self, dev: int, slot: int) -> None:
        lib.vre_qp_destroy(self._e, dev, slot)

    # -- the loop -----------------------------------------------------------------------------------------------

    def poll(self, budget: int) -> int:
        """Run every send queue once (up to ``budget`` WQEs each); return the work done."""
        return int(lib.vre_poll(self._e, budget))

    def spin(self, budget: int, spin_ns: int) -> int:
        """Poll repeatedly, in C, for ``spin_ns`` (less if events wait for delivery); return the work done."""
        return int(lib.vre_spin(self._e, budget, spin_ns))

    def take_events(self) -> list[EngineEvent]:
        events: list[EngineEvent] = []
        while True:
            n = lib.vre_take_events(self._e, self._events, EVENT_BATCH)
            events.extend(EngineEvent(int(ev.dev), int(ev.type), int(ev.handle), int(ev.data))
                          for ev in (self._events[i] for i in range(n)))
            if n < EVENT_BATCH:
                return events

    def next_deadline_ns(self) -> int | None:
        """CLOCK_MONOTONIC time of the earliest RNR retry, if a QP waits for one."""
        deadline = int(lib.vre_next_deadline(self._e))
        return None if deadline < 0 else deadline

    def park(self) -> bool:
        """Ask posters to wake the device from now on; False if work appeared meanwhile (not parked)."""
        return bool(lib.vre_park(self._e))

    def unpark(self) -> None:
        lib.vre_unpark(self._e)


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _under_lock(method: _Method) -> _Method:
    if list(inspect.signature(method).parameters)[1:2] == ["dev"] and method.__name__ not in _ENGINE_WIDE:
        @functools.wraps(method)
        def device_locked(self: Engine, dev: int, *args: Any, **kwargs: Any) -> Any:
            lib.vre_lock_device(self._e, dev)
            try:
                return method(self, dev, *args, **kwargs)
            finally:
                lib.vre_unlock_device(self._e, dev)
        return device_locked  # type: ignore[return-value]

    @functools.wraps(method)
    def locked(self: Engine, *args: Any, **kwargs: Any) -> Any:
        lib.vre_lock(self._e)
        try:
            return method(self, *args, **kwargs)
        finally:
            lib.vre_unlock(self._e)
    return locked  # type: ignore[return-value]


# Every call into the engine from the event loop's thread, under the lock of the device it is about (a method whose
# first argument is `dev`) or every lock; not the threads' own controls, nor take_events (the event ring has a lock
# of its own, engine.h), nor state_objects (it reads the bytes it is given, nothing of the engine). A device opened
# or closed, or a GID set, changes what every thread reads (the devices in use, the GID index every thread routes
# by): every lock, though they name a device.
_ENGINE_WIDE = {"open_device", "close_device", "set_gid"}
_UNLOCKED = {"start_threads", "stop_threads", "kick", "paused", "set_recheck", "thread_stats", "device_owner",
             "take_events", "threaded", "state_objects"}
for _name, _method in list(vars(Engine).items()):
    if callable(_method) and not _name.startswith("_") and _name not in _UNLOCKED:
        setattr(Engine, _name, _under_lock(_method))
