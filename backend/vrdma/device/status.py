"""What a command answers and how the device model fails: statuses, the model's exceptions.

``Status`` is the header's VRDMA_STATUS_* set, checked against it at import. A handler refuses a request by
raising CommandFailed with the status the driver gets; ``commands.execute`` turns it into the response header,
the one place where exceptions become protocol replies.
"""

from __future__ import annotations

from enum import IntEnum

from vrdma.device import abi
from vrdma.errors import VrdmaError


class Status(IntEnum):
    OK = 0
    NOT_SUPPORTED = 1
    INVALID = 2
    BAD_LENGTH = 3
    NO_RESOURCES = 4
    BUSY = 5


abi.check_enum(Status, "VRDMA_STATUS_")


class DeviceError(VrdmaError):
    """Root of the device model's errors."""


class CommandFailed(DeviceError):
    """A handler refuses a request; its status becomes the response's."""

    def __init__(self, status: Status, reason: str) -> None:
        self.status = status
        super().__init__(reason)


class ResponseTooSmall(DeviceError):
    """The driver gave less device-writable space than a response header: nothing can be said."""
