"""A device's seat in the data engine: the engine, the device's index in it, and how refusals become statuses.

Every object module holds the seat it was given (an explicit dependency: none of them reaches through the device
for its engine). ``refused_as_status`` is the one place where an engine refusal becomes a command status.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from dataclasses import dataclass

from vrdma.device.status import CommandFailed, Status
from vrdma.engine.api import DataEngine, EngineError


@dataclass
class EngineSeat:
    engine: DataEngine
    index: int


@contextlib.contextmanager
def refused_as_status() -> Iterator[None]:
    """An engine refusal inside the block fails the command: NO_RESOURCES when a budget ran out, else INVALID."""
    try:
        yield
    except EngineError as err:
        status = Status.NO_RESOURCES if err.errno == errno.ENOMEM else Status.INVALID
        raise CommandFailed(status, str(err)) from err
