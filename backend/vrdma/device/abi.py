"""The device ABI, loaded from the one C header the guest driver and provider also include.

``guest-driver/include/uapi/rdma/vrdma-abi.h`` is read as text: the part between ``ABI-BEGIN`` and ``ABI-END``
(integer #defines and struct definitions) goes to cffi's parser, so the layouts here are the compiler's layouts,
declared once. The header's ``VRDMA_ASSERT_SIZE`` lines are checked against cffi's sizes at import.
"""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path
from typing import Any

import cffi

from vrdma import paths
from vrdma.errors import VrdmaError

HEADER = Path("guest-driver") / "include" / "uapi" / "rdma" / "vrdma-abi.h"
_KERNEL_TYPES = """
typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32; typedef uint64_t __u64;
typedef uint16_t __le16; typedef uint32_t __le32; typedef uint64_t __le64;
"""


class AbiError(VrdmaError):
    """The ABI header cannot be loaded or disagrees with itself."""


def header_path() -> Path:
    """The checkout's header; an installed package carries a copy next to this module (see setup.py)."""
    packaged = Path(__file__).with_name(HEADER.name)
    return packaged if packaged.is_file() else paths.project_root() / HEADER


def _load() -> tuple[Any, dict[str, int], dict[str, int]]:
    text = header_path().read_text()
    match = re.search(r"/\* ABI-BEGIN \*/(.*)/\* ABI-END \*/", text, flags=re.S)
    if match is None:
        raise AbiError(f"{header_path()}: no ABI-BEGIN/ABI-END section")
    body = re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)
    constants = {name: int(value, 0) for name, value in re.findall(r"^#define (\w+) (0x[0-9a-fA-F]+|\d+)\s*$",
                                                                   body, flags=re.M)}
    declarations = re.sub(r"^#define .*$", "", body, flags=re.M)
    ffi = cffi.FFI()
    ffi.cdef(_KERNEL_TYPES + declarations)
    sizes = {name: int(size) for name, size in re.findall(r"^VRDMA_ASSERT_SIZE\((\w+), (\d+)\);", text, flags=re.M)}
    for name, size in sizes.items():
        if ffi.sizeof(f"struct {name}") != size:
            raise AbiError(f"struct {name} is {ffi.sizeof(f'struct {name}')} bytes to cffi, {size} to the header")
    return ffi, constants, sizes


ffi, constants, asserted_sizes = _load()


def const(name: str) -> int:
    return constants[name]


def new(struct: str, **fields: Any) -> Any:
    """A zeroed ``struct <struct>`` with the given top-level fields set."""
    obj = ffi.new(f"struct {struct} *")
    for key, value in fields.items():
        setattr(obj, key, value)
    return obj


def to_bytes(obj: Any) -> bytes:
    return bytes(ffi.buffer(obj))


def from_bytes(struct: str, data: bytes) -> Any:
    """Parse exactly ``sizeof(struct <struct>)`` bytes (a copy, never a view into guest memory)."""
    size = ffi.sizeof(f"struct {struct}")
    if len(data) != size:
        raise AbiError(f"struct {struct} needs {size} bytes, got {len(data)}")
    obj = ffi.new(f"struct {struct} *")
    ffi.memmove(obj, data, size)
    return obj


def sizeof(struct: str) -> int:
    return int(ffi.sizeof(f"struct {struct}"))


def check_enum(enum: type[IntEnum], prefix: str) -> None:
    """Hold a Python enum to the header: its members are exactly the header's ``<prefix>*`` constants, same
    values (called at import by the modules that declare them, so a drift fails at once, naming the member)."""
    header = {name[len(prefix):]: value for name, value in constants.items() if name.startswith(prefix)}
    ours = {member.name: int(member.value) for member in enum}
    if header != ours:
        differ = sorted(set(header.items()) ^ set(ours.items()))
        raise AbiError(f"{enum.__name__} disagrees with the header's {prefix}* constants: {differ}")
