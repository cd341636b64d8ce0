"""cffi (API mode) build of the data engine: `python backend/vrdma/engine/_build.py` (run by `make backend`).

Run as a script, not as `-m vrdma.engine._build`: importing the package would import the module being built.

The cffi declarations are the text of engine.h between ENGINE-API-BEGIN and ENGINE-API-END, so the API is
declared once; engine.c includes the device ABI header (guest-driver/include/uapi/rdma/vrdma-abi.h, or the copy an
installed package carries) for the ring, WQE and CQE layouts. Warnings are errors.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
CFLAGS = ["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fno-strict-aliasing"]


def abi_include_dir() -> Path:
    packaged = HERE.parent / "device"
    if (packaged / "vrdma-abi.h").is_file():
        return packaged
    return HERE.parents[2] / "guest-driver" / "include" / "uapi" / "rdma"


def api_text() -> str:
    text = (HERE / "engine.h").read_text()
    match = re.search(r"/\* ENGINE-API-BEGIN \*/(.*)/\* ENGINE-API-END \*/", text, flags=re.S)
    if match is None:
        raise SystemExit("engine.h has no ENGINE-API-BEGIN/END section")
    return re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)


def make_ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(api_text())
    # One translation unit: engine.c is included as text (setuptools refuses sources outside the package dir
    # in some layouts, and this keeps the recipe the same for `make backend` and `pip install .`).
    ffi.set_source("vrdma.engine._engine", (HERE / "engine.c").read_text(),
                   include_dirs=[str(HERE), str(abi_include_dir())], extra_compile_args=CFLAGS)
    return ffi


def main() -> None:
    sys.path.insert(0, str(HERE.parents[1]))
    from vrdma._cffi_inplace import compile_in_place, inputs_key

    key = inputs_key([HERE / "engine.c", HERE / "engine.h", Path(__file__), abi_include_dir() / "vrdma-abi.h"])
    compile_in_place(make_ffi(), HERE, "_engine", key, "data engine")


if __name__ == "__main__":
    main()
