"""cffi (API mode) build of the fault guard: `python backend/vrdma/faultguard/_build.py` (run by `make backend`).

Run as a script: importing the package would import the module being built.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vrdma._cffi_inplace import api_ffi, compile_in_place, inputs_key  # noqa: E402


def make_ffi() -> cffi.FFI:
    return api_ffi("vrdma.faultguard._faultguard", HERE / "faultguard.h", "FAULTGUARD-API", HERE / "faultguard.c",
                   [HERE])


def main() -> None:
    key = inputs_key([HERE / "faultguard.c", HERE / "faultguard.h", Path(__file__),
                      HERE.parent / "_cffi_inplace.py"])
    compile_in_place(make_ffi(), HERE, "_faultguard", key, "fault guard")


if __name__ == "__main__":
    main()
