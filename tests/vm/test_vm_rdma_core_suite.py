"""rdma-core's own test suite (shipped by python3-pyverbs) against vrdma0: the conformance yardstick.

The image keeps /usr/share/doc/rdma-core/tests; the test runs an unpacked copy (Debian gzips part of it) with
run_tests.py --dev vrdma0 and reports pass/skip/fail per module. Every module must have no failure and at least
the passes it has today (MIN_PASS), and every skip must be one of the device's documented limits
(docs/guest-driver.md), each skip's reason read whatever quotes unittest printed it in and counted against the
module's summary, so a new, unexplained skip fails the test as surely as a failure does. The rdma_cm module runs
its passive and active sides as two processes of one guest, over the guest's own IP address.
"""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import Iterator

import pytest

from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Products, Vm

pytestmark = pytest.mark.vm
log = logging.getLogger(__name__)

# Each module and the passes it has today (docs/guest-driver.md): a module that loses one fails the test, even when
# the test it lost became a skip with a documented reason (rdma-core says "Extended QP is not supported" for one
# unsupported opcode and for no extended QP at all alike). A pass gained is logged: raise the floor with it.
MIN_PASS = {"test_device": 14, "test_pd": 4, "test_mr": 13, "test_cq": 3, "test_cq_events": 2, "test_qp": 21,
            "test_qpex": 19, "test_srq": 2, "test_atomic": 9, "test_rdmacm": 7}
MODULES = list(MIN_PASS)
# Skip reasons that are real limits of the device (or of this machine), each documented in docs/guest-driver.md.
KNOWN_LIMITS = [
    r"Device memory is not supported",                        # no on-device memory (ibv_alloc_dm)
    r"Device /dev/dri/renderD128 is not present",             # dma-buf MRs need a GPU
    r"Create Raw Packet QP .*is not supported",               # RC, UC and UD queue pairs only
    r"SRQ resize is not supported",                           # SRQ rings live in user memory
    r"Resize CQ is not supported",                            # CQ rings too
    r"Multicast is not supported on this device",             # no multicast groups (ibv_attach_mcast)
    r"Extended QP is not supported on this device",           # no IBV_QP_EX_WITH_ATOMIC_WRITE (nor FLUSH)
    r"Create mr with IBV_ACCESS_FLUSH_GLOBAL access flag is not supported in kernel",  # FLUSH: Linux 6.2+
    r"Create custom mr with additional access flags 258 is not supported",  # ... which vrdma.ko refuses there
    r"To Create RAW QP must be done by root on Ethernet link layer",
]
SUMMARY = re.compile(r"^Ran (\d+) tests? in [\d.]+s\n\n(OK|FAILED)(?: \((.*)\))?$", flags=re.M)
# unittest prints a skip's reason with repr(): in single quotes, or in double quotes when the reason holds one
# ("No supported port is up, can't run traffic").
SKIPPED = re.compile(r"""skipped (?:'(.*?)'|"(.*?)")$""", flags=re.M)


@pytest.fixture(scope="module")
def guest(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(1, tmp_path_factory.mktemp("suite"), products=products) as cluster:
        yield cluster


def run_module(vm: Vm, module: str, gid: int) -> tuple[dict[str, int], list[str], str]:
    """One module through run_tests.py: its pass/skip/fail counts (unittest's own summary) and skip reasons."""
    result = vm.sh(f"cd /tmp/rdma-core-tests && python3 run_tests.py --dev vrdma0 --gid {gid} -v {module}",
                   timeout=900)
    output = result.stdout + result.stderr
    counts, reasons = parse_run(module, output)
    return counts, reasons, output


def parse_run(module: str, output: str) -> tuple[dict[str, int], list[str]]:
    """unittest's verbose output of one module: its pass/skip/fail counts and every skip's reason."""
    summary = SUMMARY.search(output)
    assert summary, f"{module}: no unittest summary:\n{output[-4000:]}"
    details = dict(item.split("=") for item in (summary.group(3) or "").split(", ") if "=" in item)
    ran, skipped = int(summary.group(1)), int(details.get("skipped", 0))
    failed = int(details.get("failures", 0)) + int(details.get("errors", 0))
    counts = {"pass": ran - skipped - failed, "skip": skipped, "fail": failed}
    reasons = [single or double for single, double in SKIPPED.findall(output)]
    assert len(reasons) == skipped, f"{module}: {skipped} skips, {len(reasons)} reasons read:\n{output[-4000:]}"
    return counts, reasons


def test_skip_reasons_are_read_in_both_quote_styles_and_counted() -> None:
    output = ("test_a (tests.test_qp.QPTest) ... ok\n"
              "test_b (tests.test_qp.QPTest) ... skipped 'Device memory is not supported'\n"
              "test_c (tests.test_qp.QPTest) ... skipped \"No supported port is up, can't run traffic\"\n"
              "\n----------------------------------------------------------------------\n"
              "Ran 3 tests in 0.5s\n\nOK (skipped=2)\n")
    counts, reasons = parse_run("test_qp", output)
    assert counts == {"pass": 1, "skip": 2, "fail": 0}
    assert reasons == ["Device memory is not supported", "No supported port is up, can't run traffic"]
    assert not any(re.search(pattern, reasons[1]) for pattern in KNOWN_LIMITS), "no documented limit"
    with pytest.raises(AssertionError, match="2 skips, 1 reasons read"):
        parse_run("test_qp", output.replace("skipped 'Device", "skip 'Device"))


def test_rdma_core_suite(guest: Cluster) -> None:
    vm = guest[0]
    gid = verbs.ipv4_gid_index(vm, "vrdma0")
    vm.sh("rm -rf /tmp/rdma-core-tests && cp -r /usr/share/doc/rdma-core/tests /tmp/rdma-core-tests && "
          "gunzip -f /tmp/rdma-core-tests/*.gz").check("unpacking rdma-core's tests")
    failures, unexplained, totals = {}, [], collections.Counter[str]()
    for module in MODULES:
        counts, reasons, output = run_module(vm, module, gid)
        log.info("rdma-core %-15s pass %3d  skip %3d  fail %3d", module, counts["pass"], counts["skip"],
                 counts["fail"])
        totals.update(counts)
        if counts["fail"] or counts["pass"] < MIN_PASS[module]:
            failures[module] = f"{counts['pass']} passed (at least {MIN_PASS[module]}), {counts['fail']} failed\n" + \
                output[-6000:]
        elif counts["pass"] > MIN_PASS[module]:
            log.info("rdma-core %s: %d passes, %d more than its floor: raise it", module, counts["pass"],
                     counts["pass"] - MIN_PASS[module])
        unexplained += [f"{module}: {r}" for r in reasons
                        if not any(re.search(pattern, r) for pattern in KNOWN_LIMITS)]
    assert not failures, "\n\n".join(f"{m}:\n{out}" for m, out in failures.items())
    assert not unexplained, "skips that are no documented limit of the device:\n" + "\n".join(unexplained)
