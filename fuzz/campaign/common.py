"""What the campaign's parts share: limits and timeouts, the ABI's structs as the campaign packs them, commands,
the failure it reports."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrdma.device import abi
from vrdma.testing.simulated_guest import encode_command

ROOT = Path(__file__).resolve().parents[2]
CRASH_DIR = ROOT / "fuzz" / "crashes" / "campaign"
# The backend's engine threads: two, so that the attacker's device and the victim's are given to threads of their
# own and attacks on the victim's memory cross between threads (the device locks, a destination held for a turn),
# until the engine moves an idle victim to its sender's thread, which it does too.
DEFAULT_ENGINE_THREADS = 2
PAGE = abi.const("VRDMA_PAGE_SIZE")
CMD_HDR = abi.sizeof("vrdma_cmd_hdr")
RESP_HDR = abi.sizeof("vrdma_resp_hdr")
SEND_WQE = struct.Struct("<QBBBxIIIQQQ16x")   # struct vrdma_send_wqe
RECV_WQE = struct.Struct("<QII")              # struct vrdma_recv_wqe
SGE = struct.Struct("<QII")                   # struct vrdma_sge
U32 = struct.Struct("<I")
GID = {"vm0": bytes.fromhex("00000000000000000000ffffa9fe6401"),
       "vm1": bytes.fromhex("00000000000000000000ffffa9fe6402")}
OK = abi.const("VRDMA_STATUS_OK")
ERR = abi.const("VRDMA_QPS_ERR")
QUERY_DEVICE = abi.const("VRDMA_CMD_QUERY_DEVICE")
CQE = struct.Struct("<QBBBxIIIII")            # struct vrdma_cqe
QUERY_QP_RESP = abi.sizeof("vrdma_resp_query_qp")
WR = {name: abi.const(f"VRDMA_WR_{name}") for name in ("SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM",
                                                         "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD")}
OPS = [WR[name] for name in ("SEND", "SEND", "SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE", "RDMA_WRITE",
                             "RDMA_WRITE_WITH_IMM", "RDMA_READ", "RDMA_READ", "ATOMIC_CMP_AND_SWP",
                             "ATOMIC_FETCH_AND_ADD")]
SIGNALED = abi.const("VRDMA_SEND_SIGNALED")
SEND_INLINE = abi.const("VRDMA_SEND_INLINE")
SQ_DEPTH, RQ_DEPTH, SRQ_DEPTH, CQ_ENTRIES = 64, 64, 256, 1024
MAX_SGE, MAX_INLINE = 16, 256
SQ_STRIDE = 512                  # what SimVerbs.create_qp lays out for MAX_SGE and MAX_INLINE
VICTIM_QPS = (0, 0, 1, 1)        # the attacker's QPs aimed at the victim: two at its RQ QP, two at its SRQ QP
LOOPBACK_QPS = 2                 # and two connected to themselves
MR_SIZE = 64 << 10
CANARY_SIZE = 256 << 10
VICTIM_TIMEOUT = 5.0             # a victim command slower than this is a hang
ATTACKER_TIMEOUT = 0.5           # the attacker's own queue may be broken by its own doing: give up quickly
DRAIN_DEADLINE = 0.2             # a send queue that does not drain in this long is moved to the error state
FD_SLACK = 48                    # open fds allowed above the warmed-up count (one connection's kick/call/memory)
RSS_SLACK = 256 << 20            # RSS allowed above the warmed-up value (the attacker's mapped guest memory)
RSS_SLACK_SANITIZED = 768 << 20  # ... plus ASan's quarantine of freed memory (256 MiB) and its shadow
WARMUP_BATCHES = 20
CREATES = {abi.const(f"VRDMA_CMD_{op}"): kind
           for op, kind in (("ALLOC_PD", "pd"), ("REG_MR", "mr"), ("CREATE_CQ", "cq"), ("CREATE_QP", "qp"),
                            ("CREATE_SRQ", "srq"), ("CREATE_AH", "ah"))}
DESTROYS = {abi.const(f"VRDMA_CMD_{op}") for op in ("DESTROY_QP", "DESTROY_CQ", "DEREG_MR", "DEALLOC_PD",
                                                    "DEALLOC_UCONTEXT", "DESTROY_SRQ", "DESTROY_AH")}
COMMAND_SLOTS = 24               # commands in flight at once on a control queue (2 descriptors each)
REQUEST_ROOM = 4160              # largest request the campaign sends (the device reads at most 4 KiB + 1)
RESPONSE_ROOM = 256


class CampaignFailure(Exception):
    """An invariant broke: the process died or hung, the victim's memory changed, fds or RSS grew unbounded."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind           # crash | hang | leak | isolation
        super().__init__(f"{kind}: {detail}")



def cmd(opcode: str, struct_name: str, seq: int, **fields: Any) -> bytes:
    return encode_command(struct_name, abi.const(f"VRDMA_CMD_{opcode}"), seq, **fields)


def mask(*names: str) -> int:
    return sum(abi.const(f"VRDMA_QP_{n}") for n in names)



@dataclass
class Peer:
    """Where a QP points: a destination QP number and GID."""

    qpn: int
    gid: bytes


