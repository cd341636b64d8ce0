"""Errors of the VM harness, each carrying what a person needs to see the cause."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vrdma.errors import VrdmaError


class VmError(VrdmaError):
    """A guest failed to start or to stay up; the message carries the command line, status and console tail."""

    def __init__(self, name: str, reason: str, *, cmdline: Sequence[str] = (), exit_status: int | None = None,
                 console_log: Path | None = None, console_tail: str = "") -> None:
        self.name = name
        self.reason = reason
        self.cmdline = list(cmdline)
        self.exit_status = exit_status
        self.console_log = console_log
        self.console_tail = console_tail
        parts = [f"guest {name}: {reason}"]
        if exit_status is not None:
            parts.append(f"QEMU exit status: {exit_status}")
        if console_log is not None:
            parts.append(f"console log (kept): {console_log}")
        if self.cmdline:
            parts.append("QEMU command line: " + " ".join(self.cmdline))
        if console_tail:
            parts.append("console tail:\n" + console_tail)
        super().__init__("\n".join(parts))


class GuestPanicError(VmError):
    """The guest kernel panicked."""


class GuestBootTimeout(VmError):
    """The guest did not become ready before its deadline."""


class AgentError(VrdmaError):
    """The guest agent did not answer or answered with an error."""


class CommandTimeout(VrdmaError):
    """A command run in a guest did not finish before its deadline; it has been killed."""

    def __init__(self, guest: str, argv: Sequence[str], timeout: float, console_log: Path | None) -> None:
        self.guest = guest
        self.argv = list(argv)
        self.timeout = timeout
        where = f"; console log: {console_log}" if console_log else ""
        super().__init__(f"command timed out in {guest} after {timeout:g} s and was killed: "
                         f"{' '.join(argv)}{where}")


class NoGuestsError(VrdmaError):
    """`vrdma vm exec/down` found no guests started by `vrdma vm up`."""


class UnknownGuestError(VrdmaError):
    """A guest name that the running session does not have."""


class MigrationFailed(VrdmaError):
    """QEMU gave up a live migration (or it did not end in time): the source guest runs on where it was."""
