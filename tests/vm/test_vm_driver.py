"""vrdma.ko against a misbehaving device: every bad response is logged, turned into an errno, and survived."""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vrdma.device.objects import OBJECT_KINDS
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import admin, vm_counters
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm
log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def guest(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(1, tmp_path_factory.mktemp("driver"), products=products, test_hooks=True) as cluster:
        yield cluster


def reload_driver(cluster: Cluster, fault: str | None = None) -> str:
    """rmmod + modprobe vrdma; with ``fault``, the re-probe's first command (QUERY_DEVICE) meets it. Returns the
    kernel log lines of the reload."""
    vm = cluster[0]
    vm.run(["rmmod", "vrdma"]).check("rmmod vrdma")
    vm.run(["dmesg", "-c"]).check("dmesg -c")  # print and clear (busybox dmesg)
    if fault is not None:
        assert cluster.backend is not None
        assert admin(cluster.backend, {"command": "inject", "vm": "vm0", "fault": fault}) == {"ok": True}
    vm.run(["modprobe", "vrdma"]).check("modprobe vrdma")
    return vm.run(["dmesg"]).check("dmesg").stdout


def bound(cluster: Cluster) -> bool:
    return any(n.startswith("virtio") for n in cluster[0].sh("ls /sys/bus/virtio/drivers/vrdma/").stdout.split())


def counters(cluster: Cluster) -> dict[str, Any]:
    assert cluster.backend is not None
    return vm_counters(cluster.backend, "vm0")


def test_vrdma0_is_an_active_roce_device_on_eth0(guest: Cluster) -> None:
    link = guest[0].run(["rdma", "link", "show"]).check("rdma link show").stdout
    assert "link vrdma0/1 state ACTIVE physical_state LINK_UP netdev eth0" in link, link
    # The RDMA core built the GID table from eth0's addresses and the driver forwarded it to the backend.
    index = verbs.ipv4_gid_index(guest[0], "vrdma0")
    ipv4_gid = "0000:0000:0000:0000:0000:ffff:a9fe:6401"  # ::ffff:169.254.100.1
    assert guest[0].run(["cat", f"/sys/class/infiniband/vrdma0/ports/1/gids/{index}"]).stdout.strip() == ipv4_gid
    assert counters(guest)["gids"][str(index)] == ipv4_gid


def test_rmmod_leaves_nothing_behind_in_the_backend(guest: Cluster) -> None:
    resets = counters(guest)["connection"]["device_resets"]
    guest[0].run(["rmmod", "vrdma"]).check("rmmod vrdma")
    left = counters(guest)
    assert left["objects"] == dict.fromkeys(OBJECT_KINDS, 0) and left["gids"] == {}
    # The driver's reset reached the backend as RESET_DEVICE (our QEMU's vhost-user-base has get_vhost): a
    # reset, not the stop that the queues stopping alone would be.
    assert left["connection"]["device_resets"] > resets and not left["connection"]["suspended"]
    guest[0].run(["modprobe", "vrdma"]).check("modprobe vrdma")
    assert "vrdma0/1 state ACTIVE" in guest[0].run(["rdma", "link", "show"]).stdout
    assert counters(guest)["objects"]["gid"] > 0


def test_driver_reloads_cleanly(guest: Cluster) -> None:
    assert bound(guest)
    dmesg = reload_driver(guest)
    assert f"vrdma device: max_qp {DEFAULT_LIMITS.max_qp}" in dmesg and bound(guest)


@pytest.mark.parametrize(("fault", "logged", "errno"), [
    ("wrong-opcode", "response is for command 2 seq", -5),
    ("wrong-seq", "response is for command 1 seq", -5),
    ("short-response", "short response, 8 of 120 bytes", -5),
    ("bad-status", "QUERY_DEVICE failed: -5", -5),
])
def test_bad_response_is_logged_refused_and_survived(guest: Cluster, fault: str, logged: str, errno: int) -> None:
    dmesg = reload_driver(guest, fault)
    assert logged in dmesg, dmesg
    assert f"QUERY_DEVICE failed: {errno}" in dmesg, dmesg
    # The driver core's words: "probe of virtioN failed" in 6.1, "probe with driver vrdma failed" in 6.12 and later.
    assert re.search(rf"(probe of virtio\d+|probe with driver vrdma) failed with error {errno}", dmesg), dmesg
    assert not bound(guest)
    assert guest[0].run(["true"]).exit_status == 0  # the guest keeps running
    assert f"vrdma device: max_qp {DEFAULT_LIMITS.max_qp}" in reload_driver(guest)  # and a good device binds again
    assert bound(guest)


def test_backend_counters_follow_the_driver(guest: Cluster) -> None:
    assert guest.backend is not None
    before = counters(guest)
    reload_driver(guest)
    after = counters(guest)
    assert after["by_opcode"]["QUERY_DEVICE"] == before["by_opcode"]["QUERY_DEVICE"] + 1
    assert after["by_opcode"]["QUERY_PORT"] == before["by_opcode"]["QUERY_PORT"] + 1


UVERBS = (Path(__file__).parents[1] / "guest" / "uverbs.py").read_text()


def test_each_process_maps_only_its_own_doorbell_page(guest: Cluster) -> None:
    result = guest[0].run(["python3", "-c", UVERBS, "contexts", "vrdma-test"]).check("two user contexts")
    parent, child = json.loads(result.stdout)
    assert parent["pid"] != child["pid"]
    assert parent["doorbell_page"] != child["doorbell_page"]
    assert parent["foreign_mmap"] == child["foreign_mmap"] == "Invalid argument"  # not theirs: refused
    # What each process wrote through its mapping is in its own page of the backend's doorbell region.
    region = (guest.directory / "backend" / "vm0.doorbell").read_bytes()
    for who, info in (("parent", parent), ("child", child)):
        page = region[info["doorbell_page"] * 4096:][:32]
        expected = f"vrdma-test-{who}".encode()
        assert page.startswith(expected + struct.pack("<I", info["doorbell_page"])), page
    assert counters(guest)["objects"]["ucontext"] == 0  # both processes exited: their contexts are gone


def test_thousand_pds_from_user_space_leave_nothing_behind(guest: Cluster) -> None:
    result = guest[0].run(["python3", "-c", UVERBS, "pds", "1000"]).check("1000 PDs")
    assert json.loads(result.stdout) == {"allocated": 1000, "distinct_pdn": 1000}
    after = counters(guest)
    assert after["objects"]["pd"] == verbs.MAD_OBJECTS["pd"] and after["objects"]["ucontext"] == 0
    assert after["by_opcode"]["ALLOC_PD"] >= 1000 and after["by_opcode"]["DEALLOC_PD"] >= 1000


RELOAD = (Path(__file__).parents[1] / "guest" / "reload.py").read_text()
# make test runs a few; `make fuzz` runs the 1,000 (fuzz/run.py sets VRDMA_RELOAD_CYCLES).
RELOAD_CYCLES = int(os.environ.get("VRDMA_RELOAD_CYCLES", "100"))
RELOAD_WARMUP = 5


def private_memory(pid: int) -> int:
    """The backend's anonymous resident memory (RssAnon). Its RSS also counts the pages of guest RAM it has touched,
    which grows as each cycle's rings and MRs land on other guest pages, up to the guest's RAM: not the backend's."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")


def test_driver_reload_cycles_with_objects_open_leak_nothing(guest: Cluster) -> None:
    """`rmmod vrdma; modprobe vrdma` while a process holds a context, PD, CQ, QP (with a posted receive) and MR.

    Each unload disassociates the process (IBV_EVENT_DEVICE_FATAL, posts fail, every close returns) and each load
    brings vrdma0 back. After a warm-up, RELOAD_CYCLES cycles leave the backend as they found it: no objects but the
    GIDs, no doorbell page, the same fds, private memory within 1 MiB; and the guest's slab within 1 MiB. (The
    guest's free pages are logged, not bounded: they move by tens of MiB between runs of 100 cycles whether or not
    the module is reloaded, and come back, so they cannot tell a leak from the page allocator's own caching.)"""
    backend = guest.backend
    assert backend is not None and backend.process is not None
    vm = guest[0]
    argv = ["python3", "-c", RELOAD, "reload"]
    vm.run([*argv, str(RELOAD_WARMUP), "60"], timeout=600).check("warm-up reload cycles")
    # fds first: counters() opens an admin connection, which the backend closes a moment after it answers.
    rss, fds = private_memory(backend.process.pid), backend.process.num_fds()
    baseline = counters(guest)

    result = vm.run([*argv, str(RELOAD_CYCLES), "60"], timeout=120 + 60 * RELOAD_CYCLES).check("reload cycles")

    report = json.loads(result.stdout)
    assert report["cycles"] == RELOAD_CYCLES
    assert backend.process.num_fds() == fds
    after = counters(guest)
    assert after["objects"] == baseline["objects"] and set(after["objects"]) == set(OBJECT_KINDS)
    assert {kind: n for kind, n in after["objects"].items() if n and kind != "gid"} == verbs.MAD_OBJECTS, \
        after["objects"]
    assert after["doorbell_pages"] == baseline["doorbell_pages"] == []
    grown = private_memory(backend.process.pid) - rss
    slab = report["after"]["Slab"] - report["before"]["Slab"]
    seconds = report["seconds"]
    log.info("%d reload cycles: %.2f s median per cycle (rmmod %.2f s, modprobe to ready %.2f s), backend private "
             "memory %+d KiB, guest slab %+d kB, guest MemAvailable %+d kB", RELOAD_CYCLES, seconds["cycle"]["median"],
             seconds["rmmod"]["median"], seconds["modprobe"]["median"], grown >> 10, slab,
             report["after"]["MemAvailable"] - report["before"]["MemAvailable"])
    assert grown < 1 << 20, f"backend private memory grew {grown} bytes over {RELOAD_CYCLES} reload cycles"
    assert slab < 1024, f"guest slab grew {slab} kB over {RELOAD_CYCLES} reload cycles"
