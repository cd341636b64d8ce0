"""The device API, loaded from the one C header the guest driver and provider also include.

``guest-driver/include/vrdma_dev_api.h`` and the two headers it includes (``vrdma_dev_ring.h``, the ring formats;
``vrdma_dev_cmd.h``, the control commands) are read as text: the parts between ``DEVICE-API-BEGIN`` and
``DEVICE-API-END`` (integer #defines and struct definitions) go to cffi's parser, in that order, so the layouts
here are the compiler's layouts, declared once. The headers' ``VRDMA_ASSERT_SIZE`` lines are checked against
cffi's sizes at import. The user ABI (``uapi/rdma/vrdma-abi.h``: what vrdma.ko and libvrdma alone exchange) is not
the device's business; :func:`user_abi` loads it the same way for the tests that hold the driver to it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from pathlib import Path
from typing import Any

import cffi

from vrdma import paths
from vrdma.errors import VrdmaError

# vrdma_dev_api.h and the two it includes, in the order their definitions build on each other.
DEVICE_API_HEADERS = [Path("guest-driver") / "include" / name
                      for name in ("vrdma_dev_api.h", "vrdma_dev_ring.h", "vrdma_dev_cmd.h")]
USER_ABI_HEADER = Path("guest-driver") / "include" / "uapi" / "rdma" / "vrdma-abi.h"
_KERNEL_TYPES = """
typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32; typedef uint64_t __u64;
typedef uint16_t __le16; typedef uint32_t __le32; typedef uint64_t __le64;
"""


class AbiError(VrdmaError):
    """An ABI header cannot be loaded or disagrees with itself."""


@dataclass(frozen=True)
class LoadedHeader:
    """One header as cffi sees it: its FFI, its integer constants and the sizes its VRDMA_ASSERT_SIZE lines state."""

    ffi: Any
    constants: dict[str, int]
    asserted_sizes: dict[str, int]


def header_path(header: Path) -> Path:
    """The checkout's header; an installed package carries a copy next to this module (see setup.py)."""
    packaged = Path(__file__).with_name(header.name)
    return packaged if packaged.is_file() else paths.project_root() / header


def load_header(headers: Path | list[Path], marker: str) -> LoadedHeader:
    """One header, or several whose marked sections are read as one text, in order."""
    paths_ = [header_path(header) for header in (headers if isinstance(headers, list) else [headers])]
    text = body = ""
    for path in paths_:
        own = path.read_text()
        match = re.search(rf"/\* {marker}-BEGIN \*/(.*)/\* {marker}-END \*/", own, flags=re.S)
        if match is None:
            raise AbiError(f"{path}: no {marker}-BEGIN/{marker}-END section")
        text += own
        body += re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)
    path = paths_[0]
    constants = {name: int(value, 0) for name, value in re.findall(r"^#define (\w+) (0x[0-9a-fA-F]+|\d+)\s*$",
                                                                   body, flags=re.M)}
    declarations = re.sub(r"^#define .*$", "", body, flags=re.M)
    header_ffi = cffi.FFI()
    header_ffi.cdef(_KERNEL_TYPES + declarations)
    sizes = {name: int(size) for name, size in re.findall(r"^VRDMA_ASSERT_SIZE\((\w+), (\d+)\);", text, flags=re.M)}
    for name, size in sizes.items():
        if header_ffi.sizeof(f"struct {name}") != size:
            raise AbiError(f"struct {name} is {header_ffi.sizeof(f'struct {name}')} bytes to cffi, {size} to {path}")
    return LoadedHeader(header_ffi, constants, sizes)


def user_abi() -> LoadedHeader:
    return load_header(USER_ABI_HEADER, "USER-ABI")


device_api = load_header(DEVICE_API_HEADERS, "DEVICE-API")
ffi, constants, asserted_sizes = device_api.ffi, device_api.constants, device_api.asserted_sizes


def const(name: str) -> int:
    return constants[name]


@functools.cache
def _struct(struct: str) -> tuple[Any, int]:
    """``struct <struct> *`` as cffi's type, and the struct's size: looked up once (a command names its structs on
    every call, and cffi parses a type's name each time it is given one)."""
    return ffi.typeof(f"struct {struct} *"), int(ffi.sizeof(f"struct {struct}"))


def new(struct: str, **fields: Any) -> Any:
    """A zeroed ``struct <struct>`` with the given top-level fields set."""
    obj = ffi.new(_struct(struct)[0])
    for key, value in fields.items():
        setattr(obj, key, value)
    return obj


def to_bytes(obj: Any) -> bytes:
    return bytes(ffi.buffer(obj))


def from_bytes(struct: str, data: bytes) -> Any:
    """Parse exactly ``sizeof(struct <struct>)`` bytes (a copy, never a view into guest memory)."""
    pointer, size = _struct(struct)
    if len(data) != size:
        raise AbiError(f"struct {struct} needs {size} bytes, got {len(data)}")
    obj = ffi.new(pointer)
    ffi.memmove(obj, data, size)
    return obj


def sizeof(struct: str) -> int:
    return _struct(struct)[1]


def check_enum(enum: type[IntEnum] | type[IntFlag], prefix: str, exclude: tuple[str, ...] = ()) -> None:
    """Hold a Python enum to the header: its members are exactly the header's ``<prefix>*`` constants, same
    values (called at import by the modules that declare them, so a drift fails at once, naming the member).
    ``exclude``: names under the prefix that belong to another set (VRDMA_WC_OP_* beside the statuses)."""
    header = {name[len(prefix):]: value for name, value in constants.items()
              if name.startswith(prefix) and not name[len(prefix):].startswith(exclude or ("\0",))}
    ours = {member.name: int(member.value) for member in enum}
    if header != ours:
        differ = sorted(set(header.items()) ^ set(ours.items()))
        raise AbiError(f"{enum.__name__} disagrees with the header's {prefix}* constants: {differ}")
