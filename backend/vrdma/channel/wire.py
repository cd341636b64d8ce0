"""The channel's messages, loaded from the header the provider also includes (vrdma_channel.h)."""

from __future__ import annotations

from enum import IntEnum
from pathlib import Path

from vrdma.headers import AbiError, load_header

CHANNEL_HEADER = Path("guest-driver") / "include" / "vrdma_channel.h"
api = load_header(CHANNEL_HEADER, "CHANNEL-API")

VERSION = api.const("VRDMA_CHANNEL_VERSION")
MAX_MESSAGE = api.const("VRDMA_CHANNEL_MAX_MESSAGE")
HEADER_SIZE = api.sizeof("vrdma_chan_hdr")
PAGE = 4096


class Status(IntEnum):
    OK = 0
    NOT_SUPPORTED = 1
    INVALID = 2
    BAD_LENGTH = 3
    NO_RESOURCES = 4


class MessageType(IntEnum):
    HELLO = 1
    ADD_MEMORY = 2
    REMOVE_MEMORY = 3
    COMMAND = 4
    EVENT = 5
    CQ_NOTIFY = 6


# What each request is (its struct: COMMAND's is a header and then the command) and how many descriptors it carries.
REQUESTS: dict[MessageType, tuple[str, int]] = {
    MessageType.HELLO: ("vrdma_chan_hello", 0),
    MessageType.ADD_MEMORY: ("vrdma_chan_add_memory", 1),
    MessageType.REMOVE_MEMORY: ("vrdma_chan_remove_memory", 0),
    MessageType.COMMAND: ("vrdma_chan_hdr", 0),
    MessageType.CQ_NOTIFY: ("vrdma_chan_cq_notify", 1),
}


def _check(enum: type[IntEnum], prefix: str, other: str = "\0") -> None:
    """Hold an enum to the header's ``prefix`` constants (not those under ``other``), at import."""
    header = {name.removeprefix(prefix): value for name, value in api.constants.items()
              if name.startswith(prefix) and not name.startswith(other)}
    ours = {member.name: int(member) for member in enum}
    if header != ours:
        raise AbiError(f"{enum.__name__} disagrees with vrdma_channel.h: "
                       f"{sorted(set(header.items()) ^ set(ours.items()))}")


_check(Status, "VRDMA_CHAN_STATUS_")
_check(MessageType, "VRDMA_CHAN_", other="VRDMA_CHAN_STATUS_")
