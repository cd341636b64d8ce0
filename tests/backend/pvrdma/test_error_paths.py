"""pvrdma lesson 6, leaks and half-made objects on error paths (CVE-2018-20123, CVE-2018-20126, CVE-2021-3608):
every failed create gives back what it took, and nothing grows."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from backend_process import BackendProcess
from pvrdma_helpers import *  # the lessons' shared helpers (its __all__)

from vrdma.device import abi
from vrdma.testing.simulated_guest import PAGE, PBL, SimVerbs
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend


@dataclass
class Failing:
    """A create that fails half-way, and the same create done right."""

    command: tuple[str, str, str]
    bad: dict[str, Any]
    good: dict[str, Any]
    status: str


def _big_qp(v: SimVerbs, pd: int, cq: int) -> dict[str, Any]:
    """521 pages (two levels): a leaked translation table would cost 8 KiB a failure, visible in RSS."""
    return create_qp_fields(v, pd, cq, sq_depth=4096, rq_depth=1024, max_send_sge=16, max_recv_sge=1)


def _ring_pages(v: SimVerbs, ring: dict[str, int]) -> list[int]:
    """The data pages a (correct) page list names."""
    tables = [ring["addr"]] if ring["levels"] == 1 else list(
        struct.unpack(f"<{-(-ring['npages'] // PBL)}Q", v.memory.read(ring["addr"], 8 * -(-ring["npages"] // PBL))))
    pages: list[int] = []
    for table in tables:
        n = min(PBL, ring["npages"] - len(pages))
        pages += struct.unpack(f"<{n}Q", v.memory.read(table, 8 * n))
    return pages


def _with_bad_page(v: SimVerbs, ring: dict[str, int], index: int) -> dict[str, int]:
    pages = _ring_pages(v, ring)
    pages[index] = v.memory.size + OUTSIDE
    return page_list(v, pages)


def _second_list_outside(v: SimVerbs, ring: dict[str, int]) -> dict[str, int]:
    directory = v.alloc(PAGE).gpa
    first = struct.unpack("<Q", v.memory.read(ring["addr"], 8))[0]
    v.memory.write(directory, struct.pack("<2Q", first, v.memory.size + OUTSIDE))
    return {**ring, "addr": directory}




def _qp_directory_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = _big_qp(v, pd, cq)
    return Failing(QP, {**good, "ring": {**good["ring"], "addr": v.memory.size + OUTSIDE}}, good, "INVALID")


def _qp_second_list_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = _big_qp(v, pd, cq)
    return Failing(QP, {**good, "ring": _second_list_outside(v, good["ring"])}, good, "INVALID")


def _qp_data_page_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = _big_qp(v, pd, cq)
    return Failing(QP, {**good, "ring": _with_bad_page(v, good["ring"], 300)}, good, "INVALID")


def _cq_data_page_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = create_cq_fields(v, LIMITS["max_cqe"])
    return Failing(CQ, {**good, "ring": _with_bad_page(v, good["ring"], 500)}, good, "INVALID")


def _srq_data_page_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = create_srq_fields(v, pd, depth=4096, max_sge=16)
    return Failing(SRQ, {**good, "ring": _with_bad_page(v, good["ring"], 510)}, good, "INVALID")


def _mr_page_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good: dict[str, Any] = {"pd": pd, "access": 0xF, "iova": 0x10000, "length": 1024 * PAGE,
                            "pages": v.page_list(v.alloc(1024 * PAGE))}
    return Failing(MR, {**good, "pages": _with_bad_page(v, good["pages"], 1023)}, good, "INVALID")


FAILURES: dict[str, Callable[[SimVerbs, int, int], Failing]] = {
    "QP: page-list directory outside guest RAM": _qp_directory_outside,
    "QP: second page-list page outside guest RAM": _qp_second_list_outside,
    "QP: data page 300 of 521 outside guest RAM": _qp_data_page_outside,
    "CQ: data page 500 of 513 outside guest RAM": _cq_data_page_outside,
    "SRQ: data page 510 of 513 outside guest RAM": _srq_data_page_outside,
    "MR: page 1023 of 1024 outside guest RAM": _mr_page_outside,
}


@pytest.mark.parametrize("case", FAILURES)
def test_failed_creates_leave_nothing_behind(backend: BackendProcess, case: str) -> None:
    """CVE-2018-20126: create_cq_ring/create_qp_rings did not free the ring objects when creation failed ("memory
    leakage when creating cq/qp"; fixed by "pvrdma: release ring object in case of an error"). CVE-2021-3608:
    pvrdma_ring_init skipped a NULL page-table entry, left that slot of its page array uninitialised, and its error
    path unmapped it (fixed by "pvrdma: Fix the ring init error flow": g_malloc0).

    A create whose page list goes bad half-way (a directory, a second-level list, or one data page in the middle
    outside guest RAM: the device has taken a table slot, doorbell slots, a handle and translated part of the list
    by then) is refused 1000 times. Afterwards object counts, doorbell pages and the backend's fds are exactly what
    they were and its RSS is flat; nothing half-made remains: the PD, CQ and context the failed creates named are
    still free to go, and the same create done right succeeds (its table slot in the engine is free)."""
    with backend.frontend("vm0") as fe:
        fe.start()
        v = SimVerbs(fe, backend.directory / "vm0.doorbell")
        pd, cq = v.alloc_pd(), v.create_cq(16)
        failing = FAILURES[case](v, pd, cq.handle)
        # Warm-up: allocator arenas, log buffers, the first command's one-time work. Under ASan the allocator's
        # one-time growth lasts about a thousand creates (0.9 MiB, then ~0.1 MiB per thousand as without it).
        for _ in range(1000):
            assert status_of(lambda: v.call(*failing.command, **failing.bad)) == STATUS[failing.status]
        counters = backend.counters("vm0")
        fds, memory = settled_fds(backend.proc.pid), rss(backend)
        statuses = {status_of(lambda: v.call(*failing.command, **failing.bad)) for _ in range(1000)}
        assert statuses == {STATUS[failing.status]}
        assert rss(backend) - memory < 1 << 20, "RSS grew over 1000 failed creates"
        after = backend.counters("vm0")
        assert (after["objects"], after["doorbell_pages"]) == (counters["objects"], counters["doorbell_pages"])
        assert settled_fds(backend.proc.pid, fds) == fds
        made = v.call(*failing.command, **failing.good)
        kind = failing.command[0].removeprefix("VRDMA_CMD_")
        destroy = {"CREATE_QP": "DESTROY_QP", "CREATE_CQ": "DESTROY_CQ", "CREATE_SRQ": "DESTROY_SRQ",
                   "REG_MR": "DEREG_MR"}[kind]
        for opcode, handle in ((destroy, int(made.handle)), ("DESTROY_CQ", cq.handle), ("DEALLOC_PD", pd),
                               ("DEALLOC_UCONTEXT", v.ucontext)):
            v.call(f"VRDMA_CMD_{opcode}", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=handle)
        final = backend.counters("vm0")
        assert set(final["objects"].values()) == {0} and final["doorbell_pages"] == []


def test_qp_create_that_runs_out_of_doorbell_slots_half_way_gives_back_the_first(backend: BackendProcess) -> None:
    """CVE-2018-20126 (a failed QP creation must release what it took) with resources exhausted half-way: a context
    whose doorbell page has exactly one free slot, in a region whose every other page other contexts hold, asks for
    a QP (two slots). Each of 1000 attempts is refused with STATUS_NO_RESOURCES and takes nothing: the last slot
    still serves a CQ afterwards, and then no slot is left."""
    with backend.frontend("vm0") as fe:
        fe.start()
        v = SimVerbs(fe, backend.directory / "vm0.doorbell")
        pd = v.alloc_pd()
        fields = create_cq_fields(v, 1)  # every filler CQ shares this ring: none will ever complete
        cqs = [v.call("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", **fields)
               for _ in range(abi.const("VRDMA_DB_SLOTS") - 3)]  # slots 1..1021 of 1..1022
        while status_of(lambda: v.call("VRDMA_CMD_ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext",
                                       "vrdma_resp_alloc_ucontext")) == STATUS["OK"]:
            pass  # the other contexts take every page left
        qp = create_qp_fields(v, pd, int(cqs[0].handle))
        statuses = {status_of(lambda: create_qp(v, qp)) for _ in range(1000)}
        assert statuses == {STATUS["NO_RESOURCES"]}
        assert objects(backend, "vm0")["qp"] == 0
        last = v.call("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", **fields)
        assert int(last.db_index) == v.doorbell_page * abi.const("VRDMA_DB_SLOTS") + abi.const("VRDMA_DB_SLOTS") - 2
        assert status_of(lambda: v.call("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq",
                                        **fields)) == STATUS["NO_RESOURCES"]


def test_failed_device_setup_leaks_nothing(backend: BackendProcess) -> None:
    """CVE-2018-20123: pvrdma_realize did not release what it had allocated when device initialisation failed
    ("memory leakage in device hotplug"; fixed by "pvrdma: release device resources in case of an error").

    Here a VM's device set-up fails half-way, repeatedly: queues started, a context, PD, CQ and QP created, then
    ring addresses outside guest memory (a protocol error that closes the connection). After 200 such cycles the
    backend's fds are exactly what they were, its RSS is flat, and the VM holds no objects and no doorbell page."""
    cycles = 0

    def half_setup() -> None:
        nonlocal cycles
        with backend.frontend("vm0") as fe:
            fe.start()
            v = SimVerbs(fe, backend.directory / "vm0.doorbell")
            pd = v.alloc_pd()
            cq = v.create_cq(16)
            v.create_qp(pd, cq, cq)
            v.doorbells.close()
            far = fe.memory.size + 0x10000
            fe.send_raw(Request.SET_VRING_ADDR, struct.pack("<IIQQQQ", 0, 0, far, far, far, 0))
            cycles += 1
            connection = backend.wait_for_closed("vm0", cycles)
        assert connection["protocol_errors"] == cycles

    for _ in range(50):  # warm-up, as in test_backend_hostile_vm
        half_setup()
    fds, memory = settled_fds(backend.proc.pid), rss(backend)
    for _ in range(200):
        half_setup()
    counters = backend.counters("vm0")
    assert set(counters["objects"].values()) == {0} and counters["doorbell_pages"] == []
    assert settled_fds(backend.proc.pid, fds) == fds
    assert rss(backend) - memory < 1 << 20, "RSS grew over 200 failed set-ups"
