"""Control commands: one dispatch table of opcode -> (request struct, response struct, handler).

A command arrives as the bytes of a control-queue chain's device-readable part. Checks run in order: the header
fits, the opcode is known, the request has exactly its struct's size, the response fits the space the driver
gave. Anything else gets a response header with a status; nothing in a request is used before it is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vrdma.device import abi

if TYPE_CHECKING:
    from vrdma.device.model import RdmaDevice

STATUS_OK = abi.const("VRDMA_STATUS_OK")
STATUS_NOT_SUPPORTED = abi.const("VRDMA_STATUS_NOT_SUPPORTED")
STATUS_INVALID = abi.const("VRDMA_STATUS_INVALID")
STATUS_BAD_LENGTH = abi.const("VRDMA_STATUS_BAD_LENGTH")
STATUS_NO_RESOURCES = abi.const("VRDMA_STATUS_NO_RESOURCES")
STATUS_BUSY = abi.const("VRDMA_STATUS_BUSY")
GID_TYPES = (abi.const("VRDMA_GID_TYPE_ROCE_V1"), abi.const("VRDMA_GID_TYPE_ROCE_V2"))
RESP_HDR_SIZE = abi.sizeof("vrdma_resp_hdr")
CMD_HDR_SIZE = abi.sizeof("vrdma_cmd_hdr")


class CommandFailed(Exception):
    """A handler refuses a request; becomes the response status."""

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        super().__init__(reason)


Handler = Callable[["RdmaDevice", Any, Any], None]  # (device, request, response to fill)


@dataclass(frozen=True)
class Command:
    name: str
    request: str
    response: str
    handler: Handler


def _query_device(device: RdmaDevice, request: Any, response: Any) -> None:
    limits = device.limits
    for field in ("max_qp", "max_qp_wr", "max_sge", "max_cq", "max_cqe", "max_mr", "max_pd", "max_srq",
                  "max_srq_wr", "max_srq_sge", "max_ah", "max_inline_data", "max_mr_size", "page_size_cap"):
        setattr(response, field, getattr(limits, field))
    response.max_qp_rd_atom = limits.max_qp_rd_atom
    response.max_qp_init_rd_atom = limits.max_qp_rd_atom
    response.fw_ver = device.fw_version
    response.node_guid = device.node_guid
    response.sys_image_guid = device.node_guid
    response.vendor_id = 0x1AF4
    response.vendor_part_id = abi.const("VRDMA_VIRTIO_ID")
    response.hw_ver = abi.const("VRDMA_ABI_VERSION")


def _query_port(device: RdmaDevice, request: Any, response: Any) -> None:
    if request.port != 1:
        raise CommandFailed(STATUS_INVALID, f"port {request.port} does not exist (the device has port 1)")
    if any(request.reserved):
        raise CommandFailed(STATUS_INVALID, "reserved bytes of QUERY_PORT are not zero")
    response.state = abi.const("VRDMA_PORT_STATE_ACTIVE")
    response.max_mtu = 5       # IB_MTU_4096
    response.active_mtu = 3    # IB_MTU_1024, what a 1500-byte Ethernet link carries in RoCE
    response.gid_tbl_len = device.limits.gid_table_len
    response.max_msg_sz = device.limits.max_msg_size
    response.pkey_tbl_len = 1
    response.link_layer = abi.const("VRDMA_LINK_LAYER_ETHERNET")
    response.active_speed = 1  # SDR
    response.active_width = 1  # 1X
    response.phys_state = 5    # LinkUp


def _reserved_zero(request: Any, name: str) -> None:
    if request.reserved:
        raise CommandFailed(STATUS_INVALID, f"reserved field of {name} is {request.reserved}")


def _add_gid(device: RdmaDevice, request: Any, response: Any) -> None:
    index, gid_type = int(request.index), int(request.type)
    if index >= device.limits.gid_table_len:
        raise CommandFailed(STATUS_INVALID, f"GID index {index} (the table has {device.limits.gid_table_len})")
    if gid_type not in GID_TYPES:
        raise CommandFailed(STATUS_INVALID, f"GID type {gid_type}")
    device.add_gid(index, bytes(request.gid), gid_type)


def _del_gid(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "DEL_GID")
    if not device.del_gid(int(request.index)):
        raise CommandFailed(STATUS_INVALID, f"GID index {int(request.index)} is not set")


def _alloc_ucontext(device: RdmaDevice, request: Any, response: Any) -> None:
    response.handle, response.doorbell_page = device.datapath.alloc_ucontext()


def _dealloc_ucontext(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "DEALLOC_UCONTEXT")
    device.datapath.dealloc_ucontext(int(request.handle))


def _alloc_pd(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "ALLOC_PD")
    response.handle = device.datapath.alloc_pd(int(request.ucontext))


def _dealloc_pd(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "DEALLOC_PD")
    device.datapath.dealloc_pd(int(request.handle))


def _reg_mr(device: RdmaDevice, request: Any, response: Any) -> None:
    response.handle, response.lkey, response.rkey = device.datapath.reg_mr(request)


def _dereg_mr(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "DEREG_MR")
    device.datapath.dereg_mr(int(request.handle))


def _create_cq(device: RdmaDevice, request: Any, response: Any) -> None:
    response.handle, response.db_slot = device.datapath.create_cq(request)


def _modify_cq(device: RdmaDevice, request: Any, response: Any) -> None:
    device.datapath.modify_cq(int(request.handle), int(request.cq_count), int(request.cq_period))


def _destroy_cq(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "DESTROY_CQ")
    device.datapath.destroy_cq(int(request.handle))


def _create_qp(device: RdmaDevice, request: Any, response: Any) -> None:
    response.handle, response.qpn, response.sq_db_slot, response.rq_db_slot = device.datapath.create_qp(request)


def _modify_qp(device: RdmaDevice, request: Any, response: Any) -> None:
    device.datapath.modify_qp(request)


def _query_qp(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "QUERY_QP")
    device.datapath.query_qp(int(request.handle), response.attr)


def _destroy_qp(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "DESTROY_QP")
    device.datapath.destroy_qp(int(request.handle))


def _create_srq(device: RdmaDevice, request: Any, response: Any) -> None:
    response.handle, response.db_slot = device.datapath.create_srq(request)


def _modify_srq(device: RdmaDevice, request: Any, response: Any) -> None:
    device.datapath.modify_srq(request)


def _query_srq(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "QUERY_SRQ")
    response.max_wr, response.max_sge, response.srq_limit = device.datapath.query_srq(int(request.handle))


def _destroy_srq(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "DESTROY_SRQ")
    device.datapath.destroy_srq(int(request.handle))


def _create_ah(device: RdmaDevice, request: Any, response: Any) -> None:
    response.handle = device.datapath.create_ah(request)


def _destroy_ah(device: RdmaDevice, request: Any, response: Any) -> None:
    _reserved_zero(request, "DESTROY_AH")
    device.datapath.destroy_ah(int(request.handle))


COMMANDS: dict[int, Command] = {
    abi.const("VRDMA_CMD_QUERY_DEVICE"): Command("QUERY_DEVICE", "vrdma_cmd_query_device",
                                                 "vrdma_resp_query_device", _query_device),
    abi.const("VRDMA_CMD_QUERY_PORT"): Command("QUERY_PORT", "vrdma_cmd_query_port", "vrdma_resp_query_port",
                                               _query_port),
    abi.const("VRDMA_CMD_ADD_GID"): Command("ADD_GID", "vrdma_cmd_add_gid", "vrdma_resp_hdr", _add_gid),
    abi.const("VRDMA_CMD_DEL_GID"): Command("DEL_GID", "vrdma_cmd_del_gid", "vrdma_resp_hdr", _del_gid),
    abi.const("VRDMA_CMD_ALLOC_UCONTEXT"): Command("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext",
                                                   "vrdma_resp_alloc_ucontext", _alloc_ucontext),
    abi.const("VRDMA_CMD_DEALLOC_UCONTEXT"): Command("DEALLOC_UCONTEXT", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                                     _dealloc_ucontext),
    abi.const("VRDMA_CMD_ALLOC_PD"): Command("ALLOC_PD", "vrdma_cmd_alloc_pd", "vrdma_resp_alloc_pd", _alloc_pd),
    abi.const("VRDMA_CMD_DEALLOC_PD"): Command("DEALLOC_PD", "vrdma_cmd_destroy", "vrdma_resp_hdr", _dealloc_pd),
    abi.const("VRDMA_CMD_REG_MR"): Command("REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", _reg_mr),
    abi.const("VRDMA_CMD_DEREG_MR"): Command("DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", _dereg_mr),
    abi.const("VRDMA_CMD_CREATE_CQ"): Command("CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq",
                                              _create_cq),
    abi.const("VRDMA_CMD_DESTROY_CQ"): Command("DESTROY_CQ", "vrdma_cmd_destroy", "vrdma_resp_hdr", _destroy_cq),
    abi.const("VRDMA_CMD_MODIFY_CQ"): Command("MODIFY_CQ", "vrdma_cmd_modify_cq", "vrdma_resp_hdr", _modify_cq),
    abi.const("VRDMA_CMD_CREATE_QP"): Command("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                                              _create_qp),
    abi.const("VRDMA_CMD_MODIFY_QP"): Command("MODIFY_QP", "vrdma_cmd_modify_qp", "vrdma_resp_hdr", _modify_qp),
    abi.const("VRDMA_CMD_QUERY_QP"): Command("QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp", _query_qp),
    abi.const("VRDMA_CMD_DESTROY_QP"): Command("DESTROY_QP", "vrdma_cmd_destroy", "vrdma_resp_hdr", _destroy_qp),
    abi.const("VRDMA_CMD_CREATE_SRQ"): Command("CREATE_SRQ", "vrdma_cmd_create_srq", "vrdma_resp_create_srq",
                                               _create_srq),
    abi.const("VRDMA_CMD_MODIFY_SRQ"): Command("MODIFY_SRQ", "vrdma_cmd_modify_srq", "vrdma_resp_hdr", _modify_srq),
    abi.const("VRDMA_CMD_QUERY_SRQ"): Command("QUERY_SRQ", "vrdma_cmd_destroy", "vrdma_resp_query_srq",
                                              _query_srq),
    abi.const("VRDMA_CMD_DESTROY_SRQ"): Command("DESTROY_SRQ", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                                _destroy_srq),
    abi.const("VRDMA_CMD_CREATE_AH"): Command("CREATE_AH", "vrdma_cmd_create_ah", "vrdma_resp_create_ah", _create_ah),
    abi.const("VRDMA_CMD_DESTROY_AH"): Command("DESTROY_AH", "vrdma_cmd_destroy", "vrdma_resp_hdr", _destroy_ah),
}
