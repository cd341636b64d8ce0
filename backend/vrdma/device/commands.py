"""Control commands: one dispatch table of opcode -> (request struct, response struct, handler), one dispatcher.

A command arrives as the bytes of a control-queue chain's device-readable part. ``execute`` checks, in order:
the response header fits the room the driver gave, the command header fits, the opcode is known, the reserved
header field is zero, the request has exactly its struct's size, the response fits. Anything else gets a
response header with a status; nothing in a request is used before it is checked, and a handler's CommandFailed
becomes the response status here and nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vrdma.device import abi
from vrdma.device.constants import CommandOpcode
from vrdma.device.objects import DeviceObjects
from vrdma.device.params import query_fields
from vrdma.device.status import CommandFailed, ResponseTooSmall, Status

log = logging.getLogger(__name__)

RESP_HDR_SIZE = abi.sizeof("vrdma_resp_hdr")
CMD_HDR_SIZE = abi.sizeof("vrdma_cmd_hdr")

Handler = Callable[[DeviceObjects, Any, Any], None]  # (the device's objects, request, response to fill)


@dataclass(frozen=True)
class Command:
    name: str
    request: str
    response: str
    handler: Handler


@dataclass
class CommandCounters:
    commands: int = 0
    command_errors: int = 0
    by_opcode: dict[str, int] = field(default_factory=dict)


def _reserved_zero(request: Any, name: str) -> None:
    if request.reserved:
        raise CommandFailed(Status.INVALID, f"reserved field of {name} is {request.reserved}")


def _by_handle(pick: Callable[[DeviceObjects], Callable[[int], None]]) -> Handler:
    """The handler of a command that names one object by handle (struct vrdma_cmd_destroy) and answers with a
    header (dealloc, dereg and destroy of every kind): ``pick`` chooses the table's method that acts."""
    def handler(objs: DeviceObjects, request: Any, response: Any) -> None:
        if request.reserved:
            raise CommandFailed(Status.INVALID, f"reserved field is {request.reserved}")
        pick(objs)(int(request.handle))
    return handler


def _query_device_body(objs: DeviceObjects) -> bytes:
    """QUERY_DEVICE's answer after its header: the device's limits and identity, which never change."""
    response = abi.new("vrdma_resp_query_device", **query_fields(objs.limits))
    response.fw_ver = objs.identity.fw_version
    response.node_guid = objs.identity.node_guid
    response.sys_image_guid = objs.identity.node_guid
    response.vendor_id = 0x1AF4
    response.vendor_part_id = abi.const("VRDMA_VIRTIO_ID")
    response.hw_ver = abi.const("VRDMA_ABI_VERSION")
    return abi.to_bytes(response)[RESP_HDR_SIZE:]


def _query_device(objs: DeviceObjects, request: Any, response: Any) -> None:
    # Made once per device and copied: setting its twenty fields one by one was most of the command's time.
    body = objs.fixed_answers.get(CommandOpcode.QUERY_DEVICE)
    if body is None:
        body = objs.fixed_answers[CommandOpcode.QUERY_DEVICE] = _query_device_body(objs)
    abi.ffi.buffer(response)[RESP_HDR_SIZE:] = body


PORT_SPEED_EDR = 32  # IB speed codes as the kernel's enum ib_port_speed: 25 Gb/s a lane
PORT_WIDTH_4X = 2    # enum ib_port_width


def _port_request(request: Any, command: str) -> None:
    if request.port != 1:
        raise CommandFailed(Status.INVALID, f"port {request.port} does not exist (the device has port 1)")
    if any(request.reserved):
        raise CommandFailed(Status.INVALID, f"reserved bytes of {command} are not zero")


def _query_counters(objs: DeviceObjects, request: Any, response: Any) -> None:
    _port_request(request, "QUERY_COUNTERS")
    for name, value in objs.engine_counters().items():
        setattr(response, name, value)


def _query_port(objs: DeviceObjects, request: Any, response: Any) -> None:
    _port_request(request, "QUERY_PORT")
    response.state = abi.const("VRDMA_PORT_STATE_ACTIVE")
    response.max_mtu = 5       # IB_MTU_4096
    response.active_mtu = 3    # IB_MTU_1024, what a 1500-byte Ethernet link carries in RoCE
    response.gid_tbl_len = objs.limits.gid_table_len
    response.max_msg_sz = objs.limits.max_msg_size
    response.pkey_tbl_len = 1
    response.link_layer = abi.const("VRDMA_LINK_LAYER_ETHERNET")
    # 4X EDR, 100 Gb/s: what the device moves between guests is memory bandwidth, and programs that size their
    # work by the link (UCX, NCCL, MPI) must not take it for a 2.5 Gb/s SDR 1X link.
    response.active_speed = PORT_SPEED_EDR
    response.active_width = PORT_WIDTH_4X
    response.phys_state = 5    # LinkUp


def _add_gid(objs: DeviceObjects, request: Any, response: Any) -> None:
    objs.gids.add(int(request.index), bytes(request.gid), int(request.type))


def _del_gid(objs: DeviceObjects, request: Any, response: Any) -> None:
    _reserved_zero(request, "DEL_GID")
    objs.gids.remove(int(request.index))


def _alloc_ucontext(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle, response.doorbell_page = objs.ucontexts.alloc()


def _alloc_pd(objs: DeviceObjects, request: Any, response: Any) -> None:
    _reserved_zero(request, "ALLOC_PD")
    response.handle = objs.pds.alloc(int(request.ucontext))


def _alloc_xrcd(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle = objs.xrcds.alloc()


def _reg_mr(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle, response.lkey, response.rkey = objs.mrs.register(request)


def _alloc_mr(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle, response.key = objs.mrs.allocate(request)


def _rereg_mr(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle, response.lkey, response.rkey = objs.mrs.reregister(request)


def _alloc_mw(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle, response.rkey = objs.mrs.allocate_window(request)


def _create_cq(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle, response.db_index = objs.cqs.create(request)


def _modify_cq(objs: DeviceObjects, request: Any, response: Any) -> None:
    objs.cqs.moderate(int(request.handle), int(request.cq_count), int(request.cq_period))


def _create_qp(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle, response.qpn, response.sq_db_index, response.rq_db_index = objs.qps.create(request)


def _modify_qp(objs: DeviceObjects, request: Any, response: Any) -> None:
    objs.qps.modify(request)


def _query_qp(objs: DeviceObjects, request: Any, response: Any) -> None:
    _reserved_zero(request, "QUERY_QP")
    objs.qps.query(int(request.handle), response.attr)


def _query_qp_counters(objs: DeviceObjects, request: Any, response: Any) -> None:
    _reserved_zero(request, "QUERY_QP_COUNTERS")
    for name, value in objs.qps.counters(int(request.handle)).items():
        setattr(response, name, value)


def _create_srq(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle, response.db_index, response.srq_num = objs.srqs.create(request)


def _modify_srq(objs: DeviceObjects, request: Any, response: Any) -> None:
    objs.srqs.modify(request)


def _query_srq(objs: DeviceObjects, request: Any, response: Any) -> None:
    _reserved_zero(request, "QUERY_SRQ")
    response.max_wr, response.max_sge, response.srq_limit = objs.srqs.query(int(request.handle))


def _create_ah(objs: DeviceObjects, request: Any, response: Any) -> None:
    response.handle = objs.ahs.create(request)


def _command(name: str, request: str, response: str, handler: Handler) -> tuple[int, Command]:
    return CommandOpcode[name], Command(name, request, response, handler)


def _destroy(name: str, pick: Callable[[DeviceObjects], Callable[[int], None]]) -> tuple[int, Command]:
    """A command that destroys one object by handle: vrdma_cmd_destroy in, a bare header out."""
    return _command(name, "vrdma_cmd_destroy", "vrdma_resp_hdr", _by_handle(pick))


# Commands that answer with nothing but a header have vrdma_resp_hdr as their response struct; commands that name
# one object by handle share vrdma_cmd_destroy as their request (_destroy: the destroys).
COMMANDS: dict[int, Command] = dict([
    _command("QUERY_DEVICE", "vrdma_cmd_query_device", "vrdma_resp_query_device", _query_device),
    _command("QUERY_PORT", "vrdma_cmd_query_port", "vrdma_resp_query_port", _query_port),
    _command("QUERY_COUNTERS", "vrdma_cmd_query_port", "vrdma_resp_query_counters", _query_counters),
    _command("ADD_GID", "vrdma_cmd_add_gid", "vrdma_resp_hdr", _add_gid),
    _command("DEL_GID", "vrdma_cmd_del_gid", "vrdma_resp_hdr", _del_gid),
    _command("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", "vrdma_resp_alloc_ucontext", _alloc_ucontext),
    _destroy("DEALLOC_UCONTEXT", lambda o: o.ucontexts.dealloc),
    _command("ALLOC_PD", "vrdma_cmd_alloc_pd", "vrdma_resp_alloc_pd", _alloc_pd),
    _destroy("DEALLOC_PD", lambda o: o.pds.dealloc),
    _command("ALLOC_XRCD", "vrdma_cmd_alloc_xrcd", "vrdma_resp_alloc_xrcd", _alloc_xrcd),
    _destroy("DEALLOC_XRCD", lambda o: o.xrcds.dealloc),
    _command("REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", _reg_mr),
    _command("ALLOC_MR", "vrdma_cmd_alloc_mr", "vrdma_resp_alloc_mr", _alloc_mr),
    _destroy("DEREG_MR", lambda o: o.mrs.deregister),
    _command("REREG_MR", "vrdma_cmd_rereg_mr", "vrdma_resp_reg_mr", _rereg_mr),
    _command("ALLOC_MW", "vrdma_cmd_alloc_mw", "vrdma_resp_alloc_mw", _alloc_mw),
    _destroy("DEALLOC_MW", lambda o: o.mrs.deallocate_window),
    _command("CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", _create_cq),
    _destroy("DESTROY_CQ", lambda o: o.cqs.destroy),
    _command("MODIFY_CQ", "vrdma_cmd_modify_cq", "vrdma_resp_hdr", _modify_cq),
    _command("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp", _create_qp),
    _command("MODIFY_QP", "vrdma_cmd_modify_qp", "vrdma_resp_hdr", _modify_qp),
    _command("QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp", _query_qp),
    _command("QUERY_QP_COUNTERS", "vrdma_cmd_destroy", "vrdma_resp_query_qp_counters", _query_qp_counters),
    _destroy("DESTROY_QP", lambda o: o.qps.destroy),
    _command("CREATE_SRQ", "vrdma_cmd_create_srq", "vrdma_resp_create_srq", _create_srq),
    _command("MODIFY_SRQ", "vrdma_cmd_modify_srq", "vrdma_resp_hdr", _modify_srq),
    _command("QUERY_SRQ", "vrdma_cmd_destroy", "vrdma_resp_query_srq", _query_srq),
    _destroy("DESTROY_SRQ", lambda o: o.srqs.destroy),
    _command("CREATE_AH", "vrdma_cmd_create_ah", "vrdma_resp_create_ah", _create_ah),
    _destroy("DESTROY_AH", lambda o: o.ahs.destroy),
])


def execute(objs: DeviceObjects, counters: CommandCounters, owner: str, request: bytes, capacity: int) -> bytes:
    """Run one command; return the response bytes (at most ``capacity``). ResponseTooSmall if none fits."""
    if capacity < RESP_HDR_SIZE:
        counters.command_errors += 1
        raise ResponseTooSmall(f"{capacity} device-writable bytes, a response needs at least {RESP_HDR_SIZE}")
    counters.commands += 1

    def refuse(opcode: int, seq: int, status: Status, reason: str) -> bytes:
        counters.command_errors += 1
        log.warning("%s: command refused (status %d): %s", owner, status, reason)
        return abi.to_bytes(abi.new("vrdma_resp_hdr", opcode=opcode, status=status, seq=seq))

    if len(request) < CMD_HDR_SIZE:
        return refuse(0, 0, Status.BAD_LENGTH, f"a {len(request)}-byte command has no header")
    hdr = abi.from_bytes("vrdma_cmd_hdr", request[:CMD_HDR_SIZE])
    opcode, seq = int(hdr.opcode), int(hdr.seq)
    command = COMMANDS.get(opcode)
    if command is None:
        return refuse(opcode, seq, Status.NOT_SUPPORTED, f"unknown command {opcode}")
    counters.by_opcode[command.name] = counters.by_opcode.get(command.name, 0) + 1
    if hdr.reserved:
        return refuse(opcode, seq, Status.INVALID, f"{command.name}: reserved header field is {hdr.reserved}")
    expected = abi.sizeof(command.request)
    if len(request) != expected:
        return refuse(opcode, seq, Status.BAD_LENGTH, f"{command.name} of {len(request)} bytes (expected {expected})")
    response_size = abi.sizeof(command.response)
    if capacity < response_size:
        return refuse(opcode, seq, Status.BAD_LENGTH,
                      f"{command.name} response needs {response_size} bytes, the driver gave {capacity}")
    body = abi.from_bytes(command.request, request)
    response = abi.new(command.response)
    response_hdr = response if command.response == "vrdma_resp_hdr" else response.hdr
    response_hdr.opcode, response_hdr.seq = opcode, seq
    try:
        command.handler(objs, body, response)
    except CommandFailed as err:
        return refuse(opcode, seq, err.status, f"{command.name}: {err}")
    response_hdr.status = Status.OK
    log.debug("%s: %s seq %d ok", owner, command.name, seq)
    return abi.to_bytes(response)
