"""The data engine's interface as the device model sees it: typed configurations and one Protocol.

The device model is written against ``DataEngine``, not against cffi: ``vrdma.engine.native.Engine`` (the C
engine) is the implementation the backend runs, ``vrdma.testing.fake_engine.FakeEngine`` the one unit tests run
the model against in process. Every configuration is a TypedDict whose keys are the fields of the engine.h struct of the
same name, so strict mypy checks each call the model makes (no engine call is named by a string).

This module imports no C: importing it costs nothing and needs no build.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NotRequired, Protocol, TypedDict

from vrdma.errors import VrdmaError

# engine.h's VRE_NO_DEVICE, VRE_NO_SRQ, VRE_QP_* and VRE_MAX_GIDS (held equal by vrdma.engine at import).
NO_DEVICE = 0xFFFFFFFF
NO_SRQ = -1
QP_KERNEL = 1
QP_UD = 2
QP_GSI = 4
QP_UC = 8
QP_XRC_INI = 16
QP_XRC_TGT = 32
SRQ_KERNEL = 1
MAX_GIDS = 64
MAX_THREADS = 64  # engine threads, at most (VRE_MAX_THREADS)
MAX_REGIONS = 256  # a device's memory table, at most (VRE_MAX_REGIONS)
# The engine's per-device counters (struct vre_counters), in order.
COUNTERS = ("send_wqes", "recv_wqes", "cqes", "bytes", "error_cqes", "flushed", "rnr_waits", "cq_overflows",
            "qp_fatal", "events_dropped", "ud_dropped", "uc_dropped", "tx_bytes", "rx_bytes", "tx_packets",
            "rx_packets")
# One QP's counters (struct vre_qp_counters), in order.
QP_COUNTERS = ("send_wqes", "recv_wqes", "bytes", "error_cqes", "flushed", "rnr_waits")
# A device's RoCE traffic (struct vre_roce_counters), and what arrived that no QP took (struct vre_net_counters).
ROCE_COUNTERS = ("tx_packets", "rx_packets", "retransmits", "timeouts", "seq_naks", "rnr_naks", "duplicates",
                 "dropped", "resp_drop_opcode", "resp_drop_psn", "resp_drop_duplicate", "resp_drop_length",
                 "resp_drop_sequence", "resp_drop_resource", "resp_drop_rkey")
# What a device's share and limits did to it (struct vre_qos_counters).
QOS_COUNTERS = ("turns", "throttled_ns", "deferred_bytes", "pieced_messages")
# struct vre_thread_stats: what the engine's thread did (busy_ns and work feed the metrics; the rest tells, in the log
# at shutdown, how it idled: parks, and what ended each sleep).
THREAD_STATS = ("busy_ns", "work", "passes", "parks", "park_declined", "woken_by_kick", "woken_by_guest",
                "woken_by_packet", "woken_by_time", "lock_waits", "sleep_ns", "devices_taken", "rx_packets")
NET_COUNTERS = ("rx_packets", "rx_malformed", "rx_bad_icrc", "rx_no_qp", "rx_not_peer", "rx_dropped", "tx_packets",
                "tx_dropped")


class EngineLimits(TypedDict):
    """struct vre_device_limits."""

    max_qp: int
    max_cq: int
    max_mr: int
    max_srq: int
    max_sge: int
    max_inline: int
    max_qp_wr: int
    max_cqe: int
    max_srq_wr: int
    max_mr_pages: int
    doorbell_pages: int
    max_pages_total: int
    max_msg_size: int


class SchedConfig(TypedDict):
    """struct vre_sched: how the engine shares itself between the devices with work."""

    quantum_bytes: int
    piece_bytes: int
    wr_cost_bytes: int
    small_piece_bytes: int
    solo_bytes: int


class QosConfig(TypedDict):
    """struct vre_qos: a device's weight and limits (0: no limit)."""

    weight: int
    bytes_per_s: int
    bytes_burst: int
    wrs_per_s: int
    wrs_burst: int
    latency: int  # VRE_LATENCY_NORMAL or VRE_LATENCY_LOW


class PagesDesc(TypedDict):
    """struct vre_pages_desc: a guest-physical page list as the driver described it."""

    addr: int
    npages: int
    levels: int


class MrConfig(TypedDict):
    handle: int
    pd: int
    lkey: int
    rkey: int
    access: int
    page_offset: int
    iova: int
    length: int
    pages: PagesDesc
    max_pages: NotRequired[int]  # a fast-registration MR: room for this many pages, nothing mapped
    mw_type: NotRequired[int]  # 1 or 2: a memory window, bound by BIND_MW work requests


class CqConfig(TypedDict):
    handle: int
    entries: int
    db: int  # doorbell index: page * VRDMA_DB_SLOTS + slot
    ring: PagesDesc


class SrqConfig(TypedDict):
    handle: int
    pd: int
    depth: int
    stride: int
    max_sge: int
    limit: int
    db: int
    flags: int  # SRQ_KERNEL
    xrcd: int  # 0: a basic SRQ
    cq: int  # an XRC SRQ's CQ table slot
    srqn: int  # an XRC SRQ's number (its slot in the low bits)
    ring: PagesDesc


class QpConfig(TypedDict):
    handle: int
    qpn: int
    pd: int
    sq_sig_all: int
    send_cq: int
    recv_cq: int
    srq: int
    sq_depth: int
    rq_depth: int
    sq_stride: int
    rq_stride: int
    sq_offset: int
    rq_offset: int
    max_send_sge: int
    max_recv_sge: int
    max_inline: int
    sq_db: int
    rq_db: int  # 0 with an SRQ
    flags: int
    xrcd: int  # an XRC target's XRC domain, else 0
    ring: PagesDesc


class QpAttr(TypedDict):
    """struct vre_qp_attr: what a modify_qp changes (the model has checked the transition and every value)."""

    state: int
    access_flags: int
    dest_dev: int
    dest_qpn: int
    min_rnr_timer: int
    rnr_retry: int
    retry_cnt: int
    timeout: int
    qkey: int
    # a connected QP whose peer is on another host: the path and the packet sequence numbers RoCE needs
    path_mtu: int  # IB_MTU_256 (1) ... IB_MTU_4096 (5)
    sq_psn: int
    rq_psn: int
    max_rd_atomic: int
    max_dest_rd_atomic: int
    sgid: list[int]  # 16 bytes: its GID (the source of its packets) and its peer's
    dgid: list[int]


@dataclass(frozen=True)
class EngineEvent:
    device: int
    type: int
    handle: int
    data: int


class EngineError(VrdmaError):
    """The engine refused a configuration (its message says why; ``errno`` is ENOMEM when a budget ran out)."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


class DataEngine(Protocol):
    """What the device model and the fabric need of a data engine. Calls that configure raise EngineError when
    the engine refuses."""

    # devices
    def open_device(self, dev: int, limits: EngineLimits, doorbell_base: int) -> None: ...
    def close_device(self, dev: int) -> None: ...
    def set_memory(self, dev: int, regions: list[tuple[int, int, int]]) -> None: ...
    def set_wake_fd(self, dev: int, fd: int) -> None: ...
    # the device addresses page lists may name, [lo, hi] (a container process's commands: its own memory)
    def set_page_window(self, dev: int, lo: int, hi: int) -> None: ...
    # while the VM migrates: the guest pages the engine writes for it marked in the bitmap at `address` (0, 0: none)
    def set_dirty_log(self, dev: int, address: int, size: int) -> None: ...
    # a device's state: suspended (not run, not delivered into), saved, and loaded into an empty device
    # (check_only: checked, nothing kept), which stays suspended until suspend_device(dev, False)
    def suspend_device(self, dev: int, suspended: bool) -> None: ...
    def save_device(self, dev: int) -> bytes: ...
    def load_device(self, dev: int, state: bytes, check_only: bool = False) -> None: ...
    # a VM moved from device `source` to `target` (two seats of one backend): every QP aimed at one, at the other
    def reroute_device(self, source: int, target: int) -> None: ...
    # the objects of a state this engine took (load_device checked it): kind ("mr", "cq", "srq", "qp"), table slot,
    # and the configuration it holds, by struct vre_*_config's field names
    def state_objects(self, state: bytes) -> list[tuple[str, int, dict[str, int]]]: ...
    def set_gid(self, dev: int, index: int, raw: bytes, gid_type: int) -> None: ...
    def route_gid(self, raw: bytes) -> int: ...
    def counters(self, dev: int) -> dict[str, int]: ...
    def roce_counters(self, dev: int) -> dict[str, int]: ...
    # sharing the engine
    def set_schedule(self, sched: SchedConfig) -> None: ...
    def set_qos(self, dev: int, qos: QosConfig) -> None: ...
    def qos_counters(self, dev: int) -> dict[str, int]: ...
    # objects
    def create_mr(self, dev: int, slot: int, config: MrConfig) -> None: ...
    def rereg_mr(self, dev: int, slot: int, config: MrConfig) -> None: ...
    def destroy_mr(self, dev: int, slot: int) -> None: ...
    def create_cq(self, dev: int, slot: int, config: CqConfig) -> None: ...
    def moderate_cq(self, dev: int, slot: int, count: int, period_us: int) -> None: ...
    def destroy_cq(self, dev: int, slot: int) -> None: ...
    def create_srq(self, dev: int, slot: int, config: SrqConfig) -> None: ...
    def set_srq_limit(self, dev: int, slot: int, limit: int) -> None: ...
    def srq_limit(self, dev: int, slot: int) -> int: ...
    def destroy_srq(self, dev: int, slot: int) -> None: ...
    def create_qp(self, dev: int, slot: int, config: QpConfig) -> None: ...
    def modify_qp(self, dev: int, slot: int, attr: QpAttr) -> None: ...
    def qp_state(self, dev: int, slot: int) -> int: ...
    def qp_counters(self, dev: int, slot: int) -> dict[str, int]: ...
    def destroy_qp(self, dev: int, slot: int) -> None: ...
    # the loop
    def poll(self, budget: int) -> int: ...
    def spin(self, budget: int, spin_ns: int) -> int: ...
    def take_events(self) -> list[EngineEvent]: ...
    def next_deadline_ns(self) -> int | None: ...
    def park(self) -> bool: ...
    def unpark(self) -> None: ...
    # with the engine in threads of its own (native.Engine.start_threads)
    def kick(self, dev: int = NO_DEVICE) -> None: ...
    def paused(self, dev: int = NO_DEVICE) -> AbstractContextManager[None]: ...
    def set_recheck(self, period_ns: int) -> None: ...
    def thread_stats(self, thread: int | None = None) -> dict[str, int]: ...
    def device_owner(self, dev: int) -> int | None: ...
