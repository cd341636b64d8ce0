"""cffi (API mode) build of the benchmark's load generator (a guest side at C speed):
`python backend/vrdma/testing/_loadgen_build.py` (run by `make backend`). The API is loadgen.h's LOADGEN-API
section; see loadgen.c.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vrdma._cffi_inplace import abi_include_dir, api_ffi, compile_in_place, device_api_headers, inputs_key  # noqa: E402


def make_ffi() -> cffi.FFI:
    return api_ffi("vrdma.testing._loadgen", HERE / "loadgen.h", "LOADGEN-API", HERE / "loadgen.c",
                   [HERE, abi_include_dir(HERE)])


def main() -> None:
    key = inputs_key([HERE / "loadgen.c", HERE / "loadgen.h", Path(__file__), *device_api_headers(HERE),
                      HERE.parent / "_cffi_inplace.py"])
    compile_in_place(make_ffi(), HERE, "_loadgen", key, "benchmark load generator")


if __name__ == "__main__":
    main()
