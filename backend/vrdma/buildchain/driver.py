"""`make driver`: vrdma.ko and the kernel test modules built against the guest kernel's Debian headers, with W=1
and no warning allowed.

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
from vrdma.buildchain.cache import CachedProduct, capture, product, record_product, run, step
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


def build() -> dict[str, Any]:
    kernel = product("kernel")
    cached = CachedProduct("driver", {"kernel": kernel["version"], "release": kernel["release"],
                                      "sources": sources_digest(), "recipe": RECIPE_VERSION})
    if not cached.complete:
        with cached.building() as scratch, step("building vrdma.ko and its test modules against the guest kernel "
                                                "headers (W=1)"):
            for sub in SOURCE_DIRS:
                shutil.copytree(source_root() / sub, scratch / sub)
            for sub in MODULE_DIRS:
                build_log = scratch / f"build-{sub}.log"
                run(["make", "-C", kernel["headers_dir"], f"M={scratch / sub}", "W=1", "modules"],
                    log_file=build_log)
                warnings = [line for line in build_log.read_text().splitlines() if re.search(r"\bwarning:", line)]
                if warnings:
                    raise BuildError(f"guest-driver/{sub} must build without warnings (W=1):\n" +
                                     "\n".join(warnings[:20]))
            for module in (scratch / "kernel" / "vrdma.ko",
                           *(scratch / "tests" / f"{name}.ko" for name in TEST_MODULES)):
                vermagic = capture(["modinfo", "-F", "vermagic", module]).split()
                if not vermagic or vermagic[0] != kernel["release"]:
                    raise BuildError(f"{module.name} was built for {vermagic[:1]}, not {kernel['release']}")
    info = {"module_path": str(cached.path / "kernel" / "vrdma.ko"),
            "test_modules": [str(cached.path / "tests" / f"{name}.ko") for name in TEST_MODULES],
            "release": kernel["release"], "key": cached.key}
    record_product("driver", info)
    log.info("vrdma.ko for %s: %s", kernel["release"], info["module_path"])
    return info
