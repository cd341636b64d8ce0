"""libvrdma, the rdma-core provider: unmodified libibverbs tools and pyverbs see vrdma0 and use it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vrdma.device.params import DEFAULT_LIMITS
from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import admin, vm_counters
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm

PYVERBS = (Path(__file__).parents[1] / "guest" / "pyverbs_check.py").read_text()
IPV4_GID = "::ffff:169.254.100.1"  # vm0's address, as ibv_devinfo prints an IPv4-mapped GID


@pytest.fixture(scope="module")
def guest(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(1, tmp_path_factory.mktemp("provider"), products=products, test_hooks=True) as cluster:
        yield cluster


def counters(cluster: Cluster) -> dict[str, Any]:
    assert cluster.backend is not None
    return vm_counters(cluster.backend, "vm0")


def pyverbs(cluster: Cluster, *args: str) -> Any:
    result = cluster[0].run(["python3", "-c", PYVERBS, *args]).check("pyverbs " + " ".join(args))
    return json.loads(result.stdout)


def test_ibv_devices_lists_vrdma0(guest: Cluster) -> None:
    out = guest[0].run(["ibv_devices"]).check("ibv_devices").stdout
    assert re.search(r"^\s+vrdma0\s+[0-9a-f]{16}$", out, flags=re.M), out


def test_ibv_devinfo_shows_an_active_roce_port_with_the_ipv4_gid(guest: Cluster) -> None:
    out = guest[0].run(["ibv_devinfo", "-v", "-d", "vrdma0"]).check("ibv_devinfo -v -d vrdma0").stdout
    assert re.search(r"^\s+state:\s+PORT_ACTIVE \(4\)$", out, flags=re.M), out
    assert re.search(r"^\s+link_layer:\s+Ethernet$", out, flags=re.M), out
    assert re.search(r"^\s+fw_ver:\s+0\.0\.1$", out, flags=re.M), out
    gid = re.search(r"GID\[\s*(\d+)\]:\s+" + re.escape(IPV4_GID) + r", RoCE v2", out)
    assert gid, out
    # The same GID, at the same index, is in the backend's table for this VM.
    index = gid.group(1)
    assert index == str(verbs.ipv4_gid_index(guest[0], "vrdma0"))
    assert counters(guest)["gids"][index] == "0000:0000:0000:0000:0000:ffff:a9fe:6401"
    # Opening the device gave the process a user context; closing it gave it back.
    assert counters(guest)["objects"]["ucontext"] == 0


def test_pyverbs_queries_what_the_backend_advertises(guest: Cluster) -> None:
    attrs = pyverbs(guest, "query", "vrdma0")
    assert guest.backend is not None
    device = vm_counters(guest.backend, "vm0")
    assert attrs["phys_port_cnt"] == 1 and attrs["fw_ver"] == "0.0.1"
    assert attrs["max_qp"] == DEFAULT_LIMITS.max_qp and attrs["max_cq"] == DEFAULT_LIMITS.max_cq
    assert attrs["port_state"] == 4 and attrs["link_layer"] == 2  # ACTIVE, Ethernet
    assert attrs["gid_tbl_len"] >= len(device["gids"])


def test_thousand_pds_through_pyverbs_leave_the_counters_at_zero(guest: Cluster) -> None:
    before = counters(guest)["by_opcode"]
    assert pyverbs(guest, "pds", "vrdma0", "1000") == {"allocated": 1000}
    after = counters(guest)
    assert after["objects"]["pd"] == verbs.MAD_OBJECTS["pd"] and after["objects"]["ucontext"] == 0
    assert after["by_opcode"]["ALLOC_PD"] - before.get("ALLOC_PD", 0) == 1000
    assert after["by_opcode"]["DEALLOC_PD"] - before.get("DEALLOC_PD", 0) == 1000


def wait_for_ucontexts(cluster: Cluster, count: int, holders: list[int], timeout: float = 60.0) -> dict[str, Any]:
    """Poll the backend's counters until ``count`` user contexts exist, failing early if a guest process that
    should hold one has exited."""
    deadline = time.monotonic() + timeout
    while True:
        now = counters(cluster)
        if now["objects"]["ucontext"] == count:
            return now
        for pid in holders:
            exited = cluster[0].agent.poll(pid)
            assert exited is None, f"context holder {pid} exited: {exited}"
        assert time.monotonic() < deadline, f"expected {count} user contexts, backend has {now}"
        time.sleep(0.2)


def test_two_processes_get_different_doorbell_pages_and_a_killed_one_leaves_nothing(guest: Cluster) -> None:
    agent = guest[0].agent
    argv = ["python3", "-c", PYVERBS, "hold", "vrdma0"]
    pids = [agent.spawn(argv), agent.spawn(argv)]
    try:
        held = wait_for_ucontexts(guest, 2, pids)
        pages = held["doorbell_pages"]
        assert len(set(pages)) == 2 and all(page >= 1 for page in pages), pages
    finally:
        for pid in pids:
            agent.kill(pid)  # SIGKILL: the kernel closes the uverbs file and destroys the context
    assert wait_for_ucontexts(guest, 0, [])["doorbell_pages"] == []


def test_device_handing_out_a_doorbell_page_past_the_region_fails_the_open(guest: Cluster) -> None:
    assert guest.backend is not None
    vm = guest[0]
    vm.run(["dmesg", "-c"]).check("dmesg -c")
    assert admin(guest.backend, {"command": "inject", "vm": "vm0",
                                 "fault": "doorbell-page-out-of-range"}) == {"ok": True}
    failed = vm.run(["ibv_devinfo", "-d", "vrdma0"])
    assert failed.exit_status != 0, failed
    assert "Failed to open device" in failed.stderr + failed.stdout, failed
    dmesg = vm.run(["dmesg"]).check("dmesg").stdout
    pages = DEFAULT_LIMITS.doorbell_pages  # the fault names the page one past the region: its first queue slot
    assert re.search(rf"device gave user context 0x[0-9a-f]+ doorbell index {pages * 1024 + 1} \(region has {pages} "
                     r"pages\)", dmesg), dmesg
    # The driver gave the context back to the device, the guest runs on and the next open works.
    assert counters(guest)["objects"]["ucontext"] == 0
    assert "PORT_ACTIVE" in vm.run(["ibv_devinfo", "-d", "vrdma0"]).check("ibv_devinfo after the fault").stdout
