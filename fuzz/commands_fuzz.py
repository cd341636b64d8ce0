"""Coverage-guided fuzzing of the control-command decoder (RdmaDevice.execute and the handlers behind it), atheris.

One device model, in process, with its own data engine and a fake guest RAM (an anonymous mapping registered as
its memory table, with page-list pages whose entries name its pages). Each input resets the device and runs up to
MAX_COMMANDS records, each one command as the driver would put it on the control queue (raw bytes: any header,
any size) with the room it gives for the response, or a change of the memory table between commands (objects
whose pages vanish, come back elsewhere). A handle field holding a small number n names the n-th value an earlier
response of the same input returned (handles carry random generation bits, so an input could not name them
otherwise); everything else goes to the device as it is. A command counts as one input of this interface.

Input format: records of [action u8][capacity u8][length u16 LE][length bytes]; action % 16 == 15 changes the
memory table (capacity % 4 chooses it, see GuestRam.table), anything else sends the bytes as a command with room
for a page of response, or for (capacity - 0xC0) * 2 bytes when capacity >= 0xC0. ``seeds()`` writes the seed
corpus: what a driver sends to set up every kind of object, and the ways it goes wrong.

Properties checked on every command:
- nothing but a response comes back (ResponseTooSmall only when the driver gave less than a response header);
- the response fits the space given, echoes opcode and sequence number, carries one of the protocol's statuses,
  and has exactly its struct's size when the status is OK;
and after every input, the model's bookkeeping is consistent: reference counts are not negative and every QP the
model knows also exists in the engine.

``python -m fuzz.commands_fuzz [libFuzzer options] [corpus dirs or files]``; ``python -m fuzz.commands_fuzz
--write-seeds DIR`` writes the seeds.
"""

from __future__ import annotations

import functools
import logging
import mmap
from dataclasses import dataclass
from typing import Any

import atheris

from fuzz.atheris_main import Stats, main_or_seeds

with atheris.instrument_imports(include=["vrdma"]):
    from vrdma.device import abi, ah, commands, cq, device, gid, mr, objects, pd, pool, qp, qp_states, rings, srq
    from vrdma.device import ucontext as ucontext_module
    from vrdma.device.commands import COMMANDS, RESP_HDR_SIZE
    from vrdma.device.status import ResponseTooSmall
    from vrdma.engine.native import Engine
    from vrdma.engine.native import ffi as engine_ffi
from vrdma.testing.simulated_guest import (
    encode_command,  # after the block: the encoder is the fuzzer's, not the target's
)

PAGE = abi.const("VRDMA_PAGE_SIZE")
PBL = abi.const("VRDMA_PBL_ENTRIES")
RAM_PAGES = 256
GPA_BASE = 0x100000
LIST_PAGES = 8                    # pages 0..7 hold page lists; page 8 is a two-level directory naming them
MAX_COMMANDS = 32
STATUSES = {abi.const(f"VRDMA_STATUS_{name}") for name in ("OK", "NOT_SUPPORTED", "INVALID", "BAD_LENGTH",
                                                          "NO_RESOURCES", "BUSY")}
HANDLE_FIELDS = {"handle", "pd", "ucontext", "send_cq", "recv_cq", "srq", "dest_qp_num"}
RETURNED_FIELDS = ("handle", "lkey", "rkey", "qpn", "doorbell_page", "db_index")
MEMORY_TABLE = 15

# Only the device's behaviour matters here, not its log lines (which would cost more than the commands).
logging.disable(logging.CRITICAL)
# Instrumented by the imports above.
assert ah and commands and cq and gid and mr and objects and pd and pool and qp and qp_states and rings and srq
assert ucontext_module


@dataclass(frozen=True)
class Leaf:
    """One scalar or byte-array field of a request, flattened: where it is and what it means."""

    offset: int
    size: int
    name: str
    parent: str       # name of the enclosing struct field ("" at top level)
    array: bool


def _leaves(ctype: Any, base: int = 0, parent: str = "") -> list[Leaf]:
    out: list[Leaf] = []
    for name, field in ctype.fields:
        kind = field.type.kind
        if kind == "struct":
            out += _leaves(field.type, base + field.offset, name)
        else:
            out.append(Leaf(base + field.offset, abi.ffi.sizeof(field.type), name, parent, kind == "array"))
    return out


def _layout(struct: str) -> list[Leaf]:
    return _leaves(abi.ffi.typeof(f"struct {struct}"))


REQUESTS = {opcode: (_layout(c.request), abi.sizeof(c.request)) for opcode, c in COMMANDS.items()}
RESPONSES = {opcode: [leaf for leaf in _layout(c.response) if leaf.name in RETURNED_FIELDS and not leaf.array]
             for opcode, c in COMMANDS.items()}


class GuestRam:
    """Anonymous memory registered as the device's guest RAM: data pages, and page lists that name them."""

    def __init__(self) -> None:
        self.map = mmap.mmap(-1, RAM_PAGES * PAGE)
        self.address = int(engine_ffi.cast("uintptr_t", engine_ffi.from_buffer(self.map)))
        for k in range(LIST_PAGES):
            entries = [GPA_BASE + ((k * 32 + i) % RAM_PAGES) * PAGE for i in range(PBL)]
            self.map[k * PAGE:(k + 1) * PAGE] = b"".join(e.to_bytes(8, "little") for e in entries)
        directory = [GPA_BASE + k * PAGE for k in range(LIST_PAGES)] * (PBL // LIST_PAGES)
        self.map[LIST_PAGES * PAGE:(LIST_PAGES + 1) * PAGE] = b"".join(e.to_bytes(8, "little") for e in directory)

    def table(self, variant: int) -> list[tuple[int, int, int]]:
        """The whole RAM, its first half, nothing, or the whole RAM at another guest-physical address."""
        return [[(GPA_BASE, RAM_PAGES * PAGE, self.address)],
                [(GPA_BASE, RAM_PAGES * PAGE // 2, self.address)],
                [],
                [(GPA_BASE * 16, RAM_PAGES * PAGE, self.address)]][variant % 4]


class Session:
    """The device every input runs on (reset at the start of each)."""

    def __init__(self) -> None:
        self.device = device.RdmaDevice("fuzz", engine=Engine(1))
        self.ram = GuestRam()
        self.stats = Stats("commands")

    def start(self) -> None:
        self.device.reset()
        self.device.set_memory(self.ram.table(0))


@functools.cache
def session() -> Session:
    """The one device of this fuzzer process (made on first use, so that importing the module costs nothing)."""
    return Session()


def _check_response(opcode: int, seq: int, request: bytes, capacity: int, response: bytes) -> None:
    assert len(response) <= capacity, f"a {len(response)}-byte response for {capacity} bytes of room"
    assert len(response) >= RESP_HDR_SIZE, f"a {len(response)}-byte response"
    hdr = abi.from_bytes("vrdma_resp_hdr", response[:RESP_HDR_SIZE])
    assert hdr.status in STATUSES, f"status {hdr.status}"
    if len(request) >= abi.sizeof("vrdma_cmd_hdr"):
        assert (hdr.opcode, hdr.seq) == (opcode, seq), f"response to {opcode}/{seq} says {hdr.opcode}/{hdr.seq}"
    if hdr.status == abi.const("VRDMA_STATUS_OK"):
        assert opcode in COMMANDS, f"unknown opcode {opcode} succeeded"
        expected = abi.sizeof(COMMANDS[opcode].response)
        assert len(response) == expected, f"{COMMANDS[opcode].name}: {len(response)}-byte response, not {expected}"


def _check_bookkeeping(rdma: device.RdmaDevice) -> None:
    objs = rdma.objects
    pools: tuple[tuple[str, pool.Pool[pd.Pd] | pool.Pool[cq.Cq] | pool.Pool[srq.Srq]], ...] = (
        ("PD", objs.pds.pool), ("CQ", objs.cqs.pool), ("SRQ", objs.srqs.pool))
    for kind, table in pools:
        for handle, obj in table.objects.items():
            assert obj.refs >= 0, f"{kind} {handle:#x} has {obj.refs} references"
    for handle, ctx in objs.ucontexts.pool.objects.items():
        assert ctx.queues >= 0, f"user context {handle:#x} has {ctx.queues} queues"
    for handle, queue_pair in objs.qps.pool.objects.items():
        rdma.seat.engine.qp_state(rdma.engine_index, queue_pair.slot)  # EngineError: the engine lost the QP
        assert queue_pair.send_cq in objs.cqs.pool.objects and queue_pair.recv_cq in objs.cqs.pool.objects, \
            f"QP {handle:#x} lost its CQs"


def _patch_handles(opcode: int, request: bytearray, returned: list[int]) -> None:
    """Handle fields (and dest_qp_num) holding 1..len(returned) name the values earlier responses returned (a real
    handle or QP number is never that small: generation bits above the slot), so inputs can refer to objects whose
    handles are random."""
    for leaf in REQUESTS[opcode][0] if opcode in REQUESTS else []:
        if leaf.name in HANDLE_FIELDS and not leaf.array and leaf.offset + leaf.size <= len(request):
            value = int.from_bytes(request[leaf.offset:leaf.offset + leaf.size], "little")
            if 0 < value <= len(returned):
                request[leaf.offset:leaf.offset + leaf.size] = \
                    (returned[value - 1] % (1 << 8 * leaf.size)).to_bytes(leaf.size, "little")


def records(data: bytes) -> list[tuple[int, int, bytes]]:
    """An input's records: (action, capacity byte, command bytes), at most MAX_COMMANDS."""
    out: list[tuple[int, int, bytes]] = []
    at = 0
    while at + 4 <= len(data) and len(out) < MAX_COMMANDS:
        action, cap, length = data[at], data[at + 1], int.from_bytes(data[at + 2:at + 4], "little")
        out.append((action, cap, data[at + 4:at + 4 + length]))
        at += 4 + length
    return out


def capacity_of(cap: int) -> int:
    """Room for the response: a page, unless the byte asks for less (0..126 bytes)."""
    return 4096 if cap < 0xC0 else (cap - 0xC0) * 2


def test_one_input(data: bytes) -> None:
    current = session()
    current.start()
    device = current.device
    returned: list[int] = []
    for action, cap, body in records(data):
        if action % 16 == MEMORY_TABLE:
            device.set_memory(current.ram.table(cap))
            continue
        request = bytearray(body)
        opcode = int.from_bytes(request[0:2], "little")
        seq = int.from_bytes(request[4:8], "little")
        _patch_handles(opcode, request, returned)
        capacity = capacity_of(cap)
        current.stats.inputs += 1
        try:
            response = device.execute(bytes(request), capacity)
        except ResponseTooSmall:
            assert capacity < RESP_HDR_SIZE, f"ResponseTooSmall with {capacity} bytes of room"
            continue
        _check_response(opcode, seq, bytes(request), capacity, response)
        if opcode in COMMANDS and len(response) == abi.sizeof(COMMANDS[opcode].response):
            returned += [int.from_bytes(response[leaf.offset:leaf.offset + leaf.size], "little")
                         for leaf in RESPONSES[opcode]]
    _check_bookkeeping(device)
    current.stats.done()


# -- seeds ------------------------------------------------------------------------------------------------------

class Script:
    """Builds one input: commands as a driver sends them, handles named by the index of the value that returned
    them (see _patch_handles), so the seed works whatever random handles the device hands out."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.returned = 0
        self.seq = 0

    def cmd(self, opcode: str, struct: str, capacity: int = 0, **fields: Any) -> list[int]:
        """Append a command; return the indices (1-based) of the values its response returns when it succeeds."""
        self.seq += 1
        code = abi.const(f"VRDMA_CMD_{opcode}")
        body = encode_command(struct, code, self.seq, **fields)
        self.data += bytes([0, capacity]) + len(body).to_bytes(2, "little") + body
        count = len(RESPONSES[code])
        first = self.returned + 1
        self.returned += count
        return list(range(first, first + count))

    def memory(self, variant: int) -> None:
        self.data += bytes([MEMORY_TABLE, variant, 0, 0])

    def modify_qp(self, qp: int, mask: int, **attr: Any) -> None:
        self.cmd("MODIFY_QP", "vrdma_cmd_modify_qp", handle=qp, attr_mask=mask, attr=attr)


def _mask(*names: str) -> int:
    return sum(abi.const(f"VRDMA_QP_{n}") for n in names)


GID = list(bytes.fromhex("00000000000000000000ffffa9fe6401"))


def _objects(s: Script, srq: bool = False) -> dict[str, int]:
    """User context, PD, MR, CQ, QP (with an SRQ if asked), a GID; the QP connected to itself and in RTS."""
    ctx = s.cmd("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext")[0]
    pd = s.cmd("ALLOC_PD", "vrdma_cmd_alloc_pd", ucontext=ctx)[0]
    mr = s.cmd("REG_MR", "vrdma_cmd_reg_mr", pd=pd, access=0xF, iova=0x10000, length=16 * PAGE,
               pages={"addr": GPA_BASE, "npages": 16, "levels": 1})[0]
    cq = s.cmd("CREATE_CQ", "vrdma_cmd_create_cq", ucontext=ctx, entries=64,
               ring={"addr": GPA_BASE + PAGE, "npages": 2, "levels": 1})[0]
    s.cmd("ADD_GID", "vrdma_cmd_add_gid", index=0, type=abi.const("VRDMA_GID_TYPE_ROCE_V2"), gid=GID)
    fields: dict[str, Any] = {"ucontext": ctx, "pd": pd, "send_cq": cq, "recv_cq": cq,
                              "qp_type": abi.const("VRDMA_QPT_RC"), "sq_depth": 16, "sq_stride": 128,
                              "sq_offset": PAGE, "max_send_sge": 4, "max_inline_data": 64}
    objs = {"ctx": ctx, "pd": pd, "mr": mr, "cq": cq}
    if srq:
        objs["srq"] = s.cmd("CREATE_SRQ", "vrdma_cmd_create_srq", ucontext=ctx, pd=pd, depth=16, stride=128,
                            max_sge=4, srq_limit=2, ring={"addr": GPA_BASE + 3 * PAGE, "npages": 2, "levels": 1})[0]
        fields |= {"srq": objs["srq"], "ring": {"addr": GPA_BASE + 2 * PAGE, "npages": 2, "levels": 1}}
    else:
        fields |= {"rq_depth": 16, "rq_stride": 128, "rq_offset": 2 * PAGE, "max_recv_sge": 4,
                   "ring": {"addr": GPA_BASE + 2 * PAGE, "npages": 3, "levels": 1}}
    qp, qpn = s.cmd("CREATE_QP", "vrdma_cmd_create_qp", **fields)
    s.modify_qp(qp, _mask("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS"), qp_state=1, port_num=1,
                qp_access_flags=0xF)
    # Connected to itself: its own GID routes to this device, and dest_qp_num names the QP number returned above.
    s.modify_qp(qp, _mask("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN", "MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER"),
                qp_state=2, path_mtu=3, dest_qp_num=qpn, rq_psn=0, max_dest_rd_atomic=1, min_rnr_timer=1,
                dgid=GID, sgid_index=0, hop_limit=1)
    s.modify_qp(qp, _mask("STATE", "SQ_PSN", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "MAX_QP_RD_ATOMIC"),
                qp_state=3, sq_psn=0, timeout=14, retry_cnt=7, rnr_retry=7, max_rd_atomic=1)
    objs["qp"] = qp
    return objs


def seeds() -> dict[str, bytes]:
    def lifecycle(srq: bool) -> bytes:
        s = Script()
        s.cmd("QUERY_DEVICE", "vrdma_cmd_query_device")
        s.cmd("QUERY_PORT", "vrdma_cmd_query_port", port=1)
        o = _objects(s, srq=srq)
        s.cmd("QUERY_QP", "vrdma_cmd_destroy", handle=o["qp"])
        s.cmd("QUERY_QP_COUNTERS", "vrdma_cmd_destroy", handle=o["qp"])
        s.cmd("ALLOC_MR", "vrdma_cmd_alloc_mr", pd=o["pd"], max_pages=4)  # the kernel's only: refused here
        s.cmd("MODIFY_CQ", "vrdma_cmd_modify_cq", handle=o["cq"], cq_count=4, cq_period=10)
        if srq:
            s.cmd("QUERY_SRQ", "vrdma_cmd_destroy", handle=o["srq"])
            s.cmd("MODIFY_SRQ", "vrdma_cmd_modify_srq", handle=o["srq"], attr_mask=abi.const("VRDMA_SRQ_LIMIT"),
                  srq_limit=3)
        ah = s.cmd("CREATE_AH", "vrdma_cmd_create_ah", pd=o["pd"], sgid_index=0, hop_limit=1, dgid=GID)[0]
        s.cmd("DESTROY_AH", "vrdma_cmd_destroy", handle=ah)
        s.cmd("DESTROY_QP", "vrdma_cmd_destroy", handle=o["qp"])
        if srq:
            s.cmd("DESTROY_SRQ", "vrdma_cmd_destroy", handle=o["srq"])
        s.cmd("DEREG_MR", "vrdma_cmd_destroy", handle=o["mr"])
        s.cmd("DESTROY_CQ", "vrdma_cmd_destroy", handle=o["cq"])
        s.cmd("DEALLOC_PD", "vrdma_cmd_destroy", handle=o["pd"])
        s.cmd("DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=o["ctx"])
        s.cmd("DEL_GID", "vrdma_cmd_del_gid", index=0)
        return bytes(s.data)

    def busy() -> bytes:
        s = Script()
        o = _objects(s)
        for what, handle in (("DESTROY_CQ", o["cq"]), ("DEALLOC_PD", o["pd"]), ("DEALLOC_UCONTEXT", o["ctx"])):
            s.cmd(what, "vrdma_cmd_destroy", handle=handle)   # BUSY: the QP holds them
        s.cmd("DESTROY_QP", "vrdma_cmd_destroy", handle=o["qp"])
        s.cmd("DESTROY_QP", "vrdma_cmd_destroy", handle=o["qp"])  # stale handle
        return bytes(s.data)

    def memory_changes() -> bytes:
        s = Script()
        o = _objects(s)
        s.memory(1)   # half the RAM: the rings' pages are still there
        s.memory(2)   # none: every object's pages are gone
        s.modify_qp(o["qp"], _mask("STATE"), qp_state=abi.const("VRDMA_QPS_ERR"))
        s.modify_qp(o["qp"], _mask("STATE"), qp_state=abi.const("VRDMA_QPS_RESET"))
        s.cmd("QUERY_QP", "vrdma_cmd_destroy", handle=o["qp"])
        s.memory(3)   # the RAM elsewhere in guest-physical space
        s.cmd("REG_MR", "vrdma_cmd_reg_mr", pd=o["pd"], access=0x1, iova=0, length=PAGE,
              pages={"addr": GPA_BASE * 16, "npages": 1, "levels": 1})
        s.memory(0)
        s.cmd("DESTROY_QP", "vrdma_cmd_destroy", handle=o["qp"])
        return bytes(s.data)

    def two_level_mr() -> bytes:
        s = Script()
        ctx = s.cmd("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext")[0]
        pd = s.cmd("ALLOC_PD", "vrdma_cmd_alloc_pd", ucontext=ctx)[0]
        s.cmd("REG_MR", "vrdma_cmd_reg_mr", pd=pd, access=0x5, iova=1 << 40, length=600 * PAGE - 100,
              page_offset=100, pages={"addr": GPA_BASE + LIST_PAGES * PAGE, "npages": 600, "levels": 2})
        return bytes(s.data)

    def small_responses() -> bytes:
        s = Script()
        for capacity in (0xC0, 0xC3, 0xC4, 0xC8, 0xCC):
            s.cmd("QUERY_DEVICE", "vrdma_cmd_query_device", capacity=capacity)
            s.cmd("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", capacity=capacity)
        return bytes(s.data)

    return {"lifecycle": lifecycle(False), "lifecycle-srq": lifecycle(True), "busy": busy(),
            "memory-changes": memory_changes(), "two-level-mr": two_level_mr(), "small-responses": small_responses()}


if __name__ == "__main__":
    main_or_seeds(test_one_input, seeds)
