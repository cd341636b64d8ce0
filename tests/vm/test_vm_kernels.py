"""The guest kernel smoke: vrdma.ko on every guest kernel the build makes (buildchain.kernel.GUEST_KERNELS: Debian 12's
6.1, Debian 13's 6.12 and the newest Debian carries), each built with its own release's compiler, loaded in two
guests booting that kernel, and the programs a user runs first: ibv_devinfo, ibv_rc_pingpong with its data checked,
rping verifying every ping, and an NVMe-oF namespace written and read back through the kernel's own RDMA users.

The rest of the suite runs on the default kernel; this module is what holds the others to it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from storage_checks import VERIFY

from vrdma.buildchain.kernel import GUEST_KERNELS
from vrdma.harness import fio, nvmeof, verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm

DEVICE = "vrdma0"
RPING_PORT = 7174
PINGS = 100


@pytest.fixture(scope="module", params=list(GUEST_KERNELS))
def kernel_guests(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two guests booting one guest kernel, with the image (modules and vrdma.ko) built for it."""
    products = Products.load(request.param)
    with Cluster(2, tmp_path_factory.mktemp(f"kernel-{request.param}"), products=products) as cluster:
        yield cluster


def test_the_driver_loads_and_the_port_is_active(kernel_guests: Cluster) -> None:
    assert kernel_guests.products is not None
    release = kernel_guests.products.kernel["release"]
    for vm in kernel_guests:
        assert vm.run(["uname", "-r"]).check("uname").stdout.strip() == release
        vermagic = vm.run(["modinfo", "-F", "vermagic", "vrdma"]).check("modinfo vrdma").stdout.split()
        assert vermagic[:1] == [release]
        info = vm.run(["ibv_devinfo", "-d", DEVICE]).check("ibv_devinfo").stdout
        assert re.search(r"state:\s+PORT_ACTIVE", info) and re.search(r"link_layer:\s+Ethernet", info), info
        log = vm.run(["dmesg"]).check("dmesg").stdout
        assert "WARNING" not in log and "BUG" not in log, log[-3000:]


def test_rc_pingpong_checks_its_data(kernel_guests: Cluster) -> None:
    server, client = kernel_guests[0], kernel_guests[1]
    result = verbs.rc_pingpong(server, client, DEVICE, verbs.ipv4_gid_index(server, DEVICE), size=4096,
                               iterations=200, extra=("-c",))
    assert result.iterations == 200


def test_rping_verifies_every_ping(kernel_guests: Cluster) -> None:
    """The kernel's RDMA CM (its MADs through the GSI QP, then RC): rping checks the data of every ping."""
    server, client = kernel_guests[0], kernel_guests[1]
    _, out = verbs.client_server(
        server, client, ["rping", "-s", "-a", server.address, "-V", "-C", str(PINGS), "-p", str(RPING_PORT)],
        port=RPING_PORT, rdma_cm=True,
        client_argv=["rping", "-c", "-a", server.address, "-V", "-C", str(PINGS), "-v", "-p", str(RPING_PORT)])
    assert out.stdout.count("ping data: rdma-ping-") == PINGS, out.stdout[-2000:]


def test_nvmeof_writes_and_reads_back(kernel_guests: Cluster) -> None:
    """nvmet-rdma in one guest, nvme-rdma in the other (fast registration, remote invalidation): fio writes the
    namespace and reads every block back, checking each."""
    target_vm, host_vm = kernel_guests[0], kernel_guests[1]
    with nvmeof.target(target_vm, "rdma", size_mib=32) as exported, nvmeof.host(host_vm, exported) as device:
        job = fio.job(host_vm, device, "--rw=randwrite", "--bs=4k", "--iodepth=16", "--size=8M", *VERIFY)
    assert job["error"] == 0 and job["write"]["io_bytes"] == job["read"]["io_bytes"] == 8 << 20, job
