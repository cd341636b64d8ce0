"""Two guests on their private link: network, the guest userland, and rxe RDMA between them."""

from __future__ import annotations

import concurrent.futures
import logging
from pathlib import Path

import pytest

from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm
log = logging.getLogger(__name__)


def test_guests_boot_and_report_their_boot_time(two_guests: Cluster) -> None:
    for vm in two_guests:
        assert vm.boot_seconds is not None
        log.info("boot to ready, %s, %s: %.1f s", vm.name, two_guests.accel.upper(), vm.boot_seconds)
        assert vm.run(["hostname"]).stdout.strip() == vm.name
        assert f"inet {vm.identity.address}" in vm.run(["ip", "-4", "addr", "show", "eth0"]).stdout


def test_guests_ping_each_other(two_guests: Cluster) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    vm0.run(["ping", "-c", "2", "-W", "5", vm1.address]).check("ping vm0 -> vm1")
    vm1.run(["ping", "-c", "2", "-W", "5", vm0.address]).check("ping vm1 -> vm0")


def test_exec_returns_status_stdout_and_stderr(two_guests: Cluster) -> None:
    result = two_guests[0].sh("echo to-out; echo to-err >&2; exit 7")
    assert (result.exit_status, result.stdout, result.stderr) == (7, "to-out\n", "to-err\n")


def test_concurrent_commands_in_one_guest(two_guests: Cluster) -> None:
    vm = two_guests[0]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: vm.sh(f"sleep 1; echo {i}"), range(4)))
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3"]


def test_verbs_userland_is_usable(two_guests: Cluster) -> None:
    vm = two_guests[0]
    result = vm.run(["ibv_devices"]).check("ibv_devices")
    assert "device" in result.stdout and "node GUID" in result.stdout
    pyverbs = vm.run(["python3", "-c", "import pyverbs.device as d; print('pyverbs', len(d.get_device_list()))"])
    assert pyverbs.check("import pyverbs").stdout.startswith("pyverbs ")


def test_rxe_rc_pingpong_between_guests(two_guests: Cluster) -> None:
    for vm in two_guests:
        verbs.add_rxe(vm, "rxe0")
        link = vm.run(["rdma", "link", "show"]).check("rdma link show").stdout
        assert "rxe0/1 state ACTIVE" in link and "netdev eth0" in link
        assert "rxe0" in vm.run(["ibv_devices"]).stdout
    gid = verbs.ipv4_gid_index(two_guests[0], "rxe0")
    assert gid == verbs.ipv4_gid_index(two_guests[1], "rxe0")
    result = verbs.rc_pingpong(two_guests[0], two_guests[1], "rxe0", gid, size=4096, iterations=500)
    assert result.iterations == 500 and result.mbit_per_s > 0
    assert f"GID ::ffff:{two_guests[0].address}" in result.client_output  # the remote end is vm0's IPv4 GID
    log.info("rxe ibv_rc_pingpong 4096 B: %.1f Mbit/s, %.1f usec/iter", result.mbit_per_s, result.usec_per_iter)


def test_three_guests_share_one_link_through_the_hub(products: Products, tmp_path: Path) -> None:
    with Cluster(3, tmp_path, products=products) as guests:
        assert guests.hub is not None
        for vm in guests:
            log.info("boot to ready, %s (3 guests), %s: %.1f s", vm.name, guests.accel.upper(), vm.boot_seconds)
        for src, dst in ((0, 2), (2, 1), (1, 0)):
            guests[src].run(["ping", "-c", "1", "-W", "5", guests[dst].address]).check(f"ping vm{src} -> vm{dst}")
