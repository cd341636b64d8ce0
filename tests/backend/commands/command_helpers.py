"""What the per-command tests share: the VMs' GIDs, a connected VM, the status a refused command failed with."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vrdma.device.status import Status
from vrdma.testing.frontend import Frontend
from vrdma.testing.verbs import CommandError, SimMr, SimVerbs

GID = {name: bytes.fromhex("00000000000000000000ffffa9fe64" + last) for name, last in (("vm0", "01"), ("vm1", "02"))}
PATTERN_SIZE = 16 << 10


@dataclass
class Vm:
    name: str
    fe: Frontend
    verbs: SimVerbs

    def call(self, name: str, request: str, response: str = "vrdma_resp_hdr", **fields: Any) -> Any:
        return self.verbs.call(f"VRDMA_CMD_{name}", request, response, **fields)


def refused(call: Callable[[], object]) -> Status:
    """The status a command that must fail failed with (a command that succeeds fails the test)."""
    try:
        call()
    except CommandError as err:
        return Status(err.status)
    raise AssertionError("the device accepted a command it must refuse")


def pattern(size: int) -> bytes:
    block = hashlib.sha256(b"bystander").digest()
    return (block * (size // len(block) + 1))[:size]


@dataclass
class Bystander(Vm):
    mr: SimMr | None = None
    objects: dict[str, int] | None = None
