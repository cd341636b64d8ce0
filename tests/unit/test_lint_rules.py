"""The project's own lint rules (vrdma.lint) find what they exist to find, and pass the tree as it is."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from vrdma.lint import layers, length, opcodes


def test_a_source_file_over_650_lines_is_found(tmp_path: Path) -> None:
    long_file, short_file = tmp_path / "long.c", tmp_path / "short.py"
    long_file.write_text("int x;\n" * 700)
    short_file.write_text("x = 1\n" * 650)
    assert [f.split(":")[1] for f in length.check([long_file, short_file])] == [" 700 lines (at most 650)"]


@pytest.mark.parametrize("code", [
    "if (pkt->opcode == 0x11) return;",
    "return op >= 0x0d && op <= 0x12;",
    "if ((pkt.opcode >> 5) == 3) x = 1;",
    "uint8_t op = opcode & 0x1f;",
    "pkt.opcode = 0x11;",
    "struct vre_roce_pkt pkt = { .opcode = 0x12, .pkey = ROCE_DEFAULT_PKEY };",
    "pkt.opcode = (uint8_t)(r.op->wire[pos] | (uc ? 0x20 : 0));",
    "struct x p = { .opcode = (r->op->flags & OP_IMM) ? 0x65 : 0x64 };",
    "switch (op) {\ncase 0x0d: return 1;\ndefault: return 0;\n}",
])
def test_an_opcode_literal_is_found(code: str) -> None:
    assert opcodes.findings_in(f"void f(void)\n{{\n{code}\n}}\n", "x.c")


@pytest.mark.parametrize("code", [
    "return roce_ends(op) == (k == npkts - 1);",
    "if (r->op->flags & OP_LOCAL) return;",
    "w.hdr.opcode = flags & 0x80 ? u8(in) : send_opcodes[u8(in) % 4];",
    "pkt.opcode = roce_read_response(job->sent, job->npkts - 1);",
    "if (pkt->opcode == ROCE_RC_COMPARE_SWAP) x = 0x13;  /* op 0x13 in a comment */",
    '#define FIRST 0x06\nputs("opcode == 0x11");',
    "if (qp->attr.timeout & 31) x = op->kind;",
])
def test_named_opcodes_and_other_numbers_pass(code: str) -> None:
    assert opcodes.findings_in(f"void f(void)\n{{\n{code}\n}}\n", "x.c") == []


def scratch_engine(tmp_path: Path, base_calls_qp: bool) -> tuple[Path, Path]:
    folder = tmp_path / "engine"
    folder.mkdir(parents=True)
    (folder / "base.c").write_text("void qp_to_error(void);\nvoid fail(void) {}\n" +
                                   ("void post(void) { qp_to_error(); }\n" if base_calls_qp else ""))
    (folder / "qp.c").write_text("void fail(void);\nvoid qp_to_error(void) { fail(); }\n")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(textwrap.dedent("""
        [tool.vrdma.engine-layers]
        layers = [["qp"], ["base"]]
    """))
    return folder, pyproject


def test_a_call_from_a_lower_layer_up_is_found(tmp_path: Path) -> None:
    folder, pyproject = scratch_engine(tmp_path, base_calls_qp=True)
    findings = layers.check(folder, pyproject, include=[folder])
    assert findings == ["base.c (layer 0) uses qp_to_error of qp.c (layer 1, above its own): "
                        "a file uses only the layers below it"]
    folder, pyproject = scratch_engine(tmp_path / "fine", base_calls_qp=False)
    assert layers.check(folder, pyproject, include=[folder]) == []


def test_a_file_in_no_layer_is_found(tmp_path: Path) -> None:
    folder, pyproject = scratch_engine(tmp_path, base_calls_qp=False)
    (folder / "new.c").write_text("int nothing;\n")
    assert layers.check(folder, pyproject, include=[folder]) == \
        ["new.c: in no layer of pyproject.toml's [tool.vrdma.engine-layers]: place it"]


def test_the_tree_keeps_the_opcode_and_layer_rules() -> None:
    assert opcodes.check() == []
    assert layers.check() == []
