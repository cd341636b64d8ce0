"""python -m vrdma.lint [--only RULE]: the project's own lint rules (see vrdma.lint), as `make lint` runs them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from vrdma.lint import layers, length, opcodes

RULES: dict[str, tuple[str, Callable[[], list[str]]]] = {
    "length": ("source files of at most 650 lines", length.check),
    "opcodes": ("no opcode literal outside the wire opcode table", opcodes.check),
    "layers": ("the engine's C files call only the layers below them", layers.check),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vrdma.lint", description=__doc__)
    parser.add_argument("--only", choices=sorted(RULES), action="append",
                        help="run this rule only (repeatable; default: every rule)")
    args = parser.parse_args(argv)
    failed = 0
    for name in args.only or list(RULES):
        what, rule = RULES[name]
        try:
            findings = rule()
        except layers.LayersError as err:
            findings = [str(err)]
        for finding in findings:
            print(f"  {finding}")
        print(f"[lint] {name}: {what}: {'ok' if not findings else f'{len(findings)} finding(s)'}")
        failed += bool(findings)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
