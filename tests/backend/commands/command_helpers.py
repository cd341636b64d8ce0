"""What the per-command tests share: the VMs' GIDs, the status a refused command failed with (and, from
backend_process, the connected VM and the bystander)."""

from __future__ import annotations

from collections.abc import Callable

from backend_process import Bystander, Vm

from vrdma.device.status import Status
from vrdma.testing.verbs import CommandError

GID = {name: bytes.fromhex("00000000000000000000ffffa9fe64" + last) for name, last in (("vm0", "01"), ("vm1", "02"))}


def refused(call: Callable[[], object]) -> Status:
    """The status a command that must fail failed with (a command that succeeds fails the test)."""
    try:
        call()
    except CommandError as err:
        return Status(err.status)
    raise AssertionError("the device accepted a command it must refuse")


__all__ = ["GID", "Bystander", "Vm", "refused"]
