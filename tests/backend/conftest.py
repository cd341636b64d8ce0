"""The bystander every backend test tier can ask for: vm1, served by the same backend as the VM under test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backend_process import PATTERN_SIZE, BackendProcess, Bystander, connected_vm, pattern, query_device

from vrdma.device.status import Status


@pytest.fixture
def bystander(backend: BackendProcess) -> Iterator[Bystander]:
    """vm1 with a context, a PD, a CQ, a QP and an MR holding a pattern; checked after the test: its device still
    answers, keeps exactly its objects and its connection, and its memory holds the pattern."""
    for vm in connected_vm(backend, "vm1"):
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
