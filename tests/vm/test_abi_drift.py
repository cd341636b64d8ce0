"""The device ABI as the guest driver was compiled and as the backend loads it must be the same.

The backend parses guest-driver/include/uapi/rdma/vrdma-abi.h with cffi; the driver is compiled from it by gcc.
This test reads every ABI struct's size and member offsets from vrdma.ko's DWARF and compares them with cffi's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from vrdma.buildchain.cache import product
from vrdma.device import abi

pytestmark = pytest.mark.products


def dwarf_layouts(module: Path, names: set[str]) -> dict[str, tuple[int, dict[str, int]]]:
    """{struct name: (size, {member: offset})} for the named structs in an ELF file's DWARF."""
    layouts: dict[str, tuple[int, dict[str, int]]] = {}
    with module.open("rb") as f:
        dwarf = ELFFile(f).get_dwarf_info()
        for cu in dwarf.iter_CUs():
            for die in cu.iter_DIEs():
                if die.tag != "DW_TAG_structure_type" or "DW_AT_name" not in die.attributes:
                    continue
                name = die.attributes["DW_AT_name"].value.decode()
                if name not in names or name in layouts or "DW_AT_byte_size" not in die.attributes:
                    continue
                members = {child.attributes["DW_AT_name"].value.decode():
                           child.attributes["DW_AT_data_member_location"].value
                           for child in die.iter_children() if child.tag == "DW_TAG_member"}
                layouts[name] = (die.attributes["DW_AT_byte_size"].value, members)
    return layouts


def cffi_layout(name: str) -> tuple[int, dict[str, int]]:
    struct: Any = abi.ffi.typeof(f"struct {name}")
    return abi.ffi.sizeof(struct), {field: info.offset for field, info in struct.fields}


def drift(module: Path) -> list[str]:
    names = set(abi.asserted_sizes)
    compiled = dwarf_layouts(module, names)
    problems = [f"struct {n} is not in {module.name}'s debug information" for n in sorted(names - set(compiled))]
    for name in sorted(names & set(compiled)):
        if compiled[name] != cffi_layout(name):
            problems.append(f"struct {name}: driver {compiled[name]} != backend {cffi_layout(name)}")
    return problems


def test_driver_and_backend_agree_on_every_abi_struct() -> None:
    module = Path(product("driver")["module_path"])
    assert drift(module) == []
