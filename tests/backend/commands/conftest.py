"""Fixtures of the per-command tests: vm0 (the VM under test) and vm1 (a bystander whose device must not notice).

Every command file here tests its commands three ways side by side: what a driver does (good), what a broken or
hostile driver sends (malformed: each case gets its own status), and that vm1, served by the same backend with
objects of its own and a sentinel pattern in its MR, is untouched afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backend_process import BackendProcess, query_device
from command_helpers import PATTERN_SIZE, Bystander, Vm, pattern

from vrdma.device.status import Status
from vrdma.testing.verbs import SimVerbs


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """One backend for a module's tests (each test connects its VMs afresh)."""
    process = BackendProcess(tmp_path_factory.mktemp("backend"))
    yield process
    assert process.stop() == 0, process.log_text()


def _connect(backend: BackendProcess, name: str) -> Iterator[Vm]:
    closed = backend.connection(name)["closed"]
    with backend.frontend(name) as fe:
        fe.start()
        yield Vm(name, fe, SimVerbs(fe, backend.directory / f"{name}.doorbell"))
    backend.wait_for_closed(name, closed + 1)  # the device forgot this connection's objects


@pytest.fixture
def vm0(backend: BackendProcess) -> Iterator[Vm]:
    """vm0 connected and started, with one user context."""
    yield from _connect(backend, "vm0")


@pytest.fixture
def bystander(backend: BackendProcess) -> Iterator[Bystander]:
    """vm1 with a context, a PD, a CQ, a QP and an MR holding a pattern; checked after the test: its device still
    answers, keeps exactly its objects and its connection, and its memory holds the pattern."""
    for vm in _connect(backend, "vm1"):
        pd = vm.verbs.alloc_pd()
        cq = vm.verbs.create_cq(16)
        vm.verbs.create_qp(pd, cq, cq)
        mr = vm.verbs.reg_mr(pd, PATTERN_SIZE)
        vm.verbs.memory.write(mr.addr, pattern(PATTERN_SIZE))
        counters = backend.counters("vm1")
        side = Bystander(vm.name, vm.fe, vm.verbs, mr, counters["objects"])
        yield side
        assert query_device(vm.fe).hdr.status == Status.OK
        after = backend.counters("vm1")
        assert after["objects"] == side.objects, after["objects"]
        assert after["connection"]["closed"] == counters["connection"]["closed"]
        assert vm.verbs.memory.read(mr.addr, PATTERN_SIZE) == pattern(PATTERN_SIZE)
