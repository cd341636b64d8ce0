"""Kernel consumers in a guest: vrdma_kverbs_test.ko (guest-driver/tests) uses the kernel verbs API on vrdma0 (a PD
with the local DMA lkey, a CQ with a completion handler, an RC QP posted to and polled with no command, and with
srq=1 a shared receive queue and its limit event, with frwr=1 fast registration, RDMA through the key it gives,
and local invalidation) and loads only if every completion and every byte was right."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def guest(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(1, tmp_path_factory.mktemp("kverbs"), products=products) as cluster:
        yield cluster


@pytest.mark.parametrize("params", [(), ("messages=8", "size=65536"), ("srq=1",), ("frwr=1",)],
                         ids=["64 x 5000 B", "8 x 64 KiB", "64 x 5000 B through an SRQ",
                              "then fast registration and invalidation"])
def test_the_kernel_verbs_test_module_moves_its_data_checked(guest: Cluster, params: tuple[str, ...]) -> None:
    vm = guest[0]
    assert guest.backend is not None
    before = vm_counters(guest.backend, "vm0")
    vm.run(["dmesg", "-c"]).check("dmesg -c")
    loaded = vm.run(["modprobe", "vrdma_kverbs_test", *params])
    log = vm.run(["dmesg"]).check("dmesg").stdout
    assert loaded.exit_status == 0, log
    messages, size = (8, 65536) if "size=65536" in params else (64, 5000)
    through_srq = "; receives through an SRQ, its limit event seen" if "srq=1" in params else ""
    found = re.search(rf"vrdma0: RC QP 0x[0-9a-f]+ to itself: {messages} messages of {size} bytes and one of 48 "
                      rf"inline sent, received and checked; (\d+) completion events{through_srq}$", log, re.M)
    assert found, log
    assert int(found.group(1)) >= 1  # the completion handler ran: the CQ was armed and the device raised events
    if "frwr=1" in params:
        assert re.search(rf"vrdma0: fast registration of \d+ pages \(key 0x[0-9a-f]+\): {messages * size} bytes "
                         r"written and read back through it, invalidated, the stale key refused", log), log
    vm.run(["rmmod", "vrdma_kverbs_test"]).check("rmmod vrdma_kverbs_test")
    after = vm_counters(guest.backend, "vm0")
    # The data went through the device's engine (not around it), and the module left no object behind.
    assert after["engine"]["bytes"] - before["engine"]["bytes"] >= messages * size + 48
    # (frwr=1 ends with its one intended error: a write through the invalidated key)
    assert after["engine"]["error_cqes"] - before["engine"]["error_cqes"] == ("frwr=1" in params)
    assert after["objects"] == before["objects"]
