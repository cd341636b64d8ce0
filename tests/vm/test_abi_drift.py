"""The ABI headers as the guest driver was compiled and as the backend loads them must be the same.

The backend parses guest-driver/include/vrdma_dev_api.h (the device API) with cffi; the driver is compiled from it
and from include/uapi/rdma/vrdma-abi.h (the user ABI) by gcc. This test reads every struct's size and member
offsets of both headers from vrdma.ko's DWARF and compares them with cffi's reading of the same text.
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


def cffi_layout(header: abi.LoadedHeader, name: str) -> tuple[int, dict[str, int]]:
    struct: Any = header.ffi.typeof(f"struct {name}")
    return header.ffi.sizeof(struct), {field: info.offset for field, info in struct.fields}


def drift(module: Path, header: abi.LoadedHeader) -> list[str]:
    names = set(header.asserted_sizes)
    compiled = dwarf_layouts(module, names)
    problems = [f"struct {n} is not in {module.name}'s debug information" for n in sorted(names - set(compiled))]
    for name in sorted(names & set(compiled)):
        if compiled[name] != cffi_layout(header, name):
            problems.append(f"struct {name}: driver {compiled[name]} != backend {cffi_layout(header, name)}")
    return problems


def test_driver_and_backend_agree_on_every_device_api_struct() -> None:
    module = Path(product("driver")["module_path"])
    assert len(abi.device_api.asserted_sizes) >= 40
    assert drift(module, abi.device_api) == []


def test_driver_and_header_agree_on_every_user_abi_struct() -> None:
    module = Path(product("driver")["module_path"])
    user_abi = abi.user_abi()
    assert set(user_abi.asserted_sizes) >= {"vrdma_alloc_ucontext_resp", "vrdma_create_qp_cmd", "vrdma_create_srq_resp"}
    assert not set(user_abi.asserted_sizes) & set(abi.asserted_sizes), "a struct is declared in both headers"
    assert drift(module, user_abi) == []
