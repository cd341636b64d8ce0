"""Build a cffi (API mode) extension next to its package, once per set of inputs.

Used by `make backend` for the two compiled parts of the backend (vrdma.vhost_user and vrdma.engine): the
module is rebuilt only when the hash of its inputs, kept in a stamp file beside it, changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import cffi


def inputs_key(paths: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def compile_in_place(ffi: cffi.FFI, package_dir: Path, stem: str, key: str, what: str) -> None:
    stamp = package_dir / f"{stem}.stamp"
    if stamp.exists() and stamp.read_text().strip() == key and list(package_dir.glob(f"{stem}*.so")):
        print(f"{what} is up to date")
        return
    build_dir = package_dir.parents[2] / "build" / "cffi"
    build_dir.mkdir(parents=True, exist_ok=True)
    built = Path(ffi.compile(tmpdir=str(build_dir), verbose=False))
    dest = package_dir / built.name
    dest.unlink(missing_ok=True)
    built.rename(dest)
    stamp.write_text(key + "\n")
    print(f"built {dest}")
