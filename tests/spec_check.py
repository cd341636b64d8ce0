"""docs/virtio-rdma-spec.md held to the device API headers: what the chapter declares and what the headers define,
read from both texts and compared (tests/unit/test_virtio_spec.py).

The chapter names things as a virtio specification chapter does: ``vrdma_`` becomes ``virtio_rdma_``, ``VRDMA_``
becomes ``VIRTIO_RDMA_``, ``__le32`` becomes ``le32`` (and so on). With that mapping,

- every struct between the headers' DEVICE-API markers is declared in one of the chapter's ``c`` code blocks with the
  same members, in the same order, of the same types and array lengths (comments aside), and the chapter states its
  size (``/* N bytes */`` after its closing brace) as the headers' compile-time checks do;
- every integer ``#define`` of the headers is in one of the chapter's tables (first cell the backticked name, second
  its value) with the same value;
- every control command has a section of its own (a heading ending in its name) with a ``Statuses:`` line naming
  the status codes it answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADERS = [ROOT / "guest-driver" / "include" / name
           for name in ("vrdma_dev_api.h", "vrdma_dev_ring.h", "vrdma_dev_cmd.h")]
SPEC = ROOT / "docs" / "virtio-rdma-spec.md"


def to_spec_name(name: str) -> str:
    return re.sub(r"\bvrdma_", "virtio_rdma_", re.sub(r"\bVRDMA_", "VIRTIO_RDMA_", name))


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def _api_text(path: Path) -> str:
    match = re.search(r"/\* DEVICE-API-BEGIN \*/(.*)/\* DEVICE-API-END \*/", path.read_text(), flags=re.S)
    assert match is not None, f"{path}: no DEVICE-API section"
    return match.group(1)


def _normal_type(c_type: str) -> str:
    c_type = re.sub(r"\b__(le|be|u|s)(8|16|32|64)\b", r"\1\2", c_type)
    return to_spec_name(" ".join(c_type.split()))


@dataclass(frozen=True)
class Struct:
    name: str
    members: tuple[str, ...]   # normalised declarations, nested blocks as "union {" ... "}" tokens


def _members(body: str) -> tuple[str, ...]:
    """A struct body's declarations as normalised tokens: 'le32 handle', 'u8 gid[16]', 'union {', '} reg', '}'."""
    tokens: list[str] = []
    for raw in re.findall(r"[^;{}]*[;{}]", body):
        item = " ".join(raw.split())
        if item.endswith("{"):
            tokens.append(f"{_normal_type(item[:-1].strip())} {{".strip())
        elif item.endswith("}"):
            tokens.append("}")
        elif item.endswith(";") and item != ";":
            decl = item[:-1].strip()
            if tokens and tokens[-1] == "}" and re.fullmatch(r"\w*", decl):
                tokens[-1] = f"}} {decl}".strip()   # the name after a nested block's brace
                continue
            match = re.fullmatch(r"(.+?)\s*\b(\w+)\s*(\[\s*(\w+)\s*\])?", decl)
            assert match is not None, f"cannot read the declaration {decl!r}"
            array = f"[{match.group(4)}]" if match.group(3) else ""
            tokens.append(f"{_normal_type(match.group(1))} {match.group(2)}{array}")
    return tuple(tokens)


def _structs(text: str) -> dict[str, Struct]:
    """Every top-level ``struct NAME { ... };`` of a C text (comments removed), by name."""
    text = _strip_comments(text)
    found: dict[str, Struct] = {}
    for match in re.finditer(r"\bstruct\s+(\w+)\s*\{", text):
        start, depth = match.end(), 1
        i = start
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if text[i:].lstrip().startswith(";"):  # a definition, not a member of another struct's body
            name = to_spec_name(match.group(1))
            if not any(s.name == name for s in found.values()) and _enclosing_depth(text, match.start()) == 0:
                found[name] = Struct(name, _members(text[start:i - 1]))
    return found


def _enclosing_depth(text: str, position: int) -> int:
    before = text[:position]
    return before.count("{") - before.count("}")


def header_structs() -> dict[str, Struct]:
    found: dict[str, Struct] = {}
    for path in HEADERS:
        found.update(_structs(_api_text(path)))
    return found


def header_sizes() -> dict[str, int]:
    sizes = {}
    for path in HEADERS:
        for name, size in re.findall(r"VRDMA_ASSERT_SIZE\((\w+),\s*(\d+)\)", path.read_text()):
            sizes[to_spec_name(name)] = int(size)
    return sizes


def header_constants() -> dict[str, int]:
    """Every object-like integer #define of the device API, by its spec name."""
    found = {}
    for path in HEADERS:
        for name, value in re.findall(r"^#define\s+(VRDMA_\w+)\s+(0x[0-9a-fA-F]+|\d+)\s*(?:/\*.*)?$",
                                      _api_text(path), flags=re.M):
            found[to_spec_name(name)] = int(value, 0)
    return found


def spec_text() -> str:
    return SPEC.read_text()


def spec_structs(text: str) -> tuple[dict[str, Struct], dict[str, int]]:
    """The structs the chapter's ``c`` code blocks declare, and the size each states after its brace."""
    blocks = "\n".join(re.findall(r"```c\n(.*?)```", text, flags=re.S))
    sizes = {name: int(size) for name, size in
             re.findall(r"struct\s+(\w+)\s*\{.*?^\};\s*/\*\s*(\d+)\s*bytes\s*\*/", blocks, flags=re.S | re.M)}
    return _structs(blocks), sizes


def spec_constants(text: str) -> dict[str, list[int]]:
    """Every ``| `VIRTIO_RDMA_NAME` | value |`` table row of the chapter (a name may be listed more than once)."""
    found: dict[str, list[int]] = {}
    for name, value in re.findall(r"^\|\s*`(VIRTIO_RDMA_\w+)`\s*\|\s*(0x[0-9a-fA-F]+|\d+)\s*\|", text, flags=re.M):
        found.setdefault(name, []).append(int(value, 0))
    return found


def spec_command_sections(text: str) -> set[str]:
    return set(re.findall(r"^#+ .*?\b(VIRTIO_RDMA_CMD_\w+)`?\s*$", text, flags=re.M))


def spec_command_statuses(text: str) -> dict[str, list[str]]:
    """Each command's section's ``Statuses:`` line: the status codes it names."""
    found: dict[str, list[str]] = {}
    sections = re.split(r"^#+ ", text, flags=re.M)
    for section in sections:
        heading = re.match(r".*?\b(VIRTIO_RDMA_CMD_\w+)`?\s*$", section.split("\n", 1)[0])
        line = re.search(r"^Statuses: (.*)$", section, flags=re.M)
        if heading and line:
            found[heading.group(1)] = re.findall(r"VIRTIO_RDMA_STATUS_\w+", line.group(1))
    return found
