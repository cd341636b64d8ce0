"""The data engine's C files in layers, checked from what their object files define and call.

pyproject.toml's ``[tool.vrdma.engine-layers]`` lists the engine's files from the top layer down (the table
import-linter's contracts sit beside). Each file is compiled on its own (as the fuzzers link them: internal
functions are hidden symbols, not static) and ``nm`` says which functions and tables it defines and which it uses;
a file may use only what files of lower layers define. Two files of one layer use nothing of each other, so a
circle between rooms, or a base that reaches up into an object's room, fails ``make lint``. Every engine .c file
must be in the table: a new room is placed on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import tomllib
from collections import defaultdict
from pathlib import Path

from vrdma.lint.source import ABI_INCLUDE, ENGINE, ROOT

PYPROJECT = ROOT / "pyproject.toml"
COMPILERS = ("gcc-12", "gcc", "cc", "clang-14", "clang")


class LayersError(Exception):
    pass


def declared_layers(pyproject: Path = PYPROJECT) -> list[list[str]]:
    """The layers, top first: each a list of file stems (``poll`` for poll.c)."""
    table = tomllib.loads(pyproject.read_text()).get("tool", {}).get("vrdma", {}).get("engine-layers", {})
    layers = table.get("layers")
    if not isinstance(layers, list) or not all(isinstance(layer, list) for layer in layers):
        raise LayersError(f"{pyproject.name} has no [tool.vrdma.engine-layers] layers = [[...], ...]")
    return [[str(name) for name in layer] for layer in layers]


def compiler() -> str:
    for name in (os.environ.get("CC"), *COMPILERS):
        if name and shutil.which(name):
            return name
    raise LayersError("no C compiler found (make deps installs gcc-12)")


def symbols(sources: list[Path], include: list[Path]) -> tuple[dict[str, str], dict[str, set[str]]]:
    """What each source defines (symbol -> file stem) and uses (file stem -> symbols), from its object file."""
    defined: dict[str, str] = {}
    used: dict[str, set[str]] = defaultdict(set)
    cc = compiler()
    with tempfile.TemporaryDirectory(prefix="vrdma-layers-") as tmp:
        for source in sources:
            obj = Path(tmp) / (source.stem + ".o")
            result = subprocess.run([cc, "-c", "-O0", "-w", *(f"-I{d}" for d in include), "-o", str(obj), str(source)],
                                    capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise LayersError(f"compiling {source.name} failed:\n{result.stderr}")
            listing = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
            for line in listing.splitlines():
                fields = line.split()
                if len(fields) == 3 and fields[1] in "TDRBC":
                    defined[fields[2]] = source.stem
                elif len(fields) == 2 and fields[0] == "U":
                    used[source.stem].add(fields[1])
    return defined, used


def check(folder: Path = ENGINE, pyproject: Path = PYPROJECT, include: list[Path] | None = None) -> list[str]:
    layers = declared_layers(pyproject)
    level: dict[str, int] = {}
    findings = []
    for depth, layer in enumerate(reversed(layers)):  # the bottom layer is 0
        for stem in layer:
            if stem in level:
                findings.append(f"{pyproject.name}: {stem}.c is in two layers")
            level[stem] = depth
    sources = sorted(folder.glob("*.c"))
    for source in sources:
        if source.stem not in level:
            findings.append(f"{source.name}: in no layer of {pyproject.name}'s [tool.vrdma.engine-layers]: place it")
    for stem in level:
        if not (folder / f"{stem}.c").is_file():
            findings.append(f"{pyproject.name}: layer entry {stem}.c is not a file of {folder.name}/")
    if findings:
        return findings
    defined, used = symbols(sources, include if include is not None else [folder, ABI_INCLUDE])
    for stem in sorted(used):
        for symbol in sorted(used[stem]):
            owner = defined.get(symbol)
            if owner is None or owner == stem:
                continue  # the C library, zlib, or itself
            if level[owner] >= level[stem]:
                where = "the same layer" if level[owner] == level[stem] else f"layer {level[owner]}, above its own"
                findings.append(f"{stem}.c (layer {level[stem]}) uses {symbol} of {owner}.c ({where}): "
                                f"a file uses only the layers below it")
    return findings
