"""The sanitizer tier: the backend-process tests (tests/backend/test_backend_*.py) against a `vrdma backend` whose C
(data engine, libvhost-user and its glue, fault guard) is built with AddressSanitizer and UndefinedBehaviorSanitizer.

fuzz/sanitize.py builds and launches it; tests/backend_process.py starts the backend that way when
VRDMA_SANITIZE=1 (ASan with no quarantine of freed memory there: several tests bound the backend's RSS growth)
and fails a test whose backend wrote a sanitizer report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fuzz import sanitize  # noqa: E402

pytestmark = pytest.mark.sanitize

# Tests the tier leaves out, with the reason (none so far).
NOT_UNDER_ASAN: list[str] = []
# Files of tests/backend that start no backend process (the tier runs every other one: each speaks vhost-user,
# control commands or RoCE to a backend).
NO_BACKEND_PROCESS = {
    "test_sanitizer_tier.py": "this tier itself",
    "test_fuzz_smoke.py": "the fuzzers, sanitized builds of their own",
    "test_fuzz_regressions.py": "the fuzzers' findings, replayed by the fuzzers",
    "test_harness_hosts.py": "the harness's network namespaces",
    "test_backend_roce_wire.py": "the engine's packet builder and parser in process, against scapy",
    "test_backend_roce_sockets.py": "packets between two namespaces' sockets, built and parsed in process",
}

# A doorbell region one page long for a device that says it has two, and a CQ whose arm slot is in page 1:
# creating it zeroes that slot, one page past the buffer. The normal build does not notice; the sanitizer build must.
OVERFLOW = """
from fuzz import sanitize
sanitize.install()
import mmap
from vrdma.engine.native import ffi, lib
engine = lib.vre_engine_new(1)
region = ffi.new("char[]", 4096)
ram_map = mmap.mmap(-1, 3 * 4096)  # page-aligned, as guest RAM is
ram = ffi.from_buffer(ram_map)     # guest page 0: the CQ ring's page list; pages 1 and 2: the ring
ffi.cast("uint64_t *", ram)[0:2] = [4096, 8192]
limits = ffi.new("struct vre_device_limits *", {"max_qp": 1, "max_cq": 1, "max_mr": 1, "max_srq": 1, "max_cqe": 128,
                                                "max_mr_pages": 16, "doorbell_pages": 2, "max_pages_total": 16})
assert lib.vre_device_open(engine, 0, limits, int(ffi.cast("uintptr_t", region))) == 0
memory = ffi.new("struct vre_region *", {"gpa": 0, "size": 3 * 4096, "hva": int(ffi.cast("uintptr_t", ram))})
assert lib.vre_device_set_memory(engine, 0, memory, 1) == 0
cq = ffi.new("struct vre_cq_config *", {"handle": 1, "entries": 128, "db": 1024 + 1,
                                        "ring": {"addr": 0, "npages": 2, "levels": 1}})
assert lib.vre_cq_create(engine, 0, 0, cq) == 0
print("not caught")
"""


def test_the_sanitizer_build_catches_an_overflow_in_the_engine() -> None:
    sanitize.build()
    result = subprocess.run([sys.executable, "-c", OVERFLOW], cwd=ROOT, env=sanitize.environment(), check=False,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "not caught" not in result.stdout, result.stdout + result.stderr
    assert "heap-buffer-overflow" in result.stderr and "vre_db_claim" in result.stderr, result.stderr
    assert sanitize.report_in(result.stderr)


@pytest.mark.timeout(1200)
@pytest.mark.skipif(os.environ.get("VRDMA_SANITIZE") == "1", reason="already inside the sanitizer tier")
def test_backend_tests_pass_under_asan_and_ubsan() -> None:
    sanitize.build()
    backend_tests = ROOT / "tests" / "backend"
    tests = sorted(str(p.relative_to(ROOT)) for p in backend_tests.rglob("test_*.py")
                   if str(p.relative_to(backend_tests)) not in NO_BACKEND_PROCESS)
    assert {"tests/backend/messages/test_framing.py", "tests/backend/test_vhost_user_layer.py",
            "tests/backend/commands/test_qp.py", "tests/backend/test_backend_roce_rc.py"} <= set(tests)
    env = dict(os.environ, VRDMA_SANITIZE="1")
    # A short base directory of its own: the tests' sockets live in it, and an AF_UNIX path has 107 bytes at most
    # (under this test's own tmp_path, the longest test names went past that).
    with tempfile.TemporaryDirectory(prefix="vrdma-asan-") as basetemp:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", basetemp, *tests,
                   *(arg for test in NOT_UNDER_ASAN for arg in ("--deselect", test))]
        result = subprocess.run(command, cwd=ROOT, env=env, check=False, capture_output=True, text=True,
                                timeout=1200)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    print(f"sanitizer tier: {summary}")
    assert result.returncode == 0, f"the backend tests under ASan/UBSan failed:\n{result.stdout[-30000:]}\n" \
                                   f"{result.stderr[-5000:]}"
