"""Per-VM objects through the simulated frontend: GIDs, user contexts (doorbell pages), PDs, and their accounting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from backend_process import BackendProcess

from vrdma.device import abi
from vrdma.device.objects import OBJECT_KINDS
from vrdma.testing.frontend import Frontend

pytestmark = pytest.mark.backend

OK = abi.const("VRDMA_STATUS_OK")
INVALID = abi.const("VRDMA_STATUS_INVALID")
BUSY = abi.const("VRDMA_STATUS_BUSY")
NO_RESOURCES = abi.const("VRDMA_STATUS_NO_RESOURCES")


@pytest.fixture()
def fe(backend: BackendProcess) -> Iterator[Frontend]:
    with backend.frontend("vm0") as frontend:
        frontend.start()
        yield frontend


def call(fe: Frontend, opcode: str, request: str, response: str = "vrdma_resp_hdr", **fields: Any) -> Any:
    req = abi.new(request, **fields)
    req.hdr.opcode = abi.const(f"VRDMA_CMD_{opcode}")
    raw = fe.command(abi.to_bytes(req), abi.sizeof(response))
    if len(raw) == abi.sizeof(response):
        return abi.from_bytes(response, raw)
    return abi.from_bytes("vrdma_resp_hdr", raw[:8])


def status(resp: Any) -> int:
    return int(resp.hdr.status if hasattr(resp, "hdr") else resp.status)


def alloc_ucontext(fe: Frontend) -> Any:
    return call(fe, "ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", "vrdma_resp_alloc_ucontext")


def alloc_pd(fe: Frontend, ucontext: int = 0) -> Any:
    return call(fe, "ALLOC_PD", "vrdma_cmd_alloc_pd", "vrdma_resp_alloc_pd", ucontext=ucontext)


def test_ucontexts_get_distinct_doorbell_pages(fe: Frontend, backend: BackendProcess) -> None:
    first, second = alloc_ucontext(fe), alloc_ucontext(fe)
    assert status(first) == status(second) == OK
    assert first.handle != second.handle
    assert {first.doorbell_page, second.doorbell_page} == {1, 2}
    assert status(call(fe, "DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=first.handle)) == OK
    assert alloc_ucontext(fe).doorbell_page == 1  # the freed page is given again
    assert backend.counters()["objects"]["ucontext"] == 2


def test_doorbell_pages_run_out_cleanly(fe: Frontend) -> None:
    handles = [alloc_ucontext(fe) for _ in range(63)]
    assert all(status(h) == OK for h in handles)
    assert sorted(h.doorbell_page for h in handles) == list(range(1, 64))
    assert status(alloc_ucontext(fe)) == NO_RESOURCES


def test_thousand_pds_allocated_and_freed_leave_nothing(fe: Frontend, backend: BackendProcess) -> None:
    ctx = alloc_ucontext(fe)
    pds = [alloc_pd(fe, ctx.handle) for _ in range(1000)]
    assert all(status(pd) == OK for pd in pds) and len({pd.handle for pd in pds}) == 1000
    assert backend.counters()["objects"]["pd"] == 1000
    assert status(call(fe, "DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=ctx.handle)) == BUSY
    for pd in pds:
        assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle)) == OK
    assert status(call(fe, "DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=ctx.handle)) == OK
    assert backend.counters()["objects"] == dict.fromkeys(OBJECT_KINDS, 0)


def test_bad_handles_are_refused(fe: Frontend) -> None:
    pd = alloc_pd(fe)
    assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle ^ 1)) == INVALID
    assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle, reserved=1)) == INVALID
    assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle)) == OK
    assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle)) == INVALID  # twice
    assert status(alloc_pd(fe, ucontext=0x12345)) == INVALID
    assert status(call(fe, "DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=0)) == INVALID


def test_gid_table(fe: Frontend, backend: BackendProcess) -> None:
    gid = bytes(10) + b"\xff\xff" + bytes([169, 254, 100, 1])
    v2 = abi.const("VRDMA_GID_TYPE_ROCE_V2")
    assert status(call(fe, "ADD_GID", "vrdma_cmd_add_gid", index=1, type=v2, gid=list(gid))) == OK
    assert backend.counters()["gids"] == {"1": "0000:0000:0000:0000:0000:ffff:a9fe:6401"}
    assert status(call(fe, "ADD_GID", "vrdma_cmd_add_gid", index=99, type=v2, gid=list(gid))) == INVALID
    assert status(call(fe, "ADD_GID", "vrdma_cmd_add_gid", index=2, type=7, gid=list(gid))) == INVALID
    assert status(call(fe, "DEL_GID", "vrdma_cmd_del_gid", index=1)) == OK
    assert status(call(fe, "DEL_GID", "vrdma_cmd_del_gid", index=1)) == INVALID
    assert backend.counters()["gids"] == {}


def test_objects_are_per_vm_and_freed_on_disconnect(backend: BackendProcess) -> None:
    with backend.frontend("vm0") as vm0, backend.frontend("vm1") as vm1:
        vm0.start()
        vm1.start()
        pd = alloc_pd(vm0)
        assert status(call(vm1, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle)) == INVALID  # not vm1's
        assert backend.counters("vm0")["objects"]["pd"] == 1 and backend.counters("vm1")["objects"]["pd"] == 0
    with backend.frontend("vm0") as again:  # a new connection starts from nothing
        again.start()
        assert backend.counters("vm0")["objects"] == dict.fromkeys(OBJECT_KINDS, 0)


def test_handle_pools_stay_bounded_however_many_objects_come_and_go() -> None:
    """A guest that creates and destroys objects in a loop must not grow the backend: a table's memory is bounded by
    its limit (it once remembered every handle ever issued), and a stale handle still finds nothing."""
    import tracemalloc

    from vrdma.device.pool import Pool

    table: Pool[int] = Pool("mr", 1024)
    held = [table.add(i) for i in range(512)]
    stale = table.add(-1)
    table.remove(stale)
    tracemalloc.start()
    try:
        for i in range(10_000):  # warm-up: the dict reaches its working size
            table.remove(table.add(i))
        warm, _ = tracemalloc.get_traced_memory()
        for i in range(50_000):
            table.remove(table.add(i))
        grown = tracemalloc.get_traced_memory()[0] - warm
    finally:
        tracemalloc.stop()
    assert grown < 4 << 10, f"{grown} bytes kept by 50,000 more create/destroy pairs"
    assert table.get(stale) is None and len(table) == len(held)
    assert all(table.get(handle) == i for i, handle in enumerate(held))
    assert len({table.add(i) for i in range(512)} | set(held)) == 1024 and table.full()
