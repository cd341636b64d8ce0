"""One VM's RDMA device: identity, config space, the doorbell region, commands, pending events, counters.

It composes the object tables (objects.py) and the command dispatcher (commands.py) with a seat in the data engine
of the fabric it is attached to (fabric.py); a device made on its own gets a fabric of its own. It never touches
sockets or file descriptors: the transport hands it command bytes and takes back response bytes and events.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import logging
import mmap
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from vrdma.device import abi, commands, state
from vrdma.device.fabric import Fabric
from vrdma.device.objects import DeviceObjects, Identity
from vrdma.device.params import DEFAULT_LIMITS, DeviceLimits, config_fields, engine_limits
from vrdma.device.qos import EQUAL_SHARE, Qos
from vrdma.device.seat import EngineSeat
from vrdma.engine.api import QOS_COUNTERS, DataEngine, QosConfig

log = logging.getLogger(__name__)

FW_VERSION = 1
DOORBELL_PAGE = abi.const("VRDMA_DOORBELL_PAGE_SIZE")
DB_SLOT_ALIVE = abi.const("VRDMA_DB_SLOT_ALIVE")
ALIVE_WORD = struct.Struct("<I")
ALL_ADDRESSES = (1 << 64) - 1  # the last device address: a page window of the whole memory table
# A hook a test installs to spoil responses on purpose (vrdma.testing.faults): it sees every response.
ResponseFilter = Callable[[bytes], bytes]


@dataclass
class EventCounters:
    events_posted: int = 0
    events_dropped: int = 0


class RdmaDevice:
    def __init__(self, name: str, *, mac: bytes = bytes(6), limits: DeviceLimits = DEFAULT_LIMITS,
                 pairing_id: int | None = None, fabric: Fabric | None = None,
                 doorbells: mmap.mmap | None = None, engine: DataEngine | None = None,
                 qos: Qos = EQUAL_SHARE, live_doorbells: bool = False) -> None:
        """``doorbells``: the doorbell region as this process maps it (the engine polls it); a private one is
        made when none is given (a device model without guests, in tests). A device joins ``fabric``, or, given
        ``engine`` instead (one made for a single device), a fabric of its own around that engine. ``qos``: its
        weight and limits in the engine (set_qos changes them); ``live_doorbells``: the region's context pages are
        a running guest's (a backend upgrade's next process: the state it loads keeps them as they are now)."""
        if len(mac) != 6:
            raise ValueError(f"a MAC address has 6 bytes, not {len(mac)}")
        self.name = name
        self.mac = mac
        self.limits = limits
        self.pairing_id = pairing_id if pairing_id is not None else secrets.randbits(64)
        self.epoch = secrets.randbits(64) or 1  # new whenever the device forgets its state (vrdma_config)
        # The last state check_state() passed, with what it built (the load that follows uses it, not a second
        # check: a migration's or an upgrade's pause is this checking's time twice otherwise).
        self._checked: tuple[bytes, state.Checked] | None = None
        self.identity = Identity(FW_VERSION, (secrets.randbits(64) & ~0xFF) | 0x02)  # GUID locally administered
        self.command_counters = commands.CommandCounters()
        self.event_counters = EventCounters()
        self.events: collections.deque[bytes] = collections.deque()
        self.on_event: Callable[[], None] | None = None
        self.response_filter: ResponseFilter | None = None
        self.memory: list[tuple[int, int, int]] = []  # the memory table the engine has, kept across resets
        self.dirty_log = (0, 0)  # the migration's log the engine marks in (address, bytes), kept across resets
        self.qos = qos
        # Whether the VM's driver asked for the parked engine's periodic look at the doorbells (its fences may not
        # be real: VRDMA_F_DOORBELL_RECHECK, set when the transport negotiates features).
        self._doorbell_recheck = False
        # What the engine's QoS counters said when the device was last reopened (they start again at zero there).
        self.qos_carried = dict.fromkeys(QOS_COUNTERS, 0)
        self.doorbells = doorbells if doorbells is not None else mmap.mmap(-1, self.doorbell_size)
        if len(self.doorbells) < self.doorbell_size:
            raise ValueError(f"doorbell region of {len(self.doorbells)} bytes, the device needs {self.doorbell_size}")
        if not live_doorbells:
            self.clear_doorbell_pages()  # a restarted backend finds the last one's contexts' slots in the region
        if fabric is None:
            if engine is None:
                raise ValueError("a device needs a fabric to join or an engine for a fabric of its own")
            fabric = Fabric(engine, 1, limits)
        self.fabric = fabric
        self.seat = EngineSeat(self.fabric.engine, self.fabric.attach(self))
        self._open_engine_device()
        self.objects = DeviceObjects(name, self.seat, limits, self.identity, self.set_alive, self.fabric.route)

    @property
    def doorbell_recheck(self) -> bool:
        return self._doorbell_recheck

    @doorbell_recheck.setter
    def doorbell_recheck(self, wanted: bool) -> None:
        self._doorbell_recheck = wanted
        self.fabric.recheck_changed()

    @property
    def engine_index(self) -> int:
        return self.seat.index

    def _open_engine_device(self) -> None:
        base = self.doorbell_address()
        self.seat.engine.open_device(self.seat.index, engine_limits(self.limits), base)
        self._apply_qos()
        if self.dirty_log[1]:
            self.seat.engine.set_dirty_log(self.seat.index, *self.dirty_log)

    def _apply_qos(self) -> None:
        # Qos's fields are struct vre_qos's, by name.
        self.seat.engine.set_qos(self.seat.index, cast(QosConfig, dataclasses.asdict(self.qos)))

    def set_qos(self, qos: Qos) -> None:
        """A new weight and limits, from the engine's next turn on (buckets start full)."""
        self.qos = qos
        self._apply_qos()
        self.fabric.kick(self.engine_index)  # a parked engine thread sleeps by the old limits' deadline

    def qos_counters(self) -> dict[str, int]:
        """What its share and limits did to it since the device was made (across resets)."""
        now = self.seat.engine.qos_counters(self.seat.index)
        return {name: self.qos_carried[name] + now[name] for name in QOS_COUNTERS}

    def doorbell_address(self) -> int:
        """Where this process has the doorbell region mapped (the engine polls it there)."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self.doorbells))

    # -- config space and doorbell region -----------------------------------------------------------------

    def config_space(self) -> bytes:
        config = abi.new("vrdma_config", abi_version=abi.const("VRDMA_ABI_VERSION"),
                         doorbell_page_size=DOORBELL_PAGE, pairing_id=self.pairing_id, device_epoch=self.epoch,
                         **config_fields(self.limits))
        config.mac = list(self.mac)
        return abi.to_bytes(config)

    def doorbell_header(self) -> bytes:
        header = abi.new("vrdma_doorbell_header", magic=abi.const("VRDMA_DOORBELL_MAGIC"),
                         pairing_id=self.pairing_id, abi_version=abi.const("VRDMA_ABI_VERSION"),
                         page_size=DOORBELL_PAGE, num_pages=self.limits.doorbell_pages)
        return abi.to_bytes(header)

    def set_alive(self, page: int, alive: bool) -> None:
        """Mark a context's doorbell page as known to the device (or not): the provider flushes on zero."""
        ALIVE_WORD.pack_into(self.doorbells, page * DOORBELL_PAGE + 4 * DB_SLOT_ALIVE,
                             abi.const("VRDMA_DB_ALIVE") if alive else 0)

    def clear_doorbell_pages(self) -> None:
        """Every context page back to zeros: no context is known, no index is pending, nothing is parked."""
        self.doorbells[DOORBELL_PAGE:self.doorbell_size] = bytes(self.doorbell_size - DOORBELL_PAGE)

    @property
    def doorbell_size(self) -> int:
        return self.limits.doorbell_pages * DOORBELL_PAGE

    # -- commands, memory and counters --------------------------------------------------------------------

    def execute(self, request: bytes, capacity: int, page_window: tuple[int, int] | None = None) -> bytes:
        """Run one command; return the response bytes (at most ``capacity``). ResponseTooSmall if none fits.
        ``page_window``: the device addresses [lo, hi] its page lists may name (a user context that no kernel
        stands between, vrdma.device.scope: its own memory only); by default the whole memory table."""
        if page_window is None:
            response = commands.execute(self.objects, self.command_counters, self.name, request, capacity)
        else:
            self.seat.engine.set_page_window(self.engine_index, *page_window)
            try:
                response = commands.execute(self.objects, self.command_counters, self.name, request, capacity)
            finally:
                self.seat.engine.set_page_window(self.engine_index, 0, ALL_ADDRESSES)
        return response if self.response_filter is None else self.response_filter(response)

    def set_memory(self, regions: list[tuple[int, int, int]]) -> None:
        """The guest's memory table (guest-physical start, size, host address): what the engine translates with."""
        self.seat.engine.set_memory(self.seat.index, regions)
        self.memory = list(regions)

    def counters_snapshot(self) -> dict[str, object]:
        c, e = self.command_counters, self.event_counters
        return {"commands": c.commands, "command_errors": c.command_errors, "events_posted": e.events_posted,
                "events_dropped": e.events_dropped, "events_pending": len(self.events),
                "by_opcode": dict(c.by_opcode),
                "objects": self.objects.counts(),
                "gids": self.objects.gids.snapshot(),
                "doorbell_pages": self.objects.ucontexts.doorbell_pages_held(),
                "engine": self.seat.engine.counters(self.seat.index),
                "roce": self.seat.engine.roce_counters(self.seat.index),
                "qos": {**self.qos.as_table(), **self.qos_counters()},
                "doorbell_recheck": self.doorbell_recheck,
                # the engine thread that runs it now (None: the engine has no threads: in-process)
                "engine_thread": self.seat.engine.device_owner(self.seat.index)}

    # -- events -------------------------------------------------------------------------------------------

    def post_event(self, event_type: int, handle: int = 0, data: int = 0) -> None:
        """Queue an event for the driver; the oldest are dropped (and counted) past the limit."""
        if len(self.events) >= self.limits.max_pending_events:
            self.events.popleft()
            self.event_counters.events_dropped += 1
        self.events.append(abi.to_bytes(abi.new("vrdma_event", type=event_type, handle=handle, data=data)))
        self.event_counters.events_posted += 1
        if self.on_event is not None:
            self.on_event()

    # -- its state as data (device/state.py: a live migration, a backend upgrade) -------------------------

    def set_dirty_log(self, address: int, size: int) -> None:
        """While the VM migrates: the bitmap (``size`` bytes at ``address`` in this process) in which the engine marks
        the guest pages it writes; (0, 0) stops it. Kept across resets of the device until stopped."""
        self.dirty_log = (address, size)
        self.seat.engine.set_dirty_log(self.engine_index, address, size)

    def suspend(self, suspended: bool = True) -> None:
        """The engine stops running the device and delivering into it (a pause, not a loss), or runs it again.
        Suspending returns once no pass of the engine's is in the device any more ("wait before stop": a pass in
        flight when the flag was set finishes first, and its CQEs and copies are in the state saved next), and with
        the events the engine had for the device handed to it (so that a state saved holds them)."""
        self.seat.engine.suspend_device(self.engine_index, suspended)
        if suspended:
            with self.fabric.paused(self.engine_index):
                pass  # (the device's lock: taken once the pass that holds it is done)
            self.fabric.deliver_events()

    def save_state(self) -> bytes:
        """Everything of the device as bytes (suspend it first); nothing changes."""
        return state.save(self)

    def check_state(self, data: bytes) -> None:
        """StateError unless ``data`` would load into this device (its memory table not needed yet)."""
        self._checked = None
        self._checked = (data, state.check(self, data))

    def load_state(self, data: bytes, live_doorbells: bool = False) -> None:
        """``data`` becomes this device, fresh from a reset, which stays suspended; StateError (and reset) if not.
        ``live_doorbells``: the doorbell pages are the running guest's, newer than the state's (a backend upgrade:
        the guest rang doorbells while the state travelled), and stay as they are. The same bytes check_state()
        passed last are not checked again (load checks the device is still fresh from a reset)."""
        checked, self._checked = self._checked, None
        state.load(self, data, live_doorbells, checked[1] if checked is not None and checked[0] is data else None)

    def announce_gids(self, data: bytes) -> None:
        """The GIDs of state ``data`` (checked) routed to this device before it loads: a backend upgrade's next
        process does so for every VM first, since a QP's peer is found by its GID when its state loads."""
        self.check_state(data)
        assert self._checked is not None
        for index, gid in self._checked[1].objects.gids.entries.items():
            self.seat.engine.set_gid(self.engine_index, index, gid.raw, gid.type)

    def took_over(self, source: RdmaDevice) -> None:
        """The VM this device loaded was ``source``'s, a device of the same fabric (a migration between two QEMUs of
        one backend): the QPs of every VM that delivered into ``source`` deliver here from now on."""
        self.fabric.engine.reroute_device(source.engine_index, self.engine_index)

    # -- lifecycle ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the fabric: the engine forgets the device (and the doorbell region may be unmapped after)."""
        self.seat.engine.close_device(self.seat.index)
        self.fabric.detach(self)
        self.objects.clear()

    def reset(self, keep_memory: bool = False) -> None:
        """The guest reset the device or went away: forget everything it owned.

        ``keep_memory``: the connection lives on (a driver reset), so the guest's memory table stays what it was:
        QEMU sends memory-table changes only as differences (CONFIGURE_MEM_SLOTS), never the same table again.
        """
        counts = self.objects.counts()
        log.info("%s: device reset (%d pending events, %s freed)", self.name, len(self.events),
                 ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no objects")
        self.events.clear()
        # Every object of the VM goes at once, in the engine too (it forgets the guest's memory with them).
        self.qos_carried = self.qos_counters()
        self.seat.engine.close_device(self.seat.index)
        self.clear_doorbell_pages()  # providers of the forgotten contexts see it and flush
        self._open_engine_device()
        if keep_memory and self.memory:
            self.set_memory(self.memory)
        else:
            self.memory = []
        self.objects.clear()
        self.epoch = secrets.randbits(64) or 1
