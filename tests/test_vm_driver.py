"""vrdma.ko against a misbehaving device: every bad response is logged, turned into an errno, and survived."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vrdma.harness.backend import admin
from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def guest(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(1, tmp_path_factory.mktemp("driver"), products=products, test_hooks=True) as cluster:
        yield cluster


def reload_driver(cluster: Cluster) -> str:
    """rmmod + modprobe vrdma (a re-probe, whose QUERY_DEVICE meets the armed fault); returns the new dmesg lines."""
    vm = cluster[0]
    vm.run(["dmesg", "-c"]).check("dmesg -c")  # print and clear (busybox dmesg)
    vm.run(["rmmod", "vrdma"]).check("rmmod vrdma")
    vm.run(["modprobe", "vrdma"]).check("modprobe vrdma")
    return vm.run(["dmesg"]).check("dmesg").stdout


def bound(cluster: Cluster) -> bool:
    return any(n.startswith("virtio") for n in cluster[0].sh("ls /sys/bus/virtio/drivers/vrdma/").stdout.split())


def test_driver_reloads_cleanly(guest: Cluster) -> None:
    assert bound(guest)
    dmesg = reload_driver(guest)
    assert "vrdma device: max_qp 1024" in dmesg and bound(guest)


@pytest.mark.parametrize(("fault", "logged", "errno"), [
    ("wrong-opcode", "response is for command 2 seq", -5),
    ("wrong-seq", "response is for command 1 seq", -5),
    ("short-response", "short response, 8 of 120 bytes", -5),
    ("bad-status", "QUERY_DEVICE failed: -5", -5),
])
def test_bad_response_is_logged_refused_and_survived(guest: Cluster, fault: str, logged: str, errno: int) -> None:
    assert guest.backend is not None
    assert admin(guest.backend, {"command": "inject", "vm": "vm0", "fault": fault}) == {"ok": True}
    dmesg = reload_driver(guest)
    assert logged in dmesg, dmesg
    assert f"QUERY_DEVICE failed: {errno}" in dmesg, dmesg
    assert "probe of virtio" in dmesg and f"failed with error {errno}" in dmesg, dmesg
    assert not bound(guest)
    assert guest[0].run(["true"]).exit_status == 0  # the guest keeps running
    assert "vrdma device: max_qp 1024" in reload_driver(guest)  # and a good device binds again
    assert bound(guest)


def test_backend_counters_follow_the_driver(guest: Cluster) -> None:
    assert guest.backend is not None
    before = admin(guest.backend, {"command": "counters"})["vms"]["vm0"]  # type: ignore[index]
    reload_driver(guest)
    after = admin(guest.backend, {"command": "counters"})["vms"]["vm0"]  # type: ignore[index]
    assert after["by_opcode"]["QUERY_DEVICE"] == before["by_opcode"]["QUERY_DEVICE"] + 1
    assert after["by_opcode"]["QUERY_PORT"] == before["by_opcode"]["QUERY_PORT"] + 1
