"""A VM's share of the data engine: its weight against the other VMs with work, and its limits.

The engine shares itself by deficit round robin between the devices that have work (engine/poll.c): each turn of a
device is worth the engine's quantum times weight / 100 of copying (a work request costs the engine's per-request
cost on top of its bytes), and a message longer than a piece moves one piece per turn, so that a VM's small message
waits for at most a piece of each neighbour's, never for a whole large one. Fairness is by VM: a VM with eight busy
QPs shares its turn between them. Limits are token buckets (the shape of QEMU's throttle groups and Firecracker's
rate limiter): payload bytes and work requests per second, each with the burst it may save up. A latency class of
"low" gives a VM's devices a look between every other VM's turns (still paid from its own turn's worth), so that its
small messages wait for at most one piece of another VM's, not for a round of every VM's.

The same checks serve the configuration file (``[vm.NAME.qos]``), the admin socket (``vm-qos``, ``vm-add``) and
the command line (``vrdma admin vm qos``): a wrong key, type or range is an error naming it, and nothing changes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vrdma.errors import VrdmaError

DEFAULT_WEIGHT = 100   # engine.h's VRE_DEFAULT_WEIGHT: a turn worth the engine's quantum
MAX_WEIGHT = 1000      # VRE_MAX_WEIGHT
MAX_RATE = 1 << 44     # VRE_MAX_RATE: per second, and a burst, at most
# What a QoS setting is called where users write it (config file, admin socket, CLI), and the field it sets.
KEYS = {"weight": "weight", "bytes-per-s": "bytes_per_s", "bytes-burst": "bytes_burst",
        "wrs-per-s": "wrs_per_s", "wrs-burst": "wrs_burst", "latency": "latency"}
# The latency classes (engine.h's VRE_LATENCY_*): a "low" VM's devices get a look between every other VM's turns.
LATENCY = {"normal": 0, "low": 1}
_LATENCY_NAME = {value: name for name, value in LATENCY.items()}
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30,
           "ti": 1 << 40}
_QUANTITY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?\s*", re.IGNORECASE)


class QosError(VrdmaError):
    """A QoS setting the backend refuses (the message names the key and the value)."""


@dataclass(frozen=True)
class Qos:
    """One VM's weight and limits (0: no limit; a burst of 0: one second's worth)."""

    weight: int = DEFAULT_WEIGHT
    bytes_per_s: int = 0
    bytes_burst: int = 0
    wrs_per_s: int = 0
    wrs_burst: int = 0
    latency: int = LATENCY["normal"]

    def __post_init__(self) -> None:
        if not 1 <= self.weight <= MAX_WEIGHT:
            raise QosError(f"weight must be 1 to {MAX_WEIGHT} (100: an equal share), not {self.weight}")
        if self.latency not in _LATENCY_NAME:
            raise QosError(f"latency must be {' or '.join(LATENCY)}, not {self.latency!r}")
        for key, name in KEYS.items():
            value = getattr(self, name)
            if name not in ("weight", "latency") and not 0 <= value <= MAX_RATE:
                raise QosError(f"{key} must be 0 (no limit) to {MAX_RATE}, not {value}")

    def changed(self, settings: Mapping[str, Any], what: str) -> Qos:
        """This QoS with ``settings`` (user keys: weight, bytes-per-s, ...) applied; the others kept."""
        unknown = sorted(set(settings) - set(KEYS))
        if unknown:
            raise QosError(f"{what}: unknown QoS key(s) {', '.join(map(repr, unknown))} "
                           f"(known: {', '.join(KEYS)})")
        values = {KEYS[key]: latency_class(value, f"{what}: {key}") if key == "latency"
                  else quantity(value, f"{what}: {key}") for key, value in settings.items()}
        try:
            return dataclasses.replace(self, **values)
        except QosError as err:
            raise QosError(f"{what}: {err}") from None

    def as_table(self) -> dict[str, int | str]:
        """The settings under their user keys (what `vrdma admin vm qos` and the counters show)."""
        table: dict[str, int | str] = {key: getattr(self, name) for key, name in KEYS.items()}
        table["latency"] = _LATENCY_NAME[self.latency]
        return table


EQUAL_SHARE = Qos()  # the default: weight 100, no limits


def latency_class(value: object, what: str) -> int:
    """A latency class by name: "normal" (the default) or "low"."""
    if not isinstance(value, str) or value.lower() not in LATENCY:
        raise QosError(f"{what} must be {' or '.join(repr(name) for name in LATENCY)}, not {value!r}")
    return LATENCY[value.lower()]


def quantity(value: object, what: str) -> int:
    """A whole number, or a string with a decimal (k, M, G, T) or binary (Ki, Mi, Gi, Ti) suffix: "1G", "512Ki"."""
    if isinstance(value, bool):
        raise QosError(f"{what} must be a number, not {value!r}")
    if isinstance(value, int):
        return value
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise QosError(f"{what} must be a whole number or a quantity such as '1G' or '512Ki', not {value!r}")
    number = float(match.group(1)) * _SUFFIX[(match.group(2) or "").lower()]
    if number != int(number):
        raise QosError(f"{what}: {value!r} is not a whole number")
    return int(number)
