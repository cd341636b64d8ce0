"""cffi (API mode) build of the data engine: `python backend/vrdma/engine/_build.py` (run by `make backend`).

Run as a script, not as `-m vrdma.engine._build`: importing the package would import the module being built.
The cffi declarations are the text of engine.h between ENGINE-API-BEGIN and ENGINE-API-END; the engine is every
.c file here (one job each, see vre.h), which include the device API header (guest-driver/include/
vrdma_dev_api.h, or the copy an installed package carries) for the ring, WQE and CQE layouts. Warnings are errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vrdma._cffi_inplace import abi_include_dir, api_ffi, compile_in_place, device_api_headers, inputs_key  # noqa: E402

LIBRARIES = ["z"]


def sources() -> list[Path]:
    """The engine's C files (every one in this folder)."""
    return sorted(HERE.glob("*.c"))


def make_ffi() -> cffi.FFI:
    # zlib: its CRC-32 finishes what crc.c folds (and is all of it where the CPU has no PCLMULQDQ).
    return api_ffi("vrdma.engine._engine", [HERE / "engine.h", HERE / "state_format.h"], "ENGINE-API", sources(),
                   [HERE, abi_include_dir(HERE)],
                   libraries=LIBRARIES)


def main() -> None:
    key = inputs_key([*sources(), *sorted(HERE.glob("*.h")), Path(__file__), *device_api_headers(HERE),
                      HERE.parent / "_cffi_inplace.py"])
    compile_in_place(make_ffi(), HERE, "_engine", key, "data engine")


if __name__ == "__main__":
    main()
