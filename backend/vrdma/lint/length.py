"""No source file longer than MAX_LINES: past it, a file holds more than one room (STYLE.md)."""

from __future__ import annotations

from pathlib import Path

from vrdma.lint.source import rel, source_files

MAX_LINES = 650


def check(files: list[Path] | None = None) -> list[str]:
    findings = []
    for path in files if files is not None else source_files():
        lines = path.read_bytes().count(b"\n")
        if lines > MAX_LINES:
            findings.append(f"{rel(path)}: {lines} lines (at most {MAX_LINES}): split it into rooms of one job each")
    return findings
