"""The virtio transport of one VM's RDMA device: control and event virtqueues over a vhost-user device.

It moves bytes between virtqueue elements and the device model and bounds every loop and copy: a kick processes
at most one queue's worth of chains, a command is read up to the device's largest command plus one byte, a
response is written only into the device-writable buffers the driver supplied.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from vrdma.device import abi
from vrdma.device.constants import EventType
from vrdma.device.device import RdmaDevice
from vrdma.device.state import StateError
from vrdma.device.status import ResponseTooSmall
from vrdma.vhost_user import protocol
from vrdma.vhost_user.connection import Element, SharedMemoryMap, VhostUserConnection

log = logging.getLogger(__name__)

CONTROL = abi.const("VRDMA_QUEUE_CONTROL")
EVENT = abi.const("VRDMA_QUEUE_EVENT")
WAKE = abi.const("VRDMA_QUEUE_WAKE")
QUEUE_NAMES = {CONTROL: "control", EVENT: "event", WAKE: "wake"}
MAX_CHAINS_PER_KICK = 1024  # the largest split ring; a guest cannot keep the loop running longer
EVENT_SIZE = abi.sizeof("vrdma_event")
COMMAND_TIME_SAMPLES = 4096  # the backend's time per command, over the last this many (command_time)


def gather(device: VhostUserConnection, element: Element, limit: int) -> bytes:
    """The device-readable bytes of a chain, at most ``limit`` of them."""
    parts = []
    remaining = limit
    for address, length in element.out_sg:
        take = min(length, remaining)
        if take:
            parts.append(device.read(address, take))
        remaining -= take
        if remaining == 0:
            break
    return b"".join(parts)


def scatter(device: VhostUserConnection, element: Element, data: bytes) -> int:
    """Write ``data`` into the chain's device-writable buffers; return how many bytes fit."""
    offset = 0
    for address, length in element.in_sg:
        chunk = data[offset:offset + length]
        if not chunk:
            break
        device.write(address, chunk)
        offset += len(chunk)
    return offset


class VirtioRdmaTransport:
    """vhost-user DeviceModel of the vrdma device (see vrdma.vhost_user.connection.DeviceModel)."""

    num_queues = abi.const("VRDMA_NUM_QUEUES")

    def __init__(self, rdma: RdmaDevice, doorbell: SharedMemoryMap | None = None,
                 watch_wake: Callable[[int], None] | None = None,
                 on_start: Callable[[VhostUserConnection, bool], bool] | None = None) -> None:
        """``doorbell``: the VM's doorbell region, mapped into the device's shared memory region
        VRDMA_SHM_DOORBELL of a frontend that has one (QEMU's vhost-user-rdma-pci; the generic
        vhost-user-device-pci instead maps the same file as an ivshmem device); ``watch_wake``: told the wake
        queue's kick eventfd when it starts (-1 when it stops), for the engine's thread to watch; ``on_start``:
        told when the device starts (the first queue of the connection's first start) whether it starts from a
        state a migration handed over (applied, or refused and the device reset), before the device runs; False:
        it may not start, and the caller refuses the connection (vrdma.daemon.endpoint: a second QEMU of the VM
        that did not migrate into it)."""
        self.rdma = rdma
        self.doorbell = doorbell
        self.watch_wake = watch_wake
        self.on_start = on_start
        self.ever_started = False  # this connection started the device once (on_start was asked)
        self.device: VhostUserConnection | None = None
        self.started: set[int] = set()
        self.device_resets = 0  # the driver (or the machine) reset the device while connected
        self.stops = 0          # every queue stopped and the device kept, suspended (a VM stopped, or migrating)
        self.suspended = False  # stopped: the engine neither runs the device nor delivers into it
        self.fresh = True       # nothing told to a driver since the device was made or reset (PORT_ACTIVE due)
        # A state the frontend handed over (a migration's destination), checked, applied when the device starts:
        # only then is the guest's memory table known.
        self.incoming_state: bytes | None = None
        self.incoming_live_doorbells = False  # the state is a backend upgrade's: the guest's doorbells are newer
        # A backend upgrade's next process loads every VM before any runs (one that fails leaves the old process to
        # go on from where it stopped, so nothing may have moved): the device stays suspended until release().
        self.held = False
        self.states_refused_at_start = 0
        # The last migration's share of the device (milliseconds to save, to check and to load its state; the
        # state's bytes): what `vrdma bench` reports as the device's downtime.
        self.state_times = {"saved_ms": 0.0, "checked_ms": 0.0, "loaded_ms": 0.0, "bytes": 0}
        self.command_ns: collections.deque[int] = collections.deque(maxlen=COMMAND_TIME_SAMPLES)
        # The most commands one look at the control queue found waiting: more than one means the driver had several
        # in flight at once (vrdma.ko keeps up to VRDMA_CMD_SLOTS).
        self.commands_at_once_max = 0
        rdma.on_event = self.deliver_events  # events of the data engine arrive between kicks

    def device_features(self) -> int:
        return 1 << abi.const("VRDMA_F_DOORBELL_RECHECK")

    def protocol_features(self) -> int:
        return (protocol.ProtocolFeature.MQ | protocol.ProtocolFeature.REPLY_ACK | protocol.ProtocolFeature.CONFIG
                | protocol.ProtocolFeature.CONFIGURE_MEM_SLOTS | protocol.ProtocolFeature.BACKEND_REQ
                | protocol.ProtocolFeature.BACKEND_SEND_FD | protocol.ProtocolFeature.SHMEM
                | protocol.ProtocolFeature.RESET_DEVICE | protocol.ProtocolFeature.DEVICE_STATE
                | protocol.ProtocolFeature.LOG_SHMFD)

    def stop_keeps_state(self, device: VhostUserConnection) -> bool:
        """Whether every queue stopped is a stop (the device suspended, its objects kept) rather than a reset: only
        with a frontend that sends RESET_DEVICE on every reset. A frontend acks RESET_DEVICE when its vhost-user
        layer can send it, but sends it only for a device class with get_vhost, which vhost-user-base has only with
        the vrdma patch, the frontend that also acks SHMEM (docs/migration.md); QEMU without the patch (the generic
        device) stops the queues for a driver reset and says nothing more, so there a stop is a reset as before."""
        needed = protocol.ProtocolFeature.RESET_DEVICE | protocol.ProtocolFeature.SHMEM
        return (device.negotiated_protocol_features or 0) & needed == needed

    def shared_memory(self) -> list[SharedMemoryMap]:
        return [self.doorbell] if self.doorbell is not None else []

    def features_negotiated(self, features: int) -> None:
        # The driver asks for the doorbell recheck when its fences may not be real (a TCG guest): only then does a
        # parked engine look at the doorbells without being woken (vrdma.device.fabric).
        self.rdma.doorbell_recheck = bool(features & (1 << abi.const("VRDMA_F_DOORBELL_RECHECK")))

    def config_space(self) -> bytes:
        return self.rdma.config_space()

    def queue_started(self, device: VhostUserConnection, index: int, started: bool) -> None:
        log.info("%s: %s queue %s", self.rdma.name, QUEUE_NAMES.get(index, index),
                 "started" if started else "stopped")
        self.device = device
        if started and not self.started and not self._device_starts(device):
            return
        (self.started.add if started else self.started.discard)(index)
        if index == WAKE and self.watch_wake is not None:
            # A parked engine thread then wakes on the guest's kick itself, not a hop later through this loop.
            self.watch_wake(device.kick_fd(WAKE) if started else -1)
        if started and index == EVENT and self.fresh:
            # The first thing a driver learns on its event queue: the port is up, and the device's epoch (a driver
            # that probed another epoch holds handles this device state never issued: it starts over).
            self.rdma.post_event(EventType.PORT_ACTIVE, handle=1, data=self.rdma.epoch)
            self.fresh = False
        if not started and not self.started:
            if self.stop_keeps_state(device):
                # A stop (QMP stop, a migration's last phase, a snapshot): quiesced, kept; RESET_DEVICE follows if
                # it was a reset. Nothing popped is left unpushed (commands and events are answered at once).
                self.rdma.suspend()
                self.suspended = True
                self.stops += 1
            else:
                # Every queue stopped: the driver reset the device; what the VM owned goes, but not the guest's
                # memory table, which belongs to the connection.
                self._reset()

    def _device_starts(self, device: VhostUserConnection) -> bool:
        """The first queue of a start: a state handed over is applied now that the memory table is known (QEMU
        sends it before SET_MEM_TABLE), or a stopped device runs again. False: on_start refused the start."""
        data, self.incoming_state = self.incoming_state, None
        if data is not None:
            started = time.perf_counter()
            try:
                self.rdma.load_state(data, self.incoming_live_doorbells)
            except StateError as err:
                # Too late to fail the migration (the frontend took CHECK_DEVICE_STATE's answer): the VM gets a
                # reset device, whose new epoch its driver sees, and nothing else is touched.
                log.error("%s: the migrated state does not load into this guest's memory: %s; the device is reset",
                          self.rdma.name, err)
                self.states_refused_at_start += 1
                self._reset()
            else:
                self.fresh = False  # the driver knows this device already
                self.suspended = True
                self.state_times["loaded_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        first, self.ever_started = not self.ever_started, True
        if first and self.on_start is not None and not self.on_start(device, data is not None):
            return False
        if self.suspended and not self.held:
            self.rdma.suspend(False)
            self.suspended = False
            self.rdma.fabric.kick(self.rdma.engine_index)  # doorbells rung before the stop are looked at
        return True

    def release(self) -> None:
        """A backend upgrade's next process runs the device it loaded (held until every VM had loaded), and looks at
        its queues once: what the guest queued during the hand-over was kicked at the old process."""
        self.held = False
        if self.suspended and self.started:
            self.rdma.suspend(False)
            self.suspended = False
            self.rdma.fabric.kick(self.rdma.engine_index)
        if self.device is not None and CONTROL in self.started:
            self.process_commands(self.device)
        self.deliver_events()

    def _reset(self) -> None:
        self.rdma.reset(keep_memory=True)
        self.suspended = False
        self.fresh = True
        self.incoming_state = None
        self.device_resets += 1

    def carry_counters(self, source: VirtioRdmaTransport) -> None:
        """This transport's device took the place of ``source``'s (a migration between two QEMUs of one backend): the
        VM's counters go on from the source's (what this one counted before it started, the destination QEMU's
        set-up, was no event of the VM's, but a state it could not apply is)."""
        self.device_resets, self.stops = source.device_resets, source.stops
        self.state_times["saved_ms"] = source.state_times["saved_ms"]
        self.states_refused_at_start += source.states_refused_at_start
        self.commands_at_once_max = max(self.commands_at_once_max, source.commands_at_once_max)
        self.command_ns.extendleft(reversed(source.command_ns))

    def dirty_log_changed(self, device: VhostUserConnection) -> None:
        # The engine marks what it writes into this VM's memory; the vhost-user layer marks its own writes.
        self.rdma.set_dirty_log(*device.dirty_log_area())

    def device_reset(self, device: VhostUserConnection) -> None:
        log.info("%s: device reset", self.rdma.name)
        self._reset()

    # -- the device's state (vrdma.vhost_user.state_transfer.DeviceStateModel: a live migration) --------------------

    def save_device_state(self, device: VhostUserConnection) -> bytes:
        if self.started or not self.suspended:
            raise ValueError("the device's state is saved once every queue is stopped")
        started = time.perf_counter()
        data = self.rdma.save_state()
        self.state_times.update(saved_ms=round((time.perf_counter() - started) * 1e3, 3), bytes=len(data))
        return data

    def load_device_state(self, device: VhostUserConnection, data: bytes) -> None:
        """Checked now, so that a state this device cannot take fails the migration; applied when the device
        starts. A state replaces what the device held, which goes first (a snapshot loaded into a VM that ran:
        the frontend stopped it, and a refused snapshot leaves it with a reset device, which its driver sees)."""
        if any(self.rdma.objects.counts().values()) or self.rdma.events or self.incoming_state is not None:
            self._reset()
        started = time.perf_counter()
        try:
            self.rdma.check_state(data)
        except StateError as err:
            raise ValueError(str(err)) from err
        self.state_times.update(checked_ms=round((time.perf_counter() - started) * 1e3, 3), bytes=len(data))
        self.incoming_state = data

    def queue_kicked(self, device: VhostUserConnection, index: int) -> None:
        self.device = device
        if index == CONTROL:
            self.process_commands(device)
        elif index == EVENT:
            self.deliver_events()
        # WAKE carries no buffers: its kick is the message (a guest rang a doorbell while the engine was parked).
        # Any kick of the guest's wakes a parked engine thread as well: a guest whose fences are not real (TCG) can
        # miss the parked flag and so not kick WAKE, but it keeps the other queues busy while it works (commands,
        # event buffers after each event), and a look then costs one eventfd write where waiting for the recheck
        # costs milliseconds per message.
        self.rdma.fabric.kick(self.rdma.engine_index)

    def data_path_paused(self) -> AbstractContextManager[None]:
        """The data engine held between passes while the vhost-user layer remaps guest memory."""
        return self.rdma.fabric.paused(self.rdma.engine_index)

    def memory_changed(self, device: VhostUserConnection) -> None:
        regions = device.memory_regions()
        log.info("%s: guest memory table: %s", self.rdma.name,
                 ", ".join(f"{r.gpa:#x}+{r.size >> 20} MiB" for r in regions))
        self.rdma.set_memory([(r.gpa, r.size, r.host_address) for r in regions])

    def process_commands(self, device: VhostUserConnection) -> None:
        limit = self.rdma.limits.max_command_size
        done = 0
        while done < MAX_CHAINS_PER_KICK:
            started = time.perf_counter_ns()
            element = device.pop(CONTROL)
            if element is None:
                break
            request = gather(device, element, limit + 1)
            try:
                response = self.rdma.execute(request, element.writable)
            except ResponseTooSmall as err:
                log.warning("%s: control chain without room for a response: %s", self.rdma.name, err)
                response = b""
            device.push(CONTROL, element, scatter(device, element, response))
            self.command_ns.append(time.perf_counter_ns() - started)
            done += 1
        if done:
            self.commands_at_once_max = max(self.commands_at_once_max, done)
            device.notify(CONTROL)

    def command_time(self) -> dict[str, float]:
        """The backend's own time per command (from taking the chain off the control queue to putting it in the used
        ring) over the last COMMAND_TIME_SAMPLES commands: median and 99th percentile, microseconds."""
        samples = sorted(self.command_ns)
        if not samples:
            return {"samples": 0, "p50": 0.0, "p99": 0.0}
        return {"samples": len(samples), "p50": round(samples[len(samples) // 2] / 1000, 1),
                "p99": round(samples[min(len(samples) - 1, len(samples) * 99 // 100)] / 1000, 1)}

    def deliver_events(self) -> None:
        device = self.device
        if device is None or EVENT not in self.started or not self.rdma.events:
            return
        delivered = 0
        while self.rdma.events and delivered < MAX_CHAINS_PER_KICK:
            element = device.pop(EVENT)
            if element is None:
                break  # no buffer posted: the events wait for the driver's next kick
            if element.writable < EVENT_SIZE:
                # A buffer an event does not fit in is returned empty; the event waits for a proper one.
                log.warning("%s: event buffer smaller than %d bytes returned unused", self.rdma.name, EVENT_SIZE)
                device.push(EVENT, element, 0)
            else:
                device.push(EVENT, element, scatter(device, element, self.rdma.events.popleft()))
            delivered += 1
        if delivered:
            device.notify(EVENT)

    def disconnected(self, device: VhostUserConnection, reason: str) -> None:
        self.device = None
        self.ever_started = False
        self.started.clear()
        self.suspended, self.fresh, self.incoming_state = False, True, None
        self.rdma.set_dirty_log(0, 0)  # the connection unmaps the log next
        if self.watch_wake is not None:
            self.watch_wake(-1)  # the connection closes its kick eventfds
        self.rdma.reset()
