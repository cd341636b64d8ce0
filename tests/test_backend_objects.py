"""Per-VM objects through the simulated frontend: GIDs, user contexts (doorbell pages), PDs, and their accounting."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vrdma.backend.admin import ask
from vrdma.device import abi
from vrdma.testing.frontend import Frontend

pytestmark = pytest.mark.backend

OK = abi.const("VRDMA_STATUS_OK")
INVALID = abi.const("VRDMA_STATUS_INVALID")
BUSY = abi.const("VRDMA_STATUS_BUSY")
NO_RESOURCES = abi.const("VRDMA_STATUS_NO_RESOURCES")


class Backend:
    def __init__(self, directory: Path) -> None:
        self.admin = directory / "admin.sock"
        self.sockets = {name: directory / f"{name}.sock" for name in ("vm0", "vm1")}
        read_end, write_end = os.pipe()
        args = [a for name, path in self.sockets.items() for a in ("--socket-path", f"{name}={path}")]
        self.proc = subprocess.Popen([sys.executable, "-m", "vrdma.cli", "backend", *args, "--admin-socket",
                                      str(self.admin), "--ready-fd", str(write_end)],
                                     pass_fds=[write_end], stderr=(directory / "backend.log").open("wb"))
        os.close(write_end)
        with os.fdopen(read_end, "rb") as ready:
            assert ready.read() == b"READY\n"

    def counters(self, vm: str = "vm0") -> dict[str, Any]:
        return ask(self.admin, {"command": "counters"})["vms"][vm]  # type: ignore[no-any-return]


@pytest.fixture()
def backend(tmp_path: Path) -> Iterator[Backend]:
    process = Backend(tmp_path)
    yield process
    process.proc.terminate()
    assert process.proc.wait(10) == 0


@pytest.fixture()
def fe(backend: Backend) -> Iterator[Frontend]:
    with Frontend(str(backend.sockets["vm0"])) as frontend:
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


def test_ucontexts_get_distinct_doorbell_pages(fe: Frontend, backend: Backend) -> None:
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


def test_thousand_pds_allocated_and_freed_leave_nothing(fe: Frontend, backend: Backend) -> None:
    ctx = alloc_ucontext(fe)
    pds = [alloc_pd(fe, ctx.handle) for _ in range(1000)]
    assert all(status(pd) == OK for pd in pds) and len({pd.handle for pd in pds}) == 1000
    assert backend.counters()["objects"]["pd"] == 1000
    assert status(call(fe, "DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=ctx.handle)) == BUSY
    for pd in pds:
        assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle)) == OK
    assert status(call(fe, "DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=ctx.handle)) == OK
    assert backend.counters()["objects"] == {"gid": 0, "ucontext": 0, "pd": 0}


def test_bad_handles_are_refused(fe: Frontend) -> None:
    pd = alloc_pd(fe)
    assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle ^ 1)) == INVALID
    assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle, reserved=1)) == INVALID
    assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle)) == OK
    assert status(call(fe, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle)) == INVALID  # twice
    assert status(alloc_pd(fe, ucontext=0x12345)) == INVALID
    assert status(call(fe, "DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=0)) == INVALID


def test_gid_table(fe: Frontend, backend: Backend) -> None:
    gid = bytes(10) + b"\xff\xff" + bytes([169, 254, 100, 1])
    v2 = abi.const("VRDMA_GID_TYPE_ROCE_V2")
    assert status(call(fe, "ADD_GID", "vrdma_cmd_add_gid", index=1, type=v2, gid=list(gid))) == OK
    assert backend.counters()["gids"] == {"1": "0000:0000:0000:0000:0000:ffff:a9fe:6401"}
    assert status(call(fe, "ADD_GID", "vrdma_cmd_add_gid", index=99, type=v2, gid=list(gid))) == INVALID
    assert status(call(fe, "ADD_GID", "vrdma_cmd_add_gid", index=2, type=7, gid=list(gid))) == INVALID
    assert status(call(fe, "DEL_GID", "vrdma_cmd_del_gid", index=1)) == OK
    assert status(call(fe, "DEL_GID", "vrdma_cmd_del_gid", index=1)) == INVALID
    assert backend.counters()["gids"] == {}


def test_objects_are_per_vm_and_freed_on_disconnect(backend: Backend) -> None:
    with Frontend(str(backend.sockets["vm0"])) as vm0, Frontend(str(backend.sockets["vm1"])) as vm1:
        vm0.start()
        vm1.start()
        pd = alloc_pd(vm0)
        assert status(call(vm1, "DEALLOC_PD", "vrdma_cmd_destroy", handle=pd.handle)) == INVALID  # not vm1's
        assert backend.counters("vm0")["objects"]["pd"] == 1 and backend.counters("vm1")["objects"]["pd"] == 0
    with Frontend(str(backend.sockets["vm0"])) as again:  # a new connection starts from nothing
        again.start()
        assert backend.counters("vm0")["objects"] == {"gid": 0, "ucontext": 0, "pd": 0}
