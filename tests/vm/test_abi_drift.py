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
                layouts[name] = (die.attributes["DW_AT_byte_size"].value, members_of(die))
    return layouts


def members_of(die: Any, base: int = 0) -> dict[str, int]:
    """{member: offset} of a struct or union DIE, with the members of an anonymous struct or union among them (as
    cffi lists them: C11 makes their members the outer struct's)."""
    members: dict[str, int] = {}
    for child in die.iter_children():
        if child.tag != "DW_TAG_member":
            continue
        location = child.attributes.get("DW_AT_data_member_location")
        offset = base + (location.value if location is not None else 0)  # a union's members have none: 0
        if "DW_AT_name" in child.attributes:
            members[child.attributes["DW_AT_name"].value.decode()] = offset
        else:
            members.update(members_of(child.get_DIE_from_attribute("DW_AT_type"), offset))
    return members


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
