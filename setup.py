"""Build hook for the compiled parts of the package: the data engine and the binding to QEMU's libvhost-user.

Metadata lives in pyproject.toml. The data engine (vrdma/engine/*.c) needs nothing but a C compiler. The
binding compiles from the QEMU source tree that `make qemu` keeps (or VRDMA_LIBVHOST_USER_DIR): with it,
`pip install .` builds the extension into the package; without it (a first `make deps`, before QEMU exists) the
package installs without the extension and `make backend` builds it later. An editable install builds neither:
`make backend` builds both in place.
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).parent / "backend"))


def _libvhost_user_available() -> bool:
    try:
        from vrdma.vhost_user._build import libvhost_user_dir
        return (libvhost_user_dir() / "libvhost-user.c").is_file()
    except Exception:  # no QEMU product recorded yet
        return False


# The device API and the container channel (the layouts the backend loads), and the user ABI (the driver tests hold
# the driver to it).
ABI_HEADERS = [Path("guest-driver") / "include" / "vrdma_dev_api.h",
               Path("guest-driver") / "include" / "vrdma_dev_ring.h",
               Path("guest-driver") / "include" / "vrdma_dev_cmd.h",
               Path("guest-driver") / "include" / "vrdma_channel.h",
               Path("guest-driver") / "include" / "uapi" / "rdma" / "vrdma-abi.h"]


class BuildPyWithAbiHeader(build_py):
    """Ship the ABI headers inside the package: the backend loads its layouts from that text."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the header from the checkout
        for header in ABI_HEADERS:
            target = Path(self.build_lib) / "vrdma" / "device" / header.name
            self.mkpath(str(target.parent))
            self.copy_file(str(Path(__file__).parent / header), str(target))


editable = any(arg.startswith(("editable_wheel", "develop")) for arg in sys.argv)
use_cffi = not editable and not os.environ.get("VRDMA_NO_CFFI_BUILD")
modules = (["backend/vrdma/engine/_build.py:make_ffi", "backend/vrdma/faultguard/_build.py:make_ffi",
            "backend/vrdma/testing/_loadgen_build.py:make_ffi"] if use_cffi else [])
if use_cffi and _libvhost_user_available():
    modules.append("backend/vrdma/vhost_user/_build.py:make_ffi")
setup(cffi_modules=modules,
      cmdclass={"build_py": BuildPyWithAbiHeader})
