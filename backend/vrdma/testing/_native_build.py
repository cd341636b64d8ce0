"""cffi (API mode) build of the benchmark's native guest side: `python backend/vrdma/testing/_native_build.py`
(run by `make backend`). The API is native.h's NATIVE-API section; see native.c.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vrdma._cffi_inplace import DEVICE_API_HEADER, abi_include_dir, api_ffi, compile_in_place, inputs_key  # noqa: E402


def make_ffi() -> cffi.FFI:
    return api_ffi("vrdma.testing._native", HERE / "native.h", "NATIVE-API", HERE / "native.c",
                   [HERE, abi_include_dir(HERE)])


def main() -> None:
    key = inputs_key([HERE / "native.c", HERE / "native.h", Path(__file__), abi_include_dir(HERE) / DEVICE_API_HEADER,
                      HERE.parent / "_cffi_inplace.py"])
    compile_in_place(make_ffi(), HERE, "_native", key, "native benchmark driver")


if __name__ == "__main__":
    main()
