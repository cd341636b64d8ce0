"""ABI headers read as text: the marked part of a C header (integer #defines and struct definitions) parsed by
cffi, so that Python uses the compiler's layouts, declared once, and the header's VRDMA_ASSERT_SIZE lines checked
against cffi's sizes. The device API (vrdma.device.abi) and the container channel (vrdma.channel.wire) load theirs
with it; it knows neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cffi

from vrdma import paths
from vrdma.errors import VrdmaError

_KERNEL_TYPES = """
typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32; typedef uint64_t __u64;
typedef uint16_t __le16; typedef uint32_t __le32; typedef uint64_t __le64;
"""


class AbiError(VrdmaError):
    """An ABI header cannot be loaded or disagrees with itself."""


@dataclass(frozen=True)
class LoadedHeader:
    """One header as cffi sees it: its FFI, its integer constants and the sizes its VRDMA_ASSERT_SIZE lines state;
    its structs made, read and written by name."""

    ffi: Any
    constants: dict[str, int]
    asserted_sizes: dict[str, int]
    # ``struct <name> *`` as cffi's type, and the struct's size, looked up once each (a command names its structs on
    # every call, and cffi parses a type's name each time it is given one)
    _types: dict[str, tuple[Any, int]] = field(default_factory=dict, compare=False, repr=False)

    def const(self, name: str) -> int:
        return self.constants[name]

    def struct_type(self, struct: str) -> tuple[Any, int]:
        known = self._types.get(struct)
        if known is None:
            known = self._types[struct] = (self.ffi.typeof(f"struct {struct} *"),
                                           int(self.ffi.sizeof(f"struct {struct}")))
        return known

    def new(self, struct: str, **fields: Any) -> Any:
        """A zeroed ``struct <struct>`` with the given top-level fields set."""
        obj = self.ffi.new(self.struct_type(struct)[0])
        for key, value in fields.items():
            setattr(obj, key, value)
        return obj

    def to_bytes(self, obj: Any) -> bytes:
        return bytes(self.ffi.buffer(obj))

    def from_bytes(self, struct: str, data: bytes) -> Any:
        """Parse exactly ``sizeof(struct <struct>)`` bytes (a copy, never a view into shared memory)."""
        pointer, size = self.struct_type(struct)
        if len(data) != size:
            raise AbiError(f"struct {struct} needs {size} bytes, got {len(data)}")
        obj = self.ffi.new(pointer)
        self.ffi.memmove(obj, data, size)
        return obj

    def sizeof(self, struct: str) -> int:
        return self.struct_type(struct)[1]


def header_path(header: Path) -> Path:
    """The checkout's header; an installed package carries a copy next to this module (see setup.py)."""
    packaged = Path(__file__).with_name("device") / header.name
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
