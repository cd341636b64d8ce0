"""The fabric: every RDMA device one backend process serves, joined by one data engine.

It routes connections (a QP's destination GID names a device: the VM that holds that GID), runs the engine's
polling and parking, and hands the engine's events to the device they belong to. Like the devices, it knows
nothing of sockets, file descriptors or virtqueues.

The engine runs either in a thread of its own (the daemon's: ``engine_thread_started``), which polls, parks and
wakes by itself while the event loop keeps the control path, the fabric only delivering the events the thread reports
(``deliver_events``), waking it when a guest kicks (``kick``), holding it while guest memory is remapped (``paused``)
and telling it the recheck period its drivers need; or in the event loop's own turns (``run``, in-process tests):

Polling and parking (ARCHITECTURE §4): while there is work the loop polls the send queue doorbells without
sleeping; after ``park_after_idle_us`` without work the engine parks: it sets the "parked" slot of every
doorbell page, checks the doorbells once more and the loop sleeps until a file descriptor wakes it (a guest that
rang a doorbell while the flag was set also kicks the device's wake queue), an RNR retry or a limited VM's bucket
falls due, or, when a device's driver asked for it, ``park_recheck_ms`` passes: a guest whose memory fence is not
real can read the flag before its doorbell store is visible to us and then kicks nobody (docs/backend.md, "Spinning
and parking"); the recheck bounds that to milliseconds. A driver whose fences are real does not ask, and a backend
serving only such guests sleeps until something happens.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from typing import Protocol

from vrdma.device.params import DEFAULT_LIMITS, DeviceLimits
from vrdma.engine.api import NO_DEVICE, DataEngine

log = logging.getLogger(__name__)


class FabricMember(Protocol):
    """What the fabric needs of a device it joins: a way to hand it an event, and whether its driver asked for the
    parked engine's periodic look at the doorbells."""

    @property
    def doorbell_recheck(self) -> bool: ...

    def post_event(self, event_type: int, handle: int = 0, data: int = 0) -> None: ...


class Fabric:
    def __init__(self, engine: DataEngine, max_devices: int, limits: DeviceLimits = DEFAULT_LIMITS) -> None:
        """``engine``: the data engine to run, made for ``max_devices`` (vrdma.engine.native.Engine in the daemon,
        vrdma.testing.fake_engine.FakeEngine in unit tests)."""
        self.engine = engine
        self.limits = limits
        engine.set_schedule({"quantum_bytes": limits.quantum_bytes, "piece_bytes": limits.piece_bytes,
                             "wr_cost_bytes": limits.wr_cost_bytes, "small_piece_bytes": limits.small_piece_bytes,
                             "solo_bytes": limits.solo_bytes})
        self.devices: list[FabricMember | None] = [None] * max_devices
        self.parked = False
        self.last_work = time.monotonic()
        self.park_after = limits.park_after_idle_us / 1e6
        # What the engine did, for the backend's metrics: time in its C, and the WQEs and packets it handled.
        self.engine_ns = 0
        self.engine_work = 0
        self.threaded = False

    # -- the engine in a thread of its own ---------------------------------------------------------------------------

    def engine_thread_started(self) -> None:
        """The engine's thread runs the data path from now on (the daemon started it)."""
        self.threaded = True
        self.recheck_changed()

    def engine_thread_stopped(self) -> None:
        self.threaded = False

    def kick(self, index: int = NO_DEVICE) -> None:
        """A guest rang a doorbell while the engine was parked: wake the thread that runs its device (every thread,
        by default; without threads, the event loop's next turn runs the engine anyway)."""
        if self.threaded:
            self.engine.kick(index)

    def paused(self, index: int = NO_DEVICE) -> AbstractContextManager[None]:
        """Device ``index`` (every device, by default) held between two turns (its guest memory about to be
        remapped)."""
        return self.engine.paused(index)

    def recheck_changed(self) -> None:
        """A device's driver asked for the doorbell recheck, or one that had asked went: the period the thread
        keeps while parked (without a thread, ``timeout`` reads the devices each turn)."""
        wanted = any(device is not None and device.doorbell_recheck for device in self.devices)
        self.engine.set_recheck(self.limits.park_recheck_ms * 1_000_000 if wanted else 0)

    def deliver_events(self) -> int:
        """Hand the engine's events to the devices they belong to; how many there were."""
        events = self.engine.take_events()
        for event in events:
            device = self.devices[event.device] if event.device < len(self.devices) else None
            if device is not None:
                device.post_event(event.type, handle=event.handle, data=event.data)
        return len(events)

    def engine_time(self) -> tuple[float, int]:
        """Seconds the engine spent doing work, and the WQEs, pieces and packets it handled (the metrics')."""
        if self.threaded:
            stats = self.engine.thread_stats()
            return stats["busy_ns"] / 1e9, stats["work"]
        return self.engine_ns / 1e9, self.engine_work

    def attach(self, device: FabricMember) -> int:
        """Give a device its engine index."""
        for index, slot in enumerate(self.devices):
            if slot is None:
                self.devices[index] = device
                return index
        raise RuntimeError(f"the fabric has room for {len(self.devices)} devices")

    def detach(self, device: FabricMember) -> None:
        for index, slot in enumerate(self.devices):
            if slot is device:
                self.devices[index] = None
        self.recheck_changed()

    def route(self, gid: bytes) -> int:
        """The engine index of the device holding ``gid`` in its GID table, or NO_DEVICE: asked of the engine's
        GID index, which routes packets and datagrams by the same table."""
        return self.engine.route_gid(gid)

    # -- the loop ---------------------------------------------------------------------------------------------

    def run(self) -> int:
        """Poll once and deliver the events; park when idle long enough. Returns the work done. (With the engine's
        thread running, the thread does all of this: nothing.)"""
        if self.threaded:
            return 0
        started = time.perf_counter_ns()
        if self.parked:
            work = self.engine.poll(self.limits.poll_budget)  # woken by a descriptor: look once
        else:
            # Spin in C, but not past the moment the engine would park: an idle device parks on time and the
            # event loop (control commands) is never kept waiting longer than spin_us.
            idle_left = self.park_after - (time.monotonic() - self.last_work)
            spin_ns = int(max(0.0, min(self.limits.spin_us / 1e6, idle_left)) * 1e9)
            work = self.engine.spin(self.limits.poll_budget, spin_ns)
        self.engine_ns += time.perf_counter_ns() - started
        self.engine_work += work
        events = self.deliver_events()
        now = time.monotonic()
        if work or events:
            self.last_work = now
            if self.parked:
                self.engine.unpark()
                self.parked = False
        elif not self.parked and now - self.last_work >= self.park_after:
            self.parked = self.engine.park()
            if not self.parked:
                self.last_work = now
        return work

    def timeout(self) -> float | None:
        """How long the event loop may sleep before run() is due again: 0 while not parked; parked, until the next
        RNR retry, moderation or bucket deadline, and at most park_recheck_ms if a device's driver asked for the
        recheck (unless a descriptor wakes it first); None: until a descriptor does."""
        if self.threaded:
            return None  # the engine's thread keeps its own time; the loop waits for descriptors
        if not self.parked:
            return 0.0
        recheck = (self.limits.park_recheck_ms / 1e3
                   if any(device is not None and device.doorbell_recheck for device in self.devices) else None)
        deadline = self.engine.next_deadline_ns()
        if deadline is None:
            return recheck
        until = max(0.0, (deadline - time.monotonic_ns()) / 1e9)
        return until if recheck is None else min(recheck, until)
