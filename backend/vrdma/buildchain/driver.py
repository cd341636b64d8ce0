"""`make driver`: vrdma.ko and the kernel test modules built against each guest kernel's Debian headers (in its
build root, with its release's compiler: buildchain.kernel), with W=1 and no warning allowed.

The sources (guest-driver/kernel, guest-driver/tests and the headers in guest-driver/include) are copied into the
product directory and built there, so the checkout stays free of build output. guest-driver/tests holds kernel
consumers that test vrdma.ko from inside the guest (vrdma_kverbs_test.ko: the kernel verbs API on an RC QP, data
checked; vrdma_kverbs_ud.ko: a UD ping-pong between two guests over the kernel's rdma_cm).
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from vrdma import paths
from vrdma.buildchain import kernel
from vrdma.buildchain.cache import CachedProduct, step
from vrdma.errors import BuildError

log = logging.getLogger(__name__)

RECIPE_VERSION = 2
SOURCE_DIRS = ("kernel", "tests", "include")
MODULE_DIRS = ("kernel", "tests")  # each a Kbuild directory
TEST_MODULES = ("vrdma_kverbs_test", "vrdma_kverbs_ud")  # guest-driver/tests/Kbuild's, shipped in the image


def source_root() -> Path:
    return paths.project_root() / "guest-driver"


def sources_digest(subdirs: tuple[str, ...] = SOURCE_DIRS) -> str:
    """Hash of the named guest-driver/ subdirectories' files (names and contents)."""
    digest = hashlib.sha256()
    for sub in subdirs:
        for path in sorted((source_root() / sub).rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(source_root())).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build(kernel_name: str = kernel.DEFAULT_KERNEL) -> dict[str, Any]:
    target = kernel.kernel_product("kernel", kernel_name)
    cached = CachedProduct("driver", {"kernel": target["version"], "release": target["release"],
                                      "sources": sources_digest(), "recipe": RECIPE_VERSION})
    if not cached.complete:
        with cached.building() as scratch, step(f"building vrdma.ko and its test modules against {kernel_name}'s "
                                                f"kernel headers, {target['release']} (W=1)"):
            for sub in SOURCE_DIRS:
                shutil.copytree(source_root() / sub, scratch / sub)
            for sub in MODULE_DIRS:
                build_log = scratch / f"build-{sub}.log"
                kernel.kbuild(target, scratch, sub, build_log, "W=1")
                warnings = [line for line in build_log.read_text().splitlines() if re.search(r"\bwarning:", line)]
                if warnings:
                    raise BuildError(f"guest-driver/{sub} must build without warnings (W=1) for "
                                     f"{target['release']}:\n" + "\n".join(warnings[:20]))
            for module in (scratch / "kernel" / "vrdma.ko",
                           *(scratch / "tests" / f"{name}.ko" for name in TEST_MODULES)):
                kernel.check_vermagic(module, target["release"])
    info = {"module_path": str(cached.path / "kernel" / "vrdma.ko"),
            "test_modules": [str(cached.path / "tests" / f"{name}.ko") for name in TEST_MODULES],
            "release": target["release"], "key": cached.key}
    kernel.record_kernel_product("driver", kernel_name, info)
    log.info("vrdma.ko for %s: %s", target["release"], info["module_path"])
    return info
