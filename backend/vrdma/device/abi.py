"""The device API, loaded from the one C header the guest driver and provider also include.

``guest-driver/include/vrdma_dev_api.h`` and the two headers it includes (``vrdma_dev_ring.h``, the ring formats;
``vrdma_dev_cmd.h``, the control commands) are read as text: the parts between ``DEVICE-API-BEGIN`` and
``DEVICE-API-END`` (integer #defines and struct definitions) go to cffi's parser, in that order, so the layouts
here are the compiler's layouts, declared once. The headers' ``VRDMA_ASSERT_SIZE`` lines are checked against
cffi's sizes at import. The user ABI (``uapi/rdma/vrdma-abi.h``: what vrdma.ko and libvrdma alone exchange) is not
the device's business; :func:`user_abi` loads it the same way for the tests that hold the driver to it.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag
from pathlib import Path

from vrdma.headers import AbiError, LoadedHeader, load_header

# vrdma_dev_api.h and the two it includes, in the order their definitions build on each other.
DEVICE_API_HEADERS = [Path("guest-driver") / "include" / name
                      for name in ("vrdma_dev_api.h", "vrdma_dev_ring.h", "vrdma_dev_cmd.h")]
USER_ABI_HEADER = Path("guest-driver") / "include" / "uapi" / "rdma" / "vrdma-abi.h"


def user_abi() -> LoadedHeader:
    return load_header(USER_ABI_HEADER, "USER-ABI")


device_api = load_header(DEVICE_API_HEADERS, "DEVICE-API")
ffi, constants, asserted_sizes = device_api.ffi, device_api.constants, device_api.asserted_sizes


# The device API's structs by name (vrdma.headers.LoadedHeader): what every module of the device model calls.
const = device_api.const
new = device_api.new
to_bytes = device_api.to_bytes
from_bytes = device_api.from_bytes
sizeof = device_api.sizeof


def check_enum(enum: type[IntEnum] | type[IntFlag], prefix: str, exclude: tuple[str, ...] = ()) -> None:
    """Hold a Python enum to the header: its members are exactly the header's ``<prefix>*`` constants, same
    values (called at import by the modules that declare them, so a drift fails at once, naming the member).
    ``exclude``: names under the prefix that belong to another set (VRDMA_WC_OP_* beside the statuses)."""
    header = {name[len(prefix):]: value for name, value in constants.items()
              if name.startswith(prefix) and not name[len(prefix):].startswith(exclude or ("\0",))}
    ours = {member.name: int(member.value) for member in enum}
    if header != ours:
        differ = sorted(set(header.items()) ^ set(ours.items()))
        raise AbiError(f"{enum.__name__} disagrees with the header's {prefix}* constants: {differ}")
