"""The device model in process, against a fake data engine: commands, object rules, rollback, limits, faults.

No backend process, no C: vrdma.testing.fake_engine.FakeEngine stands where the C engine stands, so every rule the
model enforces (and every call it makes to the engine) is checked here in milliseconds. Responses are pre-filled
with a sentinel by the device's own code path (the response struct is built zeroed), so each test reads back what
the device wrote and checks the status first: a zeroed response is not success.
"""

from __future__ import annotations

import errno
from typing import Any

import pytest

from vrdma.device import abi
from vrdma.device.device import RdmaDevice
from vrdma.device.fabric import Fabric
from vrdma.device.params import DEFAULT_LIMITS, config_fields, engine_limits, query_fields
from vrdma.device.status import ResponseTooSmall, Status
from vrdma.testing import faults
from vrdma.testing.fake_engine import FakeEngine
from vrdma.testing.simulated_guest import encode_command

PAGE = abi.const("VRDMA_PAGE_SIZE")
GID = bytes(10) + b"\xff\xff" + bytes([169, 254, 100, 1])
MAX_RESPONSE = 4096


class Driver:
    """Just enough of a guest driver to talk to a device model in process."""

    def __init__(self, device: RdmaDevice) -> None:
        self.device = device
        self.seq = 0

    def raw(self, request: bytes, capacity: int = MAX_RESPONSE) -> bytes:
        return self.device.execute(request, capacity)

    def call(self, name: str, request: str, response: str, expect: Status = Status.OK, **fields: Any) -> Any:
        self.seq += 1
        data = self.raw(encode_command(request, abi.const(f"VRDMA_CMD_{name}"), self.seq, **fields))
        hdr = abi.from_bytes("vrdma_resp_hdr", data[:abi.sizeof("vrdma_resp_hdr")])
        assert (hdr.opcode, hdr.seq) == (abi.const(f"VRDMA_CMD_{name}"), self.seq)
        assert hdr.status == expect, f"{name}: status {Status(hdr.status).name}, expected {expect.name}"
        return abi.from_bytes(response, data) if hdr.status == Status.OK else hdr

    def ucontext(self) -> Any:
        return self.call("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", "vrdma_resp_alloc_ucontext")

    def pd(self, ucontext: int, expect: Status = Status.OK) -> Any:
        return self.call("ALLOC_PD", "vrdma_cmd_alloc_pd", "vrdma_resp_alloc_pd", expect, ucontext=ucontext)

    def destroy(self, name: str, handle: int, expect: Status = Status.OK) -> Any:
        return self.call(name, "vrdma_cmd_destroy", "vrdma_resp_hdr", expect, handle=handle)

    def mr(self, pd: int, length: int = 2 * PAGE, access: int = 0xF, expect: Status = Status.OK) -> Any:
        return self.call("REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", expect, pd=pd, access=access,
                         length=length, iova=0x10000, pages={"addr": PAGE, "npages": -(-length // PAGE),
                                                             "levels": 1})

    def cq(self, ucontext: int, entries: int = 64, expect: Status = Status.OK) -> Any:
        npages = -(-(PAGE + entries * abi.sizeof("vrdma_cqe")) // PAGE)
        return self.call("CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", expect, ucontext=ucontext,
                         entries=entries, ring={"addr": PAGE, "npages": npages, "levels": 1})

    def qp(self, ucontext: int, pd: int, cq: int, expect: Status = Status.OK, **overrides: Any) -> Any:
        fields: dict[str, Any] = dict(ucontext=ucontext, pd=pd, send_cq=cq, recv_cq=cq,
                                      qp_type=abi.const("VRDMA_QPT_RC"), sq_depth=16, rq_depth=16, sq_stride=128,
                                      rq_stride=64, sq_offset=PAGE, rq_offset=PAGE + 16 * 128, max_send_sge=2,
                                      max_recv_sge=2, max_inline_data=64)
        fields.update(overrides)
        end = max(fields["sq_offset"] + fields["sq_depth"] * fields["sq_stride"],
                  fields["rq_offset"] + fields["rq_depth"] * fields["rq_stride"])
        fields["ring"] = {"addr": PAGE, "npages": -(-end // PAGE), "levels": 1}
        return self.call("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp", expect, **fields)

    def modify_qp(self, handle: int, mask: int, expect: Status = Status.OK, **attr: Any) -> Any:
        return self.call("MODIFY_QP", "vrdma_cmd_modify_qp", "vrdma_resp_hdr", expect, handle=handle,
                         attr_mask=mask, attr=attr)


def m(*names: str) -> int:
    mask = 0
    for name in names:
        mask |= abi.const(f"VRDMA_QP_{name}")
    return mask


@pytest.fixture()
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture()
def device(engine: FakeEngine) -> RdmaDevice:
    return RdmaDevice("unit", mac=bytes.fromhex("525400000001"), engine=engine)


@pytest.fixture()
def driver(device: RdmaDevice) -> Driver:
    return Driver(device)


def test_limits_are_declared_once_and_published_in_config_space_query_device_and_the_engine(
        device: RdmaDevice, driver: Driver, engine: FakeEngine) -> None:
    config = abi.from_bytes("vrdma_config", device.config_space())
    for name, value in config_fields(DEFAULT_LIMITS).items():
        assert getattr(config, name) == value, name
    assert bytes(config.mac) == bytes.fromhex("525400000001") and config.device_epoch == device.epoch
    answer = driver.call("QUERY_DEVICE", "vrdma_cmd_query_device", "vrdma_resp_query_device")
    for name, value in query_fields(DEFAULT_LIMITS).items():
        assert getattr(answer, name) == value, name
    opened = engine.devices[device.engine_index]
    assert opened is not None and opened.limits == engine_limits(DEFAULT_LIMITS)
    assert opened.limits["max_mr_pages"] == DEFAULT_LIMITS.max_mr_size // PAGE


def test_malformed_headers_get_their_status_and_count_as_errors(device: RdmaDevice, driver: Driver) -> None:
    short = driver.raw(b"\x01\x00")
    assert abi.from_bytes("vrdma_resp_hdr", short).status == Status.BAD_LENGTH
    unknown = driver.raw(encode_command("vrdma_cmd_destroy", 0x7777, 9, handle=1))
    assert abi.from_bytes("vrdma_resp_hdr", unknown).status == Status.NOT_SUPPORTED
    long = driver.raw(encode_command("vrdma_cmd_destroy", abi.const("VRDMA_CMD_DEALLOC_PD"), 3) + b"\0")
    assert abi.from_bytes("vrdma_resp_hdr", long).status == Status.BAD_LENGTH
    with pytest.raises(ResponseTooSmall):
        driver.raw(encode_command("vrdma_cmd_query_device", abi.const("VRDMA_CMD_QUERY_DEVICE"), 1), capacity=4)
    counters = device.counters_snapshot()
    assert counters["commands"] == 3 and counters["command_errors"] == 4


def test_a_pd_in_use_and_a_context_with_objects_are_busy_until_their_objects_go(driver: Driver) -> None:
    ctx = driver.ucontext()
    pd = driver.pd(ctx.handle)
    mr = driver.mr(pd.handle)
    driver.destroy("DEALLOC_PD", pd.handle, Status.BUSY)
    driver.destroy("DEALLOC_UCONTEXT", ctx.handle, Status.BUSY)
    driver.destroy("DEREG_MR", mr.handle)
    driver.destroy("DEREG_MR", mr.handle, Status.INVALID)  # stale handle
    driver.destroy("DEALLOC_PD", pd.handle)
    driver.destroy("DEALLOC_UCONTEXT", ctx.handle)
    assert driver.device.counters_snapshot()["objects"] == dict.fromkeys(
        ("gid", "ucontext", "pd", "mr", "cq", "xrcd", "srq", "qp", "ah"), 0)


def test_an_mr_key_names_its_engine_slot_and_the_engine_gets_the_checked_page_list(
        driver: Driver, engine: FakeEngine) -> None:
    ctx = driver.ucontext()
    pd = driver.pd(ctx.handle)
    mr = driver.mr(pd.handle, length=3 * PAGE)
    slot_mask, shift = DEFAULT_LIMITS.max_mr - 1, abi.const("VRDMA_KEY_SLOT_SHIFT")
    assert mr.lkey != mr.rkey and (mr.lkey >> shift) & slot_mask == (mr.rkey >> shift) & slot_mask == \
        mr.handle & slot_mask
    created = engine.devices[0].objects["mr"][(mr.lkey >> shift) & slot_mask]  # type: ignore[union-attr]
    assert created["pages"] == {"addr": PAGE, "npages": 3, "levels": 1} and created["length"] == 3 * PAGE
    driver.mr(pd.handle, access=abi.const("VRDMA_ACCESS_REMOTE_WRITE"), expect=Status.INVALID)
    driver.mr(pd.handle, length=DEFAULT_LIMITS.max_mr_size + 1, expect=Status.INVALID)


def test_an_engine_that_runs_out_makes_no_resources_and_everything_taken_is_given_back(
        driver: Driver, engine: FakeEngine) -> None:
    ctx = driver.ucontext()
    pd = driver.pd(ctx.handle)
    cq = driver.cq(ctx.handle)
    engine.refuse_next(errno.ENOMEM)
    driver.qp(ctx.handle, pd.handle, cq.handle, Status.NO_RESOURCES)
    engine.refuse_next(errno.EINVAL)
    driver.cq(ctx.handle, expect=Status.INVALID)
    objects = driver.device.counters_snapshot()["objects"]
    assert objects["qp"] == 0 and objects["cq"] == 1  # type: ignore[index]
    # Doorbell slots went back: as many queues as the page has slots still fit in it before the context takes
    # a second page.
    slots, page = abi.const("VRDMA_DB_SLOT_ALIVE") - 1, int(ctx.doorbell_page) * abi.const("VRDMA_DB_SLOTS")
    cqs = [driver.cq(ctx.handle) for _ in range(slots - 1)]
    assert sorted(c.db_index - page for c in [cq, *cqs]) == list(range(1, slots + 1))
    assert driver.cq(ctx.handle).db_index // abi.const("VRDMA_DB_SLOTS") != page // abi.const("VRDMA_DB_SLOTS")


def test_qp_state_table_walks_reset_init_rtr_rts_and_refuses_what_the_spec_refuses(
        driver: Driver, engine: FakeEngine) -> None:
    driver.call("ADD_GID", "vrdma_cmd_add_gid", "vrdma_resp_hdr", index=0, gid=list(GID),
                type=abi.const("VRDMA_GID_TYPE_ROCE_V2"))
    ctx = driver.ucontext()
    pd = driver.pd(ctx.handle)
    cq = driver.cq(ctx.handle)
    qp = driver.qp(ctx.handle, pd.handle, cq.handle)
    qps = abi.const
    driver.modify_qp(qp.handle, m("STATE"), Status.INVALID, qp_state=qps("VRDMA_QPS_RTS"))  # RESET -> RTS
    driver.modify_qp(qp.handle, m("STATE"), Status.INVALID, qp_state=qps("VRDMA_QPS_INIT"))  # missing attrs
    driver.modify_qp(qp.handle, m("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS"), Status.INVALID,
                     qp_state=qps("VRDMA_QPS_INIT"), port_num=2)  # no port 2
    driver.modify_qp(qp.handle, m("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS"), qp_state=qps("VRDMA_QPS_INIT"),
                     port_num=1, qp_access_flags=0xF)
    rtr = m("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN", "MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER")
    driver.modify_qp(qp.handle, rtr, Status.INVALID, qp_state=qps("VRDMA_QPS_RTR"), path_mtu=3, dest_qp_num=qp.qpn,
                     sgid_index=5, dgid=list(GID))  # GID index 5 is not set
    driver.modify_qp(qp.handle, rtr, qp_state=qps("VRDMA_QPS_RTR"), path_mtu=3, dest_qp_num=qp.qpn, dgid=list(GID),
                     min_rnr_timer=12, max_dest_rd_atomic=1)
    sent = engine.devices[0].objects["qp"][qp.qpn & (DEFAULT_LIMITS.max_qp - 1)]["attr"]  # type: ignore[union-attr]
    assert sent["dest_dev"] == driver.device.engine_index and sent["dest_qpn"] == qp.qpn
    assert sent["min_rnr_timer"] == 12
    driver.modify_qp(qp.handle, m("STATE", "SQ_PSN", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "MAX_QP_RD_ATOMIC"),
                     qp_state=qps("VRDMA_QPS_RTS"), timeout=14, retry_cnt=7, rnr_retry=7, max_rd_atomic=1)
    answer = driver.call("QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp", handle=qp.handle)
    assert answer.attr.qp_state == qps("VRDMA_QPS_RTS") and answer.attr.timeout == 14
    driver.destroy("DESTROY_CQ", cq.handle, Status.BUSY)
    driver.destroy("DESTROY_QP", qp.handle)
    driver.destroy("DESTROY_CQ", cq.handle)


def test_reset_forgets_every_object_and_handles_from_before_stay_stale(
        device: RdmaDevice, driver: Driver, engine: FakeEngine) -> None:
    ctx = driver.ucontext()
    pd = driver.pd(ctx.handle)
    epoch = device.epoch
    device.reset()
    assert device.epoch != epoch and device.counters_snapshot()["objects"]["pd"] == 0  # type: ignore[index]
    # the engine device closes and opens again, with the VM's QoS given again
    assert engine.calls[-3:] == [("close_device", 0, -1), ("open_device", 0, -1), ("set_qos", 0, -1)]
    driver.destroy("DEALLOC_PD", pd.handle, Status.INVALID)
    assert driver.pd(ctx.handle, Status.INVALID).status == Status.INVALID  # the context went too


@pytest.mark.parametrize("fault", [f for f in faults.FAULTS if f != "doorbell-page-out-of-range"])
def test_a_fault_hook_spoils_exactly_the_next_response(device: RdmaDevice, driver: Driver, fault: str) -> None:
    good = driver.raw(encode_command("vrdma_cmd_query_device", abi.const("VRDMA_CMD_QUERY_DEVICE"), 1))
    faults.inject(device, fault)
    spoiled = driver.raw(encode_command("vrdma_cmd_query_device", abi.const("VRDMA_CMD_QUERY_DEVICE"), 1))
    assert spoiled != good
    assert driver.raw(encode_command("vrdma_cmd_query_device", abi.const("VRDMA_CMD_QUERY_DEVICE"), 1))[:8] == \
        good[:8]


def test_the_doorbell_fault_waits_for_alloc_ucontext_and_names_a_page_past_the_region(
        device: RdmaDevice, driver: Driver) -> None:
    faults.inject(device, "doorbell-page-out-of-range")
    driver.pd(0)  # not ALLOC_UCONTEXT: untouched
    assert driver.ucontext().doorbell_page == DEFAULT_LIMITS.doorbell_pages
    assert driver.ucontext().doorbell_page < DEFAULT_LIMITS.doorbell_pages


def test_xrc_objects_keep_their_domain_and_cq_and_targets_are_the_kernels(driver: Driver,
                                                                         engine: FakeEngine) -> None:
    """An XRC SRQ holds its domain and its CQ (BUSY until it goes); an XRC target QP is the kernel's, holds its
    domain and nothing else, and reaches the engine with no ring; SRQ and QP numbers carry the engine slot."""
    ctx = driver.ucontext()
    pd, cq = driver.pd(ctx.handle), driver.cq(ctx.handle)
    xrcd = driver.call("ALLOC_XRCD", "vrdma_cmd_alloc_xrcd", "vrdma_resp_alloc_xrcd")
    srq = driver.call("CREATE_SRQ", "vrdma_cmd_create_srq", "vrdma_resp_create_srq", ucontext=ctx.handle,
                      pd=pd.handle, depth=16, stride=64, max_sge=2, xrcd=xrcd.handle, cq=cq.handle,
                      ring={"addr": PAGE, "npages": 2, "levels": 1})
    slot = srq.handle & (DEFAULT_LIMITS.max_srq - 1)
    assert srq.srq_num & (DEFAULT_LIMITS.max_srq - 1) == slot and 0 < srq.srq_num < 1 << 24
    tgt_fields = {"qp_type": abi.const("VRDMA_QPT_XRC_TGT"), "xrcd": xrcd.handle}
    driver.call("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp", Status.INVALID, ucontext=ctx.handle,
                **tgt_fields)  # a user context's
    driver.call("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp", Status.INVALID, ucontext=0,
                pd=pd.handle, **tgt_fields)  # with a PD
    tgt = driver.call("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp", ucontext=0, **tgt_fields)
    assert (tgt.sq_db_index, tgt.rq_db_index) == (0, 0)
    created = engine.devices[0].objects["qp"][tgt.handle & (DEFAULT_LIMITS.max_qp - 1)]
    assert created["ring"]["npages"] == 0 and created["xrcd"] == xrcd.handle
    driver.destroy("DEALLOC_XRCD", xrcd.handle, Status.BUSY)
    driver.destroy("DESTROY_CQ", cq.handle, Status.BUSY)
    driver.destroy("DESTROY_SRQ", srq.handle)
    driver.destroy("DESTROY_CQ", cq.handle)
    driver.destroy("DEALLOC_XRCD", xrcd.handle, Status.BUSY)  # its target QP
    driver.destroy("DESTROY_QP", tgt.handle)
    driver.destroy("DEALLOC_XRCD", xrcd.handle)
    driver.destroy("DEALLOC_XRCD", xrcd.handle, Status.INVALID)


def test_a_parked_fabric_looks_again_within_park_recheck_ms_for_the_drivers_that_ask(engine: FakeEngine) -> None:
    """Parked, the loop sleeps until a descriptor, a deadline or, if some device's driver asked for the recheck
    (its fences may not be real), park_recheck_ms, whichever is first: a wake-up such a guest failed to send costs
    milliseconds, never a hang; with no such driver it sleeps until something happens."""
    fabric = Fabric(engine, 2)
    device = RdmaDevice("vm0", fabric=fabric)
    assert fabric.timeout() == 0.0  # not parked: poll again at once
    fabric.last_work -= 1.0
    fabric.run()
    assert fabric.parked
    assert fabric.timeout() is None  # no deadline and no driver that asked: until a descriptor is ready
    device.doorbell_recheck = True
    assert fabric.timeout() == DEFAULT_LIMITS.park_recheck_ms / 1e3  # the recheck bounds the sleep
