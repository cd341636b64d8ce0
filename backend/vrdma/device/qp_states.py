"""The queue pair state machines of the InfiniBand specification (modify_qp), as tables: RC, UC, UD, GSI and XRC.

For each (current state, next state) a guest may ask for: the attributes it must give and those it may give.
Anything else in the mask is refused, as a real HCA's firmware (and the kernel's ib_modify_qp_is_ok) refuses it:
the backend checks it again because the guest kernel is not trusted.
"""

from __future__ import annotations

from enum import IntEnum

from vrdma.device import abi


class QpState(IntEnum):
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6


abi.check_enum(QpState, "VRDMA_QPS_")
RESET, INIT, RTR, RTS, SQD, SQE, ERR = QpState
STATE_NAMES = {state.value: state.name for state in QpState}


def _m(*names: str) -> int:
    mask = 0
    for name in names:
        mask |= abi.const(f"VRDMA_QP_{name}")
    return mask


STATE = _m("STATE")
ALL_ATTRS = _m("STATE", "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX", "PORT", "QKEY", "AV",
               "PATH_MTU", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "RQ_PSN", "MAX_QP_RD_ATOMIC", "ALT_PATH",
               "MIN_RNR_TIMER", "SQ_PSN", "MAX_DEST_RD_ATOMIC", "PATH_MIG_STATE", "CAP", "DEST_QPN")

# (current, next) -> (required, optional), for RC queue pairs.
TRANSITIONS: dict[tuple[int, int], tuple[int, int]] = {
    (RESET, INIT): (_m("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS"), 0),
    (INIT, INIT): (0, _m("PKEY_INDEX", "PORT", "ACCESS_FLAGS")),
    (INIT, RTR): (_m("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN", "MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER"),
                  _m("ALT_PATH", "ACCESS_FLAGS", "PKEY_INDEX")),
    (RTR, RTS): (_m("STATE", "SQ_PSN", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "MAX_QP_RD_ATOMIC"),
                 _m("CUR_STATE", "ALT_PATH", "ACCESS_FLAGS", "MIN_RNR_TIMER", "PATH_MIG_STATE")),
    (RTS, RTS): (0, _m("CUR_STATE", "ACCESS_FLAGS", "ALT_PATH", "PATH_MIG_STATE", "MIN_RNR_TIMER")),
    (RTS, SQD): (_m("STATE"), _m("EN_SQD_ASYNC_NOTIFY")),
    (SQD, RTS): (_m("STATE"), _m("CUR_STATE", "ALT_PATH", "ACCESS_FLAGS", "MIN_RNR_TIMER", "PATH_MIG_STATE")),
    (SQD, SQD): (0, _m("AV", "ALT_PATH", "ACCESS_FLAGS", "PKEY_INDEX", "MIN_RNR_TIMER", "PATH_MIG_STATE",
                       "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "MAX_QP_RD_ATOMIC", "MAX_DEST_RD_ATOMIC")),
}
# The same for UD queue pairs: a Q_Key instead of a path, and no destination.
UD_TRANSITIONS: dict[tuple[int, int], tuple[int, int]] = {
    (RESET, INIT): (_m("STATE", "PKEY_INDEX", "PORT", "QKEY"), 0),
    (INIT, INIT): (0, _m("PKEY_INDEX", "PORT", "QKEY")),
    (INIT, RTR): (_m("STATE"), _m("PKEY_INDEX", "QKEY")),
    (RTR, RTS): (_m("STATE", "SQ_PSN"), _m("CUR_STATE", "QKEY")),
    (RTS, RTS): (0, _m("CUR_STATE", "QKEY")),
    (RTS, SQD): (_m("STATE"), _m("EN_SQD_ASYNC_NOTIFY")),
    (SQD, RTS): (_m("STATE"), _m("CUR_STATE", "QKEY")),
    (SQD, SQD): (0, _m("PKEY_INDEX", "QKEY")),
}
# UC queue pairs: a path and a destination as RC, but nothing of acknowledgements (no timeout, retries, RNR timer,
# or reads and atomics in flight).
UC_TRANSITIONS: dict[tuple[int, int], tuple[int, int]] = {
    (RESET, INIT): (_m("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS"), 0),
    (INIT, INIT): (0, _m("PKEY_INDEX", "PORT", "ACCESS_FLAGS")),
    (INIT, RTR): (_m("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN"), _m("ALT_PATH", "ACCESS_FLAGS", "PKEY_INDEX")),
    (RTR, RTS): (_m("STATE", "SQ_PSN"), _m("CUR_STATE", "ALT_PATH", "ACCESS_FLAGS", "PATH_MIG_STATE")),
    (RTS, RTS): (0, _m("CUR_STATE", "ACCESS_FLAGS", "ALT_PATH", "PATH_MIG_STATE")),
    (RTS, SQD): (_m("STATE"), _m("EN_SQD_ASYNC_NOTIFY")),
    (SQD, RTS): (_m("STATE"), _m("CUR_STATE", "ALT_PATH", "ACCESS_FLAGS", "PATH_MIG_STATE")),
    (SQD, SQD): (0, _m("AV", "ALT_PATH", "ACCESS_FLAGS", "PKEY_INDEX", "PATH_MIG_STATE")),
}
# XRC initiators: the requester half of RC (no receive side to set up: no RNR timer, no reads to take in).
XRC_INI_TRANSITIONS: dict[tuple[int, int], tuple[int, int]] = {
    **TRANSITIONS,
    (INIT, RTR): (_m("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN"), _m("ALT_PATH", "ACCESS_FLAGS", "PKEY_INDEX")),
    (RTR, RTS): (_m("STATE", "SQ_PSN", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "MAX_QP_RD_ATOMIC"),
                 _m("CUR_STATE", "ALT_PATH", "ACCESS_FLAGS", "PATH_MIG_STATE")),
    (RTS, RTS): (0, _m("CUR_STATE", "ACCESS_FLAGS", "ALT_PATH", "PATH_MIG_STATE")),
    (SQD, RTS): (_m("STATE"), _m("CUR_STATE", "ALT_PATH", "ACCESS_FLAGS", "PATH_MIG_STATE")),
    (SQD, SQD): (0, _m("AV", "ALT_PATH", "ACCESS_FLAGS", "PKEY_INDEX", "PATH_MIG_STATE", "TIMEOUT", "RETRY_CNT",
                       "RNR_RETRY", "MAX_QP_RD_ATOMIC")),
}
# XRC targets: the responder half (an RTS without retries: a target sends nothing but responses).
XRC_TGT_TRANSITIONS: dict[tuple[int, int], tuple[int, int]] = {
    **TRANSITIONS,
    (RTR, RTS): (_m("STATE", "SQ_PSN", "TIMEOUT"),
                 _m("CUR_STATE", "ALT_PATH", "ACCESS_FLAGS", "MIN_RNR_TIMER", "PATH_MIG_STATE")),
    (SQD, SQD): (0, _m("AV", "ALT_PATH", "ACCESS_FLAGS", "PKEY_INDEX", "MIN_RNR_TIMER", "PATH_MIG_STATE",
                       "TIMEOUT", "MAX_DEST_RD_ATOMIC")),
}
# ... and for the GSI queue pair (QP1), which belongs to its port: no port to give.
GSI_TRANSITIONS = {**UD_TRANSITIONS, (RESET, INIT): (_m("STATE", "PKEY_INDEX", "QKEY"), 0),
                   (INIT, INIT): (0, _m("PKEY_INDEX", "QKEY"))}
# One transition the verbs do not have: RESET to RTR in one MODIFY_QP, with the attributes of RESET->INIT and
# INIT->RTR together. A driver may keep RESET->INIT to itself and tell the device with the next transition: one
# command fewer per QP (docs/device-interface.md). The checks are those of the two transitions.
ALL_TABLES = (TRANSITIONS, UC_TRANSITIONS, UD_TRANSITIONS, GSI_TRANSITIONS, XRC_INI_TRANSITIONS, XRC_TGT_TRANSITIONS)
for _table in ALL_TABLES:
    (_init_req, _init_opt), (_rtr_req, _rtr_opt) = _table[(RESET, INIT)], _table[(INIT, RTR)]
    _table[(RESET, RTR)] = (_init_req | _rtr_req, (_init_opt | _rtr_opt) & ~(_init_req | _rtr_req))
for _table in ALL_TABLES:
    for _state in (RESET, INIT, RTR, RTS, SQD, SQE, ERR):
        _table[(_state, RESET)] = (_m("STATE"), 0)
        _table[(_state, ERR)] = (_m("STATE"), 0)


def check_transition(current: int, mask: int, next_state: int | None, cur_state_attr: int | None,
                     table: dict[tuple[int, int], tuple[int, int]] = TRANSITIONS) -> int:
    """The state the QP moves to under ``table`` (TRANSITIONS: RC); raises ValueError saying what is wrong."""
    if mask & ~ALL_ATTRS:
        raise ValueError(f"unknown attribute bits {mask & ~ALL_ATTRS:#x}")
    if cur_state_attr is not None and cur_state_attr != current:
        raise ValueError(f"cur_qp_state {STATE_NAMES.get(cur_state_attr, cur_state_attr)} but the QP is in "
                         f"{STATE_NAMES[current]}")
    target = next_state if next_state is not None else current
    rule = table.get((current, target))
    if rule is None:
        raise ValueError(f"no transition from {STATE_NAMES[current]} to {STATE_NAMES.get(target, target)}")
    required, optional = rule
    missing = required & ~mask
    if missing:
        raise ValueError(f"{STATE_NAMES[current]} -> {STATE_NAMES[target]} requires attributes {missing:#x}")
    extra = mask & ~(required | optional | STATE | _m("CUR_STATE"))
    if extra:
        raise ValueError(f"{STATE_NAMES[current]} -> {STATE_NAMES[target]} does not take attributes {extra:#x}")
    return target
