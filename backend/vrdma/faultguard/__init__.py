"""Fault guard: a SIGBUS in memory a VM can take away breaks that VM's device, not the backend (see faultguard.h).

One ``FaultGuard`` per process (the signal handler is process-wide), made by the backend with its event loop. Each
mapping a VM could truncate is guarded under an ``Owner``; when the handler has replaced a faulting mapping with
anonymous memory, the event loop calls that owner's ``on_fault`` with the number of faults, and the owner closes
the device whose memory it was. Nothing here knows about vhost-user or RDMA.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from vrdma.errors import VrdmaError
from vrdma.loop import EventLoop

try:
    from vrdma.faultguard._faultguard import ffi, lib
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("the fault guard is not built: run `make backend` "
                      "(python backend/vrdma/faultguard/_build.py)") from err

log = logging.getLogger(__name__)

MAX_OWNERS = lib.FG_MAX_OWNERS
FaultCallback = Callable[[int], None]


class FaultGuardError(VrdmaError):
    """The guard cannot take another range or owner."""


def remap_shared(start: int, length: int, fd: int) -> None:
    """Map ``fd`` shared over a mapping the guard replaced, at the same address (its users keep their pointers)."""
    err = lib.fg_remap_shared(start, length, fd)
    if err:
        raise OSError(-err, f"cannot map the file again at {start:#x}: {os.strerror(-err)}")


class Owner:
    """The guarded mappings of one holder (a VM's guest memory, a VM's doorbell region)."""

    def __init__(self, guard: FaultGuard, number: int, name: str, on_fault: FaultCallback) -> None:
        self.guard = guard
        self.number = number
        self.name = name
        self.on_fault = on_fault
        self._base = int(lib.fg_faults_total(number))  # numbers are reused; the C total is not reset

    def guard_ranges(self, ranges: list[tuple[int, int]]) -> None:
        """Guard exactly these (host address, length) mappings from now on."""
        lib.fg_remove_owner(self.number)
        for start, length in ranges:
            if lib.fg_add(start, length, self.number) != 0:
                lib.fg_remove_owner(self.number)
                raise FaultGuardError(f"{self.name}: cannot guard {length} bytes at {start:#x} (table of "
                                      f"{lib.FG_MAX_RANGES} ranges full, or not page-aligned)")

    @property
    def faults(self) -> int:
        """Faults taken in this owner's mappings since it was made."""
        return int(lib.fg_faults_total(self.number)) - self._base

    def release(self) -> None:
        """Stop guarding (before the mappings are unmapped); the number may be reused."""
        lib.fg_remove_owner(self.number)
        lib.fg_take_faults(self.number)
        self.guard._release(self)


class FaultGuard:
    """Installs the SIGBUS handler and delivers faults to owners from the event loop."""

    _installed: FaultGuard | None = None

    def __init__(self, loop: EventLoop) -> None:
        if FaultGuard._installed is not None:
            raise FaultGuardError("the fault guard is process-wide: one FaultGuard per process")
        fd = lib.fg_install()
        if fd < 0:
            raise FaultGuardError("cannot install the SIGBUS handler")
        self.loop = loop
        self.fd = fd
        self.owners: dict[int, Owner] = {}
        self._free = list(range(MAX_OWNERS - 1, 0, -1))
        loop.add_reader(fd, self._deliver)
        FaultGuard._installed = self

    def owner(self, name: str, on_fault: FaultCallback) -> Owner:
        if not self._free:
            raise FaultGuardError(f"all {MAX_OWNERS - 1} fault guard owners in use")
        number = self._free.pop()
        lib.fg_take_faults(number)  # nothing of an earlier owner of the number is delivered to this one
        owner = Owner(self, number, name, on_fault)
        self.owners[number] = owner
        return owner

    def _release(self, owner: Owner) -> None:
        if self.owners.pop(owner.number, None) is owner:
            self._free.append(owner.number)

    def _deliver(self) -> None:
        lib.fg_drain()
        for number, owner in list(self.owners.items()):
            faults = int(lib.fg_take_faults(number))
            if faults:
                log.error("%s: %d memory fault(s): the file behind a mapping was truncated; its pages read as "
                          "zeros now", owner.name, faults)
                owner.on_fault(faults)

    def close(self) -> None:
        """Stop delivering (the handler stays installed: a late fault in a guarded range is still contained)."""
        for owner in list(self.owners.values()):
            owner.release()
        self.loop.remove_reader(self.fd)
        FaultGuard._installed = None


__all__ = ["FaultGuard", "FaultGuardError", "Owner", "ffi", "remap_shared"]
