"""What the per-command tests share: the VMs' GIDs, the status a refused command failed with (and, from
backend_process, the connected VM and the bystander)."""

from __future__ import annotations

import re
from collections.abc import Callable

from backend_process import GID, Bystander, Vm

from vrdma.device.status import Status
from vrdma.testing.simulated_guest import CommandError


def refused(call: Callable[[], object], vm: Vm, because: str) -> Status:
    """The status a command that must fail failed with (a command that succeeds fails the test), after checking
    why: the reason the device logged for it (``<vm>: command refused (status N): <reason>``) must match the
    regular expression ``because``, so that a case refused for another reason than the one it tests fails."""
    assert vm.log is not None, "refused() reads the backend's log: connected_vm gives the Vm its path"
    start = vm.log.stat().st_size if vm.log.exists() else 0
    try:
        call()
    except CommandError as err:
        status = Status(err.status)
    else:
        raise AssertionError("the device accepted a command it must refuse")
    with vm.log.open(errors="replace") as log:
        log.seek(start)
        reasons = re.findall(rf"^.*{re.escape(vm.name)}: command refused \(status (\d+)\): (.*)$", log.read(),
                             flags=re.M)
    assert reasons, f"the device logged no reason for refusing with {status.name}"
    logged_status, reason = reasons[-1]
    assert int(logged_status) == status, (logged_status, status, reason)
    assert re.search(because, reason), f"refused ({status.name}) for another reason: {reason!r} (expected {because!r})"
    return status


__all__ = ["GID", "Bystander", "Vm", "refused"]
