"""Every limit of the device, declared once: what config space and QUERY_DEVICE advertise, what the model and the
engine enforce, and the engine's own tuning.

Each field says where it goes (``config``: the config-space field of the same name; ``query``: QUERY_DEVICE's;
``engine``: the name of the struct vre_device_limits field), so adding a limit is one line here and the three
places that publish or enforce it follow (config_fields, query_fields, engine_limits).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from vrdma.device import abi
from vrdma.device.ucontext import FIRST_USER_PAGE
from vrdma.engine.api import EngineLimits

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def _limit(default: int, *, config: bool = False, query: bool = False, engine: str | None = None) -> Any:
    return field(default=default, metadata={"config": config, "query": query, "engine": engine})


@dataclass(frozen=True)
class DeviceLimits:
    # Tens of thousands of QPs and CQs, as RoCE HCAs offer (one QP per peer is how MPI and UCX jobs scale); the
    # engine's tables are arrays of pointers sized by these (powers of two), 256 KiB each at 32768.
    max_qp: int = _limit(32768, config=True, query=True, engine="max_qp")
    max_qp_wr: int = _limit(32768, config=True, query=True, engine="max_qp_wr")  # as mlx5 HCAs report
    max_sge: int = _limit(16, config=True, query=True, engine="max_sge")
    max_inline_data: int = _limit(256, config=True, query=True, engine="max_inline")
    max_cq: int = _limit(32768, config=True, query=True, engine="max_cq")
    max_cqe: int = _limit(65536, config=True, query=True, engine="max_cqe")
    max_mr: int = _limit(4096, config=True, query=True, engine="max_mr")
    # Pages one fast-registration MR maps (one page-list page of 512, 2 MiB in 4 KiB pages): ULPs register each I/O's
    # pages with REG_MR work requests (nvme-rdma asks for up to 256, xprtrdma and iSER fewer).
    max_fast_reg_pages: int = _limit(512, query=True)
    # Two levels of page-list pages: 512 * 512 pages of 4 KiB (the engine gets it in pages: engine_limits).
    max_mr_size: int = _limit(1 * GIB, config=True, query=True)
    # Pages translated for all of one VM's MRs and rings together (an HCA's translation-table size): 16 GiB
    # registered at once. Each costs the backend 16 bytes whatever page it names, so this bounds a VM at 64 MiB.
    max_translated_pages: int = _limit(1 << 22, engine="max_pages_total")
    max_pd: int = _limit(32768, config=True, query=True)
    max_xrcd: int = _limit(4096)  # XRC domains: the device's, shared by processes (one per job or service)
    max_srq: int = _limit(8192, config=True, query=True, engine="max_srq")
    max_srq_wr: int = _limit(32768, config=True, query=True, engine="max_srq_wr")
    max_srq_sge: int = _limit(16, query=True)
    max_ah: int = _limit(32768, config=True, query=True)
    # READs and atomics outstanding per QP, either way (also QUERY_DEVICE's max_qp_init_rd_atom: query_fields): rxe's
    # 128, because tools set a QP's max_rd_atomic to what the peer's device reports (perftest does) and a smaller
    # limit here refuses that QP. The engine's responder keeps as many (engine/vre.h, VRE_MAX_RD).
    max_qp_rd_atom: int = _limit(128, query=True)
    # The header page, then pages of 1022 queue slots each, handed to contexts as they need them (a context takes
    # one, and another whenever its queues fill those it has). 4 MiB, a power of two for ivshmem: room for 1022
    # processes, or for every queue the limits above allow (2 max_qp + max_cq + max_srq slots need 137 pages).
    doorbell_pages: int = _limit(1024, config=True, engine="doorbell_pages")
    gid_table_len: int = _limit(16)
    max_msg_size: int = _limit(1 << 31, engine="max_msg_size")
    page_size_cap: int = _limit(4 * KIB, query=True)
    max_command_size: int = _limit(4 * KIB)  # largest control command the device reads from a chain
    max_pending_events: int = _limit(1024)   # events kept while the driver has posted no event buffers
    # Data engine
    poll_budget: int = _limit(64)            # send WQEs (or pieces) one QP may run per poll, at most
    # The scheduler (struct vre_sched; engine/poll.c): a VM's turn is worth quantum_bytes * weight / 100 of copying,
    # a work request costing wr_cost_bytes on top (about what an 8-byte WRITE costs the engine beyond its data), and
    # a message longer than piece_bytes moves a piece per turn: 64 KiB is ~2 us of copying, the most one VM's bulk
    # transfer keeps another's small message waiting (docs/backend.md, "Sharing the engine"); while another VM of
    # the same engine thread sends small messages (at most small_piece_bytes), turns and pieces are that size, and
    # while no other VM of the thread has worked for a millisecond, they are solo_bytes (~30 us of copying: what the
    # first message of a VM waking up may wait; 64 KiB pieces alone cost 16 % of a VM's 1 MiB WRITE bandwidth).
    quantum_bytes: int = _limit(64 * KIB)
    piece_bytes: int = _limit(64 * KIB)
    wr_cost_bytes: int = _limit(2 * KIB)
    small_piece_bytes: int = _limit(16 * KIB)
    solo_bytes: int = _limit(1 * MIB)
    park_after_idle_us: int = _limit(50)     # poll this long without work, then park until a guest wakes the device
    # A parked engine looks at the doorbells again this often even if nobody wakes it: the wake-up handshake needs
    # the guest's memory fence between its doorbell store and its read of the parked flag, and a guest that does
    # not really fence (TCG elides barriers when the machine has one vCPU) can miss the flag. Bounded, not lost.
    park_recheck_ms: int = _limit(10)
    # Without the engine's own thread (in-process tests: Fabric.run), one turn of the engine polls in C this long
    # before the event loop looks at its descriptors again. The daemon's engine thread passes without pause.
    spin_us: int = _limit(200)


DEFAULT_LIMITS = DeviceLimits()


def _where(limits: DeviceLimits, place: str) -> dict[str, int]:
    return {f.name: getattr(limits, f.name) for f in dataclasses.fields(limits) if f.metadata.get(place)}


def config_fields(limits: DeviceLimits) -> dict[str, int]:
    """The limits struct vrdma_config carries, by field name."""
    return {**_where(limits, "config"), "max_ucontext": limits.doorbell_pages - FIRST_USER_PAGE}


# Cached: QUERY_DEVICE answers it on every call, and walking the dataclass's fields each time doubled the command's
# cost in the backend (limits are frozen, so one answer per DeviceLimits holds for the process's life).
@functools.cache
def query_fields(limits: DeviceLimits) -> Mapping[str, int]:
    """The limits QUERY_DEVICE answers, by field of struct vrdma_resp_query_device."""
    return MappingProxyType({**_where(limits, "query"), "max_qp_init_rd_atom": limits.max_qp_rd_atom})


def engine_limits(limits: DeviceLimits) -> EngineLimits:
    """struct vre_device_limits for the data engine."""
    fields = {f.metadata["engine"]: getattr(limits, f.name) for f in dataclasses.fields(limits)
              if f.metadata.get("engine")}
    return cast(EngineLimits, {**fields, "max_mr_pages": limits.max_mr_size // abi.const("VRDMA_PAGE_SIZE")})
