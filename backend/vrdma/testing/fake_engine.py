"""A data engine in Python for unit tests of the device model (a vrdma.engine.api.DataEngine).

It keeps what the model configured, per device and kind, and the QP states the model set, and refuses what the C
engine refuses of its caller's contract (a slot out of the device's table, a slot in use, an object that does not
exist, a device not open). It moves no data. ``refuse_next(errno)`` makes the next configuring call fail, so a
test reaches the model's rollback paths; ``calls`` records every call, in order.
"""

from __future__ import annotations

import contextlib
import errno as errnos
import json
from dataclasses import dataclass, field
from typing import Any

from vrdma.engine import api
from vrdma.engine.api import NO_DEVICE, EngineError

LIMIT_OF = {"mr": "max_mr", "cq": "max_cq", "srq": "max_srq", "qp": "max_qp"}


@dataclass
class FakeDevice:
    limits: api.EngineLimits
    doorbell_base: int
    memory: list[tuple[int, int, int]] = field(default_factory=list)
    objects: dict[str, dict[int, dict[str, Any]]] = field(
        default_factory=lambda: {kind: {} for kind in LIMIT_OF})
    qp_states: dict[int, int] = field(default_factory=dict)
    srq_limits: dict[int, int] = field(default_factory=dict)
    gids: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    qos: api.QosConfig | None = None
    suspended: bool = False


class FakeEngine:
    def __init__(self, max_devices: int = 1) -> None:
        self.devices: list[FakeDevice | None] = [None] * max_devices
        self.events: list[api.EngineEvent] = []
        self.calls: list[tuple[str, int, int]] = []  # (call, device, slot or -1)
        self._refuse: int | None = None
        self.schedule: api.SchedConfig | None = None
        self.kicks = 0
        self.recheck_ns = 0
        self.wake_fds: dict[int, int] = {}
        self.dirty_logs: dict[int, tuple[int, int]] = {}

    def refuse_next(self, errno: int = errnos.EINVAL) -> None:
        self._refuse = errno

    def _device(self, dev: int) -> FakeDevice:
        device = self.devices[dev] if 0 <= dev < len(self.devices) else None
        if device is None:
            raise EngineError(f"device {dev} is not open", errnos.ENODEV)
        return device

    def _configure(self, call: str, dev: int, slot: int = -1) -> FakeDevice:
        self.calls.append((call, dev, slot))
        if self._refuse is not None:
            err, self._refuse = self._refuse, None
            raise EngineError(f"{call} refused (FakeEngine.refuse_next)", err)
        return self._device(dev)

    def _create(self, kind: str, dev: int, slot: int, config: Any) -> None:
        device = self._configure(f"create_{kind}", dev, slot)
        limit = device.limits[LIMIT_OF[kind]]  # type: ignore[literal-required]
        if not 0 <= slot < limit:
            raise EngineError(f"{kind} slot {slot} outside the table of {limit}", errnos.EINVAL)
        if slot in device.objects[kind]:
            raise EngineError(f"{kind} slot {slot} is in use", errnos.EBUSY)
        device.objects[kind][slot] = dict(config)

    def _destroy(self, kind: str, dev: int, slot: int) -> None:
        self.calls.append((f"destroy_{kind}", dev, slot))
        device = self._device(dev)
        if device.objects[kind].pop(slot, None) is None:
            raise AssertionError(f"the model destroyed {kind} slot {slot}, which the engine does not have")
        device.qp_states.pop(slot, None)

    def _existing(self, kind: str, dev: int, slot: int) -> FakeDevice:
        device = self._device(dev)
        if slot not in device.objects[kind]:
            raise EngineError(f"no {kind} in slot {slot}", errnos.EINVAL)
        return device

    # -- devices ------------------------------------------------------------------------------------------------

    def open_device(self, dev: int, limits: api.EngineLimits, doorbell_base: int) -> None:
        self.calls.append(("open_device", dev, -1))
        if self.devices[dev] is not None:
            raise EngineError(f"device {dev} is open", errnos.EBUSY)
        self.devices[dev] = FakeDevice(dict(limits), doorbell_base)  # type: ignore[arg-type]

    def close_device(self, dev: int) -> None:
        self.calls.append(("close_device", dev, -1))
        self.devices[dev] = None

    def set_wake_fd(self, dev: int, fd: int) -> None:
        self.wake_fds[dev] = fd

    def set_page_window(self, dev: int, lo: int, hi: int) -> None:
        if lo > hi:
            raise EngineError(f"page window [{lo:#x}, {hi:#x}] is empty", errnos.EINVAL)

    def set_dirty_log(self, dev: int, address: int, size: int) -> None:
        if (address == 0) != (size == 0):
            raise EngineError(f"a dirty log of {size} bytes at {address:#x}", errnos.EINVAL)
        self.dirty_logs[dev] = (address, size)

    # -- a device's state: the configured objects, as JSON (the C engine's format is its own, state.c) ----------

    def suspend_device(self, dev: int, suspended: bool) -> None:
        self._configure("suspend_device", dev).suspended = suspended

    def save_device(self, dev: int) -> bytes:
        device = self._configure("save_device", dev)
        if not device.suspended:
            raise EngineError(f"device {dev} runs: suspend it before saving its state", errnos.EBUSY)
        return json.dumps({"objects": device.objects, "qp_states": device.qp_states,
                           "srq_limits": device.srq_limits}).encode()

    def reroute_device(self, source: int, target: int) -> None:
        self.calls.append(("reroute_device", source, target))

    @staticmethod
    def state_objects(state: bytes) -> list[tuple[str, int, dict[str, int]]]:
        saved = json.loads(state)
        return [(kind, int(slot), {k: v for k, v in config.items() if isinstance(v, int)})
                for kind in LIMIT_OF for slot, config in saved["objects"][kind].items()]

    def load_device(self, dev: int, state: bytes, check_only: bool = False) -> None:
        device = self._configure("load_device", dev)
        if any(device.objects.values()):
            raise EngineError(f"device {dev} has objects: a state loads into an empty device", errnos.EBUSY)
        try:
            saved = json.loads(state)
            objects = {kind: {int(slot): config for slot, config in saved["objects"][kind].items()}
                       for kind in LIMIT_OF}
            qp_states = {int(slot): int(state) for slot, state in saved["qp_states"].items()}
            srq_limits = {int(slot): int(limit) for slot, limit in saved["srq_limits"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise EngineError(f"not a device state: {err}", errnos.EINVAL) from err
        if not check_only:
            device.objects, device.qp_states, device.srq_limits = objects, qp_states, srq_limits
            device.suspended = True

    def set_memory(self, dev: int, regions: list[tuple[int, int, int]]) -> None:
        self._configure("set_memory", dev).memory = list(regions)

    def set_gid(self, dev: int, index: int, raw: bytes, gid_type: int) -> None:
        gids = self._configure("set_gid", dev).gids
        if gid_type:
            gids[index] = (raw, gid_type)
        else:
            gids.pop(index, None)

    def route_gid(self, raw: bytes) -> int:
        """As the engine's index routes: the lowest open device holding the GID."""
        for dev, device in enumerate(self.devices):
            if device is not None and any(gid == raw for gid, _ in device.gids.values()):
                return dev
        return NO_DEVICE

    def counters(self, dev: int) -> dict[str, int]:
        return dict.fromkeys(api.COUNTERS, 0)

    def roce_counters(self, dev: int) -> dict[str, int]:
        return dict.fromkeys(api.ROCE_COUNTERS, 0)

    # -- the engine's threads (the fake has none: the model's calls are made as they come) --------------------------

    def kick(self, dev: int = NO_DEVICE) -> None:
        self.kicks += 1

    def paused(self, dev: int = NO_DEVICE) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def set_recheck(self, period_ns: int) -> None:
        self.recheck_ns = period_ns

    def thread_stats(self, thread: int | None = None) -> dict[str, int]:
        return dict.fromkeys(api.THREAD_STATS, 0)

    def device_owner(self, dev: int) -> int | None:
        return None

    # -- sharing the engine (the fake moves nothing, so it keeps the settings and counts nothing) -----------------

    def set_schedule(self, sched: api.SchedConfig) -> None:
        self.schedule = sched

    def set_qos(self, dev: int, qos: api.QosConfig) -> None:
        self._configure("set_qos", dev).qos = qos

    def qos_counters(self, dev: int) -> dict[str, int]:
        return dict.fromkeys(api.QOS_COUNTERS, 0)

    # -- objects ------------------------------------------------------------------------------------------------

    def create_mr(self, dev: int, slot: int, config: api.MrConfig) -> None:
        self._create("mr", dev, slot, config)

    def rereg_mr(self, dev: int, slot: int, config: api.MrConfig) -> None:
        self._configure("rereg_mr", dev, slot)
        self._existing("mr", dev, slot).objects["mr"][slot] = dict(config)

    def destroy_mr(self, dev: int, slot: int) -> None:
        self._destroy("mr", dev, slot)

    def create_cq(self, dev: int, slot: int, config: api.CqConfig) -> None:
        self._create("cq", dev, slot, config)

    def moderate_cq(self, dev: int, slot: int, count: int, period_us: int) -> None:
        self._configure("moderate_cq", dev, slot)
        self._existing("cq", dev, slot).objects["cq"][slot].update(count=count, period_us=period_us)

    def destroy_cq(self, dev: int, slot: int) -> None:
        self._destroy("cq", dev, slot)

    def create_srq(self, dev: int, slot: int, config: api.SrqConfig) -> None:
        self._create("srq", dev, slot, config)
        self._device(dev).srq_limits[slot] = config["limit"]

    def set_srq_limit(self, dev: int, slot: int, limit: int) -> None:
        self._configure("set_srq_limit", dev, slot)
        self._existing("srq", dev, slot).srq_limits[slot] = limit

    def srq_limit(self, dev: int, slot: int) -> int:
        return self._existing("srq", dev, slot).srq_limits[slot]

    def destroy_srq(self, dev: int, slot: int) -> None:
        self._destroy("srq", dev, slot)

    def create_qp(self, dev: int, slot: int, config: api.QpConfig) -> None:
        self._create("qp", dev, slot, config)
        self._device(dev).qp_states[slot] = 0  # RESET

    def modify_qp(self, dev: int, slot: int, attr: api.QpAttr) -> None:
        self._configure("modify_qp", dev, slot)
        device = self._existing("qp", dev, slot)
        device.objects["qp"][slot]["attr"] = dict(attr)
        device.qp_states[slot] = attr["state"]

    def qp_state(self, dev: int, slot: int) -> int:
        return self._existing("qp", dev, slot).qp_states[slot]

    def qp_counters(self, dev: int, slot: int) -> dict[str, int]:
        self._existing("qp", dev, slot)
        return dict.fromkeys(api.QP_COUNTERS, 0)  # nothing runs here

    def destroy_qp(self, dev: int, slot: int) -> None:
        self._destroy("qp", dev, slot)

    # -- the loop: nothing runs -----------------------------------------------------------------------------------

    def poll(self, budget: int) -> int:
        return 0

    def spin(self, budget: int, spin_ns: int) -> int:
        return 0

    def take_events(self) -> list[api.EngineEvent]:
        events, self.events = self.events, []
        return events

    def next_deadline_ns(self) -> int | None:
        return None

    def park(self) -> bool:
        return True

    def unpark(self) -> None:
        pass
