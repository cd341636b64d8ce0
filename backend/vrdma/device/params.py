"""Every limit of the device in one table: what config space and QUERY_DEVICE advertise and what is enforced."""

from __future__ import annotations

from dataclasses import dataclass

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


@dataclass(frozen=True)
class DeviceLimits:
    max_qp: int = 1024
    max_qp_wr: int = 4096
    max_sge: int = 16
    max_inline_data: int = 256
    max_cq: int = 1024
    max_cqe: int = 65536
    max_mr: int = 4096
    max_mr_size: int = 1 * GIB      # two levels of page-list pages: 512 * 512 pages of 4 KiB
    # Pages translated for all of one VM's MRs and rings together (an HCA's translation-table size): 16 GiB
    # registered at once. Each costs the backend 16 bytes whatever page it names, so this bounds a VM at 64 MiB.
    max_translated_pages: int = 1 << 22
    max_pd: int = 1024
    max_srq: int = 256
    max_srq_wr: int = 4096
    max_srq_sge: int = 16
    max_ah: int = 1024
    max_qp_rd_atom: int = 16
    doorbell_pages: int = 64        # header page + 63 user-context pages; a power of two for ivshmem
    gid_table_len: int = 16
    max_msg_size: int = 1 << 31
    page_size_cap: int = 4 * KIB
    max_command_size: int = 4 * KIB  # largest control command the device reads from a chain
    max_pending_events: int = 1024   # events kept while the driver has posted no event buffers
    # Data engine
    poll_budget: int = 64            # send WQEs one QP may run per poll, so that no QP starves the others
    park_after_idle_us: int = 50     # poll this long without work, then park until a guest wakes the device
    spin_us: int = 200               # one turn of the engine polls in C this long before the event loop looks
                                     # at its descriptors again (control commands wait at most this much)


DEFAULT_LIMITS = DeviceLimits()
