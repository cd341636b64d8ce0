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


abi.check_enum(CommandOpcode, "VRDMA_CMD_")
abi.check_enum(EventType, "VRDMA_EVENT_")
abi.check_enum(Access, "VRDMA_ACCESS_")
abi.check_enum(QpType, "VRDMA_QPT_")
abi.check_enum(GidType, "VRDMA_GID_TYPE_")
