"""The guest kernel smoke: vrdma.ko on every guest kernel the build makes (buildchain.kernel.GUEST_KERNELS: Debian 12's
6.1, Debian 13's 6.12 and the newest Debian carries), each built with its own release's compiler, loaded in two
guests booting that kernel, and the programs a user runs first (tests/guest_smoke.py): ibv_devinfo,
ibv_rc_pingpong with its data checked, rping verifying every ping, and an NVMe-oF namespace written and read back
through the kernel's own RDMA users.

The rest of the suite runs on the default kernel; this module is what holds the others to it."""

from __future__ import annotations

from collections.abc import Iterator

import guest_smoke
import pytest

from vrdma.buildchain.kernel import GUEST_KERNELS
from vrdma.device import abi
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module", params=list(GUEST_KERNELS))
def kernel_guests(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two guests booting one guest kernel, with the image (modules and vrdma.ko) built for it."""
    products = Products.load(request.param)
    with Cluster(2, tmp_path_factory.mktemp(f"kernel-{request.param}"), products=products) as cluster:
        yield cluster


def test_the_driver_loads_and_the_port_is_active(kernel_guests: Cluster) -> None:
    assert kernel_guests.products is not None
    guest_smoke.check_port_active(kernel_guests, kernel_guests.products.kernel["release"])


def test_a_tcg_guest_asks_for_the_doorbell_recheck(kernel_guests: Cluster) -> None:
    """These guests run under TCG with one vCPU, whose fences QEMU drops: each driver accepts
    VRDMA_F_DOORBELL_RECHECK (its CPUID names TCG), and the backend rechecks for it (a driver on KVM declines it:
    the backend's tests/backend/test_backend_idle.py shows what that saves)."""
    assert kernel_guests.backend is not None
    bit = 1 << abi.const("VRDMA_F_DOORBELL_RECHECK")
    for vm in ("vm0", "vm1"):
        counters = vm_counters(kernel_guests.backend, vm)
        assert counters["connection"]["features"] & bit, counters["connection"]
        assert counters["doorbell_recheck"] is True


def test_rc_pingpong_checks_its_data(kernel_guests: Cluster) -> None:
    guest_smoke.check_rc_pingpong(kernel_guests)


def test_rping_verifies_every_ping(kernel_guests: Cluster) -> None:
    guest_smoke.check_rping(kernel_guests)


def test_nvmeof_writes_and_reads_back(kernel_guests: Cluster) -> None:
    guest_smoke.check_nvmeof(kernel_guests)


def test_the_port_counters_carry_the_drivers_data_counters(kernel_guests: Cluster) -> None:
    guest_smoke.check_port_counters(kernel_guests)
