"""Where the project's sources are, for the lint rules."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "backend" / "vrdma" / "engine"
ABI_INCLUDE = ROOT / "guest-driver" / "include"
SOURCE_SUFFIXES = (".c", ".h", ".py", ".sh")
# Never the project's own text: generated, fetched or built.
SKIPPED_TOP = ("build", ".venv")


def tracked_files() -> list[Path]:
    """The checkout's files: those git tracks and those it would (new, not ignored) when it is a git checkout,
    else every file outside build and .venv."""
    try:
        command = ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        listed = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [path for path in ROOT.rglob("*")
                if path.is_file() and path.relative_to(ROOT).parts[0] not in SKIPPED_TOP]


def source_files() -> list[Path]:
    return sorted(path for path in tracked_files() if path.suffix in SOURCE_SUFFIXES)


def rel(path: Path) -> str:
    """A path as the findings name it: from the checkout's root when it is in the checkout."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
