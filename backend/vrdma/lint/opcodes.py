"""No opcode compared with, masked by or made of a number outside the wire opcode table.

Every RoCE opcode has a name and a row in backend/vrdma/engine/wire.[ch]; code elsewhere asks the row (its kind,
its place in the message, its headers) or uses the name. A literal such as ``op >= 0x0d && op <= 0x12`` or
``pkt.opcode = 0x11`` says the same fact a second time, where the table cannot keep it true.

The check reads C as tokens (comments and strings removed) and flags a non-zero integer literal that is
- an operand of a comparison, bitwise, shift or additive operator whose other operand names an opcode,
- a case label of a ``switch`` on an opcode, or
- part of the value given to an opcode (``x.opcode = ...``, ``.opcode = ...`` in an initializer), outside call
  arguments, subscripts and the condition of a ``?:``.
A name is an opcode's when the last name of its member chain is ``op``, ``opcode`` or ends in ``_opcode``
(``pkt->opcode``, ``op``, ``wr_opcode``; not ``r->op->flags``, which is a field of a row).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vrdma.lint.source import ENGINE, ROOT, rel

# The C that handles opcodes: the engine, its fuzzers and the test-only native helpers. The table itself is exempt.
SCOPE = (ENGINE, ROOT / "fuzz", ROOT / "backend" / "vrdma" / "testing")
TABLE = (ENGINE / "wire.h", ENGINE / "wire.c")

TOKEN = re.compile(r"""
    (?P<comment>/\*.*?\*/|//[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<number>\b(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op><<=|>>=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|[-+*/%&|^~!<>=?:;,.(){}\[\]#])
  | (?P<space>\s+)
  | (?P<other>.)
""", re.S | re.X)

BINARY = {"==", "!=", "<", ">", "<=", ">=", "&", "|", "^", "<<", ">>", "+", "-"}
ASSIGN = {"=", "|=", "&=", "^=", "+=", "-="}
OPEN = {"(": ")", "[": "]", "{": "}"}
CLOSE = {v: k for k, v in OPEN.items()}
OPCODE_NAME = re.compile(r"^(op|opcode|\w+_opcode)$")
CAST_TYPES = {"uint8_t", "uint16_t", "uint32_t", "uint64_t", "int", "unsigned", "int32_t", "char"}


@dataclass
class Tok:
    kind: str
    text: str
    line: int


def tokens(text: str) -> list[Tok]:
    out: list[Tok] = []
    line = 1
    for match in TOKEN.finditer(text):
        kind = match.lastgroup or "other"
        value = match.group()
        if kind in ("name", "number", "op"):
            out.append(Tok(kind, value, line))
        elif kind == "string":
            out.append(Tok("string", '""', line))
        line += value.count("\n")
    return _drop_preprocessor(out, text)


def _drop_preprocessor(toks: list[Tok], text: str) -> list[Tok]:
    """Without preprocessor lines (#define bodies are where names get their numbers, #if compares versions)."""
    directive_lines = set()
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("#"):
            while True:
                directive_lines.add(i + 1)
                if not lines[i].rstrip().endswith("\\") or i + 1 >= len(lines):
                    break
                i += 1
        i += 1
    return [t for t in toks if t.line not in directive_lines]


def _is_literal(tok: Tok) -> bool:
    return tok.kind == "number" and int(tok.text.rstrip("uUlL"), 0) != 0


def _group_end(toks: list[Tok], i: int) -> int:
    """Index after the bracket group opening at i."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].text in OPEN:
            depth += 1
        elif toks[j].text in CLOSE:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(toks)


def _group_start(toks: list[Tok], i: int) -> int:
    """Index of the bracket opening the group that closes at i."""
    depth = 0
    for j in range(i, -1, -1):
        if toks[j].text in CLOSE:
            depth += 1
        elif toks[j].text in OPEN:
            depth -= 1
            if depth == 0:
                return j
    return 0


def _operand_left(toks: list[Tok], i: int) -> tuple[int, int]:
    """The postfix expression ending just before i: [start, i)."""
    j = i - 1
    while j >= 0:
        t = toks[j]
        if t.text in (")", "]"):
            j = _group_start(toks, j) - 1
        elif t.kind in ("name", "number", "string"):
            j -= 1
        else:
            break
        if j >= 0 and toks[j].text in (".", "->"):
            j -= 1
            continue
        if j >= 0 and toks[j].kind == "name" and toks[j + 1].text in ("(", "["):
            continue
        break
    return j + 1, i


def _operand_right(toks: list[Tok], i: int) -> tuple[int, int]:
    """The unary and postfix expression starting at i + 1: [i + 1, end)."""
    j = i + 1
    while j < len(toks) and toks[j].text in ("!", "~", "-", "+", "*", "&"):
        j += 1
    while j + 2 < len(toks) and toks[j].text == "(" and toks[j + 1].text in CAST_TYPES and toks[j + 2].text == ")":
        j += 3  # a cast such as (uint8_t)
    while j < len(toks):
        t = toks[j]
        if t.text in OPEN:
            j = _group_end(toks, j)
        elif t.kind in ("name", "number", "string"):
            j += 1
        else:
            break
        if j < len(toks) and toks[j].text in (".", "->"):
            j += 1
            continue
        if j < len(toks) and toks[j].text in ("(", "["):
            continue
        break
    return i + 1, j


def _names_opcode(toks: list[Tok], start: int, end: int) -> bool:
    """Whether toks[start:end] is (or, bracketed, holds) an expression naming an opcode."""
    k = start
    while k < end:
        t = toks[k]
        following = toks[k + 1].text if k + 1 < end else ""
        if t.text in ("(", "[") and k > start and toks[k - 1].kind == "name":
            k = _group_end(toks, k)  # a call's arguments or a subscript: the operand is their result
            continue
        if t.kind == "name" and following not in (".", "->", "(") and OPCODE_NAME.match(t.text):
            return True
        k += 1
    return False


def _value_literals(toks: list[Tok], start: int, end: int) -> list[Tok]:
    """Non-zero literals of the value toks[start:end] outside calls, subscripts and ?: conditions."""
    found: list[Tok] = []
    question = [k for k in range(start, end) if toks[k].text == "?" and _depth(toks, start, k) == 0]
    lo = question[-1] + 1 if question else start  # the branches after the last top-level ?
    k = lo
    while k < end:
        t = toks[k]
        if t.text in ("(", "[") and k > lo and toks[k - 1].kind == "name":
            k = _group_end(toks, k)  # a call's arguments or a subscript: not the value itself
            continue
        if t.text == "[":
            k = _group_end(toks, k)
            continue
        if _is_literal(t):
            found.append(t)
        k += 1
    return found


def _depth(toks: list[Tok], start: int, k: int) -> int:
    depth = 0
    for t in toks[start:k]:
        if t.text in OPEN:
            depth += 1
        elif t.text in CLOSE:
            depth -= 1
    return depth


def _value_end(toks: list[Tok], i: int) -> int:
    """End of the value after an assignment at i: the next ';' or ',' or closing bracket at its depth."""
    depth = 0
    for j in range(i + 1, len(toks)):
        t = toks[j].text
        if t in OPEN:
            depth += 1
        elif t in CLOSE:
            if depth == 0:
                return j
            depth -= 1
        elif t in (";", ",") and depth == 0:
            return j
    return len(toks)


def findings_in(text: str, name: str) -> list[str]:
    toks = tokens(text)
    found: dict[int, str] = {}

    def flag(tok: Tok, why: str) -> None:
        found.setdefault(tok.line, f"{name}:{tok.line}: {tok.text} {why}: name it (wire.h) or ask its row")

    for i, t in enumerate(toks):
        if t.kind != "op":
            continue
        if t.text in BINARY and i > 0:
            left = _operand_left(toks, i)
            right = _operand_right(toks, i)
            for mine, other in ((left, right), (right, left)):
                if _names_opcode(toks, *mine):
                    for tok in toks[other[0]:other[1]]:
                        if _is_literal(tok):
                            flag(tok, f"{t.text} an opcode")
        elif t.text in ASSIGN and i > 0:
            target = _operand_left(toks, i)
            designated = toks[i - 2].text == "." if i >= 2 else False
            if _names_opcode(toks, *target) or (designated and OPCODE_NAME.match(toks[i - 1].text)):
                for tok in _value_literals(toks, i + 1, _value_end(toks, i)):
                    flag(tok, "given to an opcode")
        elif t.text == "{" and i >= 1 and toks[i - 1].text == ")":
            opening = _group_start(toks, i - 1)
            if opening >= 1 and toks[opening - 1].text == "switch" and _names_opcode(toks, opening + 1, i - 1):
                end = _group_end(toks, i)
                for k in range(i, end - 1):
                    if toks[k].text == "case" and _is_literal(toks[k + 1]):
                        flag(toks[k + 1], "as a case of a switch on an opcode")
    return [found[line] for line in sorted(found)]


def c_files() -> list[Path]:
    files = []
    for folder in SCOPE:
        files += [p for p in folder.rglob("*") if p.suffix in (".c", ".h") and p not in TABLE and
                  "_cffi" not in p.name and not p.name.startswith("_")]
    return sorted(files)


def check(files: list[Path] | None = None) -> list[str]:
    findings = []
    for path in files if files is not None else c_files():
        findings += findings_in(path.read_text(), rel(path))
    return findings
