"""Build a cffi (API mode) extension next to its package, once per set of inputs.

Used by `make backend` for the two compiled parts of the backend (vrdma.vhost_user and vrdma.engine): the
module is rebuilt only when the hash of its inputs, kept in a stamp file beside it, changes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

import cffi

# Warnings are errors in the project's own C.
CFLAGS = ["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fno-strict-aliasing"]


DEVICE_API_HEADER = "vrdma_dev_api.h"
# The device API is three headers (vrdma_dev_api.h includes the other two): every build keyed by it hashes all three.
DEVICE_API_HEADERS = (DEVICE_API_HEADER, "vrdma_dev_ring.h", "vrdma_dev_cmd.h")


def abi_include_dir(package_dir: Path) -> Path:
    """Where the device API header (vrdma_dev_api.h) is: the installed package's copy, or the checkout's
    guest-driver/include."""
    packaged = package_dir.parents[0] / "device"
    if (packaged / DEVICE_API_HEADER).is_file():
        return packaged
    return package_dir.parents[2] / "guest-driver" / "include"


def device_api_headers(package_dir: Path) -> list[Path]:
    """The device API's headers as a build of ``package_dir`` includes them: what its inputs key must hash."""
    return [abi_include_dir(package_dir) / name for name in DEVICE_API_HEADERS]


def api_ffi(module: str, header: Path | list[Path], marker: str, source: Path | list[Path],
            include_dirs: list[Path], libraries: list[str] | None = None) -> cffi.FFI:
    """An API-mode FFI for C whose header declares its API between /* <marker>-BEGIN */ and -END: that text is
    the cffi declaration, so the API is declared once. ``source``: one C file, or a list of C files, compiled as
    the module's one translation unit (a list is #included in order: the files stay apart in the tree while the
    compiler sees them whole and inlines across them, as it did when they were one file; split into separate
    units, the data engine's 8-byte WRITE rate fell by 14%). ``libraries``: linked in (-l). Warnings are errors.
    Several headers: their sections declared in order (a later one may use the types of an earlier one)."""
    ffi = cffi.FFI()
    for path in header if isinstance(header, list) else [header]:
        match = re.search(rf"/\* {marker}-BEGIN \*/(.*)/\* {marker}-END \*/", path.read_text(), flags=re.S)
        if match is None:
            raise SystemExit(f"{path} has no {marker}-BEGIN/END section")
        ffi.cdef(re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S))
    if isinstance(source, Path):
        ffi.set_source(module, source.read_text(), include_dirs=[str(d) for d in include_dirs],
                       extra_compile_args=CFLAGS, libraries=libraries or [])
    else:
        unit = "#define VRE_ONE_UNIT\n" + "".join(f'#include "{path.name}"\n' for path in source)
        ffi.set_source(module, unit, include_dirs=[str(d) for d in include_dirs], extra_compile_args=CFLAGS,
                       libraries=libraries or [])
    return ffi


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
