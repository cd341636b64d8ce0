"""docs/virtio-rdma-spec.md covers every structure, constant and command of the device API headers, as they are
(tests/spec_check.py reads both texts)."""

from __future__ import annotations

import pytest
import spec_check

from vrdma.device import abi


@pytest.fixture(scope="module")
def spec() -> str:
    return spec_check.spec_text()


def test_every_structure_is_in_the_chapter_as_the_headers_define_it(spec: str) -> None:
    declared, _ = spec_check.spec_structs(spec)
    defined = spec_check.header_structs()
    assert len(defined) >= 50, sorted(defined)  # the parser found the headers' structs
    missing = sorted(set(defined) - set(declared))
    assert not missing, f"structures of the headers the chapter does not declare: {missing}"
    extra = sorted(set(declared) - set(defined))
    assert not extra, f"structures the chapter declares that the headers do not: {extra}"
    for name, struct in defined.items():
        assert declared[name].members == struct.members, (name, declared[name].members, struct.members)


def test_every_structure_states_its_size(spec: str) -> None:
    _, sizes = spec_check.spec_structs(spec)
    header_sizes = spec_check.header_sizes()
    for name in spec_check.header_structs():
        assert name in sizes, f"the chapter does not state the size of struct {name}"
        assert sizes[name] == header_sizes[name], (name, sizes[name], header_sizes[name])
        assert sizes[name] == abi.sizeof(name.replace("virtio_rdma_", "vrdma_")), name  # what the backend loads


def test_every_constant_is_listed_with_its_value(spec: str) -> None:
    listed = spec_check.spec_constants(spec)
    defined = spec_check.header_constants()
    assert len(defined) >= 170, len(defined)
    missing = sorted(set(defined) - set(listed))
    assert not missing, f"constants the chapter does not list: {missing}"
    wrong = {name: (values, defined[name]) for name, values in listed.items()
             if name in defined and any(v != defined[name] for v in values)}
    assert not wrong, f"constants the chapter lists with another value (chapter, headers): {wrong}"
    unknown = sorted(set(listed) - set(defined))
    assert not unknown, f"constants the chapter lists that the headers do not define: {unknown}"


def test_every_command_has_its_section(spec: str) -> None:
    commands = {name for name in spec_check.header_constants() if name.startswith("VIRTIO_RDMA_CMD_")}
    assert len(commands) == 31
    sections = spec_check.spec_command_sections(spec)
    assert sections == commands, (sorted(commands - sections), sorted(sections - commands))


def test_every_command_names_its_status_codes(spec: str) -> None:
    statuses = {name for name in spec_check.header_constants() if name.startswith("VIRTIO_RDMA_STATUS_")}
    named = spec_check.spec_command_statuses(spec)
    assert set(named) == spec_check.spec_command_sections(spec), "a command section without its Statuses: line"
    for command, codes in named.items():
        assert "VIRTIO_RDMA_STATUS_OK" in codes and set(codes) <= statuses, (command, codes)


def test_every_status_code_has_its_meaning(spec: str) -> None:
    for name, value in spec_check.header_constants().items():
        if name.startswith("VIRTIO_RDMA_STATUS_"):
            row = next(line for line in spec.splitlines() if line.startswith(f"| `{name}` |"))
            assert row.split("|")[3].strip(), f"{name} ({value}) has no meaning in the chapter"


def test_the_checker_sees_a_drifted_chapter(spec: str) -> None:
    """The comparison is not vacuous: a member renamed, a size changed, a value changed, a command's section
    dropped are each found."""
    defined = spec_check.header_structs()
    renamed = spec.replace("le32 max_qp_wr;", "le32 max_qp_wrs;", 1)
    declared, _ = spec_check.spec_structs(renamed)
    assert declared["virtio_rdma_config"].members != defined["virtio_rdma_config"].members
    resized = spec.replace("};  /* 96 bytes */", "};  /* 97 bytes */", 1)
    assert spec_check.spec_structs(resized)[1]["virtio_rdma_config"] == 97
    revalued = spec.replace("| `VIRTIO_RDMA_STATUS_BUSY` | 5 |", "| `VIRTIO_RDMA_STATUS_BUSY` | 6 |")
    assert spec_check.spec_constants(revalued)["VIRTIO_RDMA_STATUS_BUSY"] == [6]
    dropped = spec.replace("`VIRTIO_RDMA_CMD_ALLOC_MW`\n", "\n")
    assert "VIRTIO_RDMA_CMD_ALLOC_MW" not in spec_check.spec_command_sections(dropped)
