"""The device API's value sets as typed enums, each held to the header's constants at import.

A member missing here, one the header lacks, or a value that differs fails the import with the member's name, so
the Python side cannot drift from vrdma_dev_api.h; code names ``CommandOpcode.REG_MR`` where it once looked up
``"VRDMA_CMD_REG_MR"`` by string, and strict mypy checks the name. Statuses live in status.py and QP states in
qp_states.py beside the code that gives them meaning; both are held to the header the same way.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

from vrdma.device import abi


class CommandOpcode(IntEnum):
    QUERY_DEVICE = 1
    QUERY_PORT = 2
    ADD_GID = 3
    DEL_GID = 4
    ALLOC_UCONTEXT = 5
    DEALLOC_UCONTEXT = 6
    ALLOC_PD = 7
    DEALLOC_PD = 8
    REG_MR = 9
    DEREG_MR = 10
    CREATE_CQ = 11
    DESTROY_CQ = 12
    CREATE_QP = 13
    MODIFY_QP = 14
    QUERY_QP = 15
    DESTROY_QP = 16
    CREATE_SRQ = 17
    MODIFY_SRQ = 18
    QUERY_SRQ = 19
    DESTROY_SRQ = 20
    CREATE_AH = 21
    DESTROY_AH = 22
    MODIFY_CQ = 23
    QUERY_COUNTERS = 24
    ALLOC_XRCD = 25
    DEALLOC_XRCD = 26
    QUERY_QP_COUNTERS = 27
    ALLOC_MR = 28
    ALLOC_MW = 29
    DEALLOC_MW = 30
    REREG_MR = 31


class EventType(IntEnum):
    NONE = 0
    PORT_ACTIVE = 1
    CQ_COMP = 2
    CQ_ERR = 3
    QP_FATAL = 4
    QP_REQ_ERR = 5
    QP_ACCESS_ERR = 6
    QP_LAST_WQE = 7
    SRQ_LIMIT = 8


class Access(IntFlag):
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8
    MW_BIND = 0x10


class QpType(IntEnum):
    GSI = 1
    RC = 2
    UC = 3
    UD = 4
    XRC_INI = 9
    XRC_TGT = 10


class GidType(IntEnum):
    ROCE_V1 = 1
    ROCE_V2 = 2


class WrOpcode(IntEnum):
    """What a send WQE asks (struct vrdma_send_wqe.opcode)."""

    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6
    LOCAL_INV = 7
    BIND_MW = 8
    SEND_WITH_INV = 9
    REG_MR = 0x20


class WcStatus(IntEnum):
    """How a work request ended (struct vrdma_cqe.status)."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    FATAL_ERR = 15
    GENERAL_ERR = 21


class WcOpcode(IntEnum):
    """What a completion completes (struct vrdma_cqe.opcode)."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    BIND_MW = 5
    LOCAL_INV = 6
    REG_MR = 8
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


class WcFlags(IntFlag):
    GRH = 1
    WITH_IMM = 2
    WITH_INV = 4


abi.check_enum(CommandOpcode, "VRDMA_CMD_")
abi.check_enum(WrOpcode, "VRDMA_WR_")
abi.check_enum(WcStatus, "VRDMA_WC_", exclude=("OP_", "GRH", "WITH_"))
abi.check_enum(WcOpcode, "VRDMA_WC_OP_")
abi.check_enum(WcFlags, "VRDMA_WC_", exclude=(*(s.name for s in WcStatus), "OP_"))
abi.check_enum(EventType, "VRDMA_EVENT_")
abi.check_enum(Access, "VRDMA_ACCESS_")
abi.check_enum(QpType, "VRDMA_QPT_")
abi.check_enum(GidType, "VRDMA_GID_TYPE_")
