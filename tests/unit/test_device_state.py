"""A device's whole state as data (device/state.py): the model's tables, the engine's side, the doorbell pages.

Two VMs on one engine in process (vrdma.testing.inprocess.LocalVms). A VM is saved with traffic in flight, its device
reset (everything forgotten, as a new backend's or a destination's device is), and the state loaded: the guest's
driver, which knows nothing of it, goes on with the handles, keys and QP numbers it had.
"""

from __future__ import annotations

import ctypes
import json
import struct
import zlib
from collections.abc import Iterator

import pytest

from vrdma.device import abi, state
from vrdma.device.device import RdmaDevice
from vrdma.device.gid import gid_of_address as gid_of
from vrdma.device.state import StateError
from vrdma.device.status import Status
from vrdma.testing.frontend import GuestMemory
from vrdma.testing.inprocess import LocalPort, LocalVm, LocalVms
from vrdma.testing.simulated_guest import CommandError, SimVerbs

KIB, MIB = 1 << 10, 1 << 20
WRITE, SEND = abi.const("VRDMA_WR_RDMA_WRITE"), abi.const("VRDMA_WR_SEND")
SUCCESS = abi.const("VRDMA_WC_SUCCESS")
RTS = abi.const("VRDMA_QPS_RTS")


@pytest.fixture
def vms() -> Iterator[LocalVms]:
    with LocalVms(2, memory_size=64 << 20) as shared:
        yield shared



def moved(vm: LocalVm) -> bytes:
    """vm saved (suspended first), its device reset: the state, and a device with nothing of it."""
    vm.device.suspend()
    data = vm.device.save_state()
    vm.device.reset(keep_memory=True)
    return data


def rewrite(data: bytes, change: object) -> bytes:
    """The state with its model's JSON changed by ``change(model)`` and its checksum made right again: a state
    forged by someone who knows the format."""
    magic, version, model_len, engine_len, pages, _ = state.HEADER.unpack_from(data)
    body = data[state.HEADER.size:]
    model = json.loads(body[:model_len])
    change(model)  # type: ignore[operator]
    raw = json.dumps(model).encode()
    body = raw + body[model_len:]
    return state.HEADER.pack(magic, version, len(raw), engine_len, pages, zlib.crc32(body)) + body


def test_a_vm_moved_through_its_state_goes_on_as_if_nothing_happened(vms: LocalVms) -> None:
    """vm0 is saved with a 4 MiB WRITE half moved, SENDs queued and an SRQ-less receive side posted at vm1, its
    device reset and the state loaded: the traffic completes byte for byte; the driver's QP query answers what it
    set; a new PD and MR get handles and keys of their own; destroying the old objects in order works (their
    reference counts were rebuilt, not taken); the device's identity is the one the guest saw."""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1, 8 * MIB)
    c, d = vms.pair(vm1, vm0, 1 * MIB)  # vm1's own flood: vm0's pieces small, so its WRITE is half way
    pattern = bytes((i * 13 + i // 4096) % 251 for i in range(4 * MIB))
    vm0.verbs.memory.write(a.mr.addr, pattern)
    for i in range(3):
        b.verbs.post_recv(b.qp, [(b.mr.addr + 6 * MIB + i * KIB, KIB, b.mr.lkey)], wr_id=100 + i)
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 4 * MIB, a.mr.lkey)], wr_id=1, remote_addr=b.mr.addr, rkey=b.mr.rkey)
    for i in range(3):
        a.verbs.post_send(a.qp, SEND, [(a.mr.addr + i * KIB, KIB, a.mr.lkey)], wr_id=10 + i)
    c.verbs.post_send(c.qp, WRITE, [(c.mr.addr, MIB, c.mr.lkey)], wr_id=50, remote_addr=d.mr.addr, rkey=d.mr.rkey)
    vms.poll()
    # The kernel's GSI QP, never given a port or a path MTU: their zeros are no values to check (a migration of a
    # real guest found the loader refusing it for "bad port").
    kernel = SimVerbs(vm0.verbs.fe, vm0.verbs.doorbells, kernel=True)
    kcq = kernel.create_cq(16)
    kernel.ud_ready(kernel.create_qp(kernel.alloc_pd(), kcq, kcq, qp_type="GSI"), 0x80010000, gsi=True)
    identity = (vm0.device.epoch, vm0.device.pairing_id, vm0.device.identity, vm0.device.objects.counts())
    counters = vm0.device.counters_snapshot()

    data = moved(vm0)
    assert vm0.device.objects.counts()["qp"] == 0 and vm0.device.epoch != identity[0]
    vm0.device.load_state(data)
    vm0.device.suspend(False)
    assert (vm0.device.epoch, vm0.device.pairing_id, vm0.device.identity, vm0.device.objects.counts()) == identity
    assert vm0.device.counters_snapshot()["commands"] == counters["commands"]
    done: list[tuple[int, int]] = []
    for _ in range(10_000):
        vms.poll()
        done += [(cqe.wr_id, cqe.status) for cqe in a.completions()]
        if len(done) == 4:
            break
    assert done == [(1, SUCCESS), (10, SUCCESS), (11, SUCCESS), (12, SUCCESS)]
    assert vm1.verbs.memory.read(b.mr.addr, 4 * MIB) == pattern
    assert [(cqe.wr_id, cqe.status) for cqe in b.completions()] == [(100 + i, SUCCESS) for i in range(3)]
    assert int(a.verbs.query_qp(a.qp).qp_state) == RTS
    pd = a.verbs.alloc_pd()
    mr = a.verbs.reg_mr(pd, 64 * KIB)
    assert pd != a.pd and mr.lkey not in (a.mr.lkey, a.mr.rkey)
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 8, a.mr.lkey)], wr_id=2, remote_addr=b.mr.addr, rkey=b.mr.rkey)
    vms.poll()
    assert [(cqe.wr_id, cqe.status) for cqe in a.completions()] == [(2, SUCCESS)]
    with pytest.raises(CommandError) as busy:  # the PD still has its MR and QP, as before
        a.verbs.call("VRDMA_CMD_DEALLOC_PD", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=a.pd)
    assert busy.value.status == Status.BUSY
    for opcode, handle in (("VRDMA_CMD_DESTROY_QP", a.qp.handle), ("VRDMA_CMD_DEREG_MR", a.mr.handle),
                           ("VRDMA_CMD_DESTROY_CQ", a.cq.handle), ("VRDMA_CMD_DEALLOC_PD", a.pd)):
        a.verbs.call(opcode, "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=handle)


def test_a_state_is_refused_whole_and_the_device_stays_reset(vms: LocalVms) -> None:
    """Refusals name what is wrong: another VM's state, a damaged byte, a forged model (a QP naming a CQ the state
    does not have, a doorbell held twice, a type of QP there is none of), and an engine whose records disagree
    with the model's; after each the device is reset, and the good state loads."""
    vm0, vm1 = vms.vms
    vms.pair(vm0, vm1)
    data = moved(vm0)

    def qp(model: dict) -> dict:  # type: ignore[type-arg]
        return model["qps"]["objects"][0][1]  # type: ignore[no-any-return]

    def cq_db_is_the_qps(model: dict) -> None:  # type: ignore[type-arg]
        model["cqs"]["objects"][0][1]["db"] = qp(model)["dbs"][0]

    def other_qpn(model: dict) -> None:  # type: ignore[type-arg]
        qp(model)["qpn"] ^= 1 << 20

    forged = {
        "not of 'vm1'": (vm1, data),
        "checksum": (vm0, data[:-1] + bytes([data[-1] ^ 1])),
        "names CQ": (vm0, rewrite(data, lambda m: qp(m).update(send_cq=0x1234567))),
        "not a free slot": (vm0, rewrite(data, cq_db_is_the_qps)),
        "type 7": (vm0, rewrite(data, lambda m: qp(m).update(qp_type=7))),
        "does not match the model": (vm0, rewrite(data, other_qpn)),
        "expected the fields": (vm0, rewrite(data, lambda m: qp(m).update(surprise=1))),
        "bad path MTU": (vm0, rewrite(data, lambda m: qp(m)["attr"].update(path_mtu=9))),
        "not a vrdma device state": (vm0, b"VRDMAST\0" + struct.pack("<I", 2) + data[12:]),
    }
    vm1.device.reset(keep_memory=True)  # a device with nothing, but another VM's
    for reason, (vm, bad) in forged.items():
        with pytest.raises(StateError, match=reason):
            vm.device.load_state(bad)
        assert vm0.device.objects.counts()["qp"] == 0
    # The good state, while its QP's peer is on no device of this engine (vm1 holds no GID since its reset): the
    # QP cannot deliver anywhere, and the state is refused rather than pointed at whatever device has vm1's number.
    with pytest.raises(StateError, match="on no device here"):
        vm0.device.load_state(data)
    vm1.verbs.add_gid(0, vm1.gid)
    vm0.device.check_state(data)
    vm0.device.load_state(data)
    assert vm0.device.objects.counts()["qp"] == 1
    with pytest.raises(StateError, match="fresh from a reset"):
        vm0.device.load_state(data)


def test_a_vm_moves_between_two_seats_of_one_backend_in_the_middle_of_traffic() -> None:
    """vm0 moves to a second seat of the same backend (the destination QEMU's device, with a copy of the guest's RAM
    made while vm0 was suspended) while vm1 WRITEs 1 MiB into it and it SENDs to vm1: vm1's QP is re-aimed at the
    new seat, so its WRITE lands in the copy, not in the RAM left behind; vm0's driver, now talking to the new seat,
    gets every completion."""
    with LocalVms(3, memory_size=16 << 20) as vms:
        vm0, vm1, vm2 = vms.vms
        vm2.device.close()  # its seat becomes the destination's
        a, b = vms.pair(vm0, vm1)
        c, d = vms.pair(vm1, vm0)
        e, f = vms.pair(vm1, vm0)  # vm1's second flood: its pieces small, so the move lands mid-WRITE
        pattern = bytes((i * 3 + i // 4096) % 253 for i in range(MIB))
        vm1.verbs.memory.write(c.mr.addr, pattern)
        c.verbs.post_send(c.qp, WRITE, [(c.mr.addr, MIB, c.mr.lkey)], wr_id=1, remote_addr=d.mr.addr,
                          rkey=d.mr.rkey)
        e.verbs.post_send(e.qp, WRITE, [(e.mr.addr, MIB, e.mr.lkey)], wr_id=2, remote_addr=f.mr.addr,
                          rkey=f.mr.rkey)
        b.verbs.post_recv(b.qp, [(b.mr.addr, KIB, b.mr.lkey)], wr_id=3)
        vm0.verbs.memory.write(a.mr.addr, b"M" * KIB)
        a.verbs.post_send(a.qp, SEND, [(a.mr.addr, KIB, a.mr.lkey)], wr_id=4)
        vms.poll()

        vm0.device.suspend()
        data = vm0.device.save_state()
        copy = GuestMemory(16 << 20)
        copy.map[:] = vm0.memory.map[:]  # the guest's RAM as the migration copied it, at switch-over
        view = ctypes.c_char.from_buffer(copy.map)
        target = RdmaDevice("vm0", fabric=vms.fabric)
        try:
            target.set_memory([(0, 16 << 20, ctypes.addressof(view))])
            target.check_state(data)
            target.load_state(data)
            target.took_over(vm0.device)
            vm0.device.close()
            target.suspend(False)
            vm0.verbs.fe = LocalPort(target, copy)
            vm0.verbs.memory = copy
            vm0.verbs.doorbells = target.doorbells
            done: dict[str, list[tuple[int, int]]] = {"c": [], "a": []}
            for _ in range(10_000):
                vms.poll()
                done["c"] += [(cqe.wr_id, cqe.status) for cqe in c.completions()]
                done["a"] += [(cqe.wr_id, cqe.status) for cqe in a.completions()]
                if done["c"] and done["a"]:
                    break
            assert done == {"c": [(1, SUCCESS)], "a": [(4, SUCCESS)]}
            assert copy.read(d.mr.addr, MIB) == pattern
            assert vm0.memory.read(d.mr.addr, MIB) != pattern  # the RAM left behind did not get the rest
            assert [(cqe.wr_id, cqe.status) for cqe in b.completions()] == [(3, SUCCESS)]
            assert vm1.verbs.memory.read(b.mr.addr, KIB) == b"M" * KIB
        finally:
            target.close()
            del view
            copy.close()


def test_a_qp_aimed_at_its_own_vm_follows_it_to_another_device_number() -> None:
    """A state names a QP's peer on its host by the source engine's device number; across backends a VM's number
    changes and the old one may be another VM's. vm0's two QPs, connected to each other, move into an engine where
    vm0 is device 1 and device 0 is another VM: a WRITE between them lands in vm0's memory and completes, the other
    VM untouched (the loader derives the number again from the peer's GID)."""
    with LocalVms(1, memory_size=16 << 20) as source, LocalVms(2, memory_size=16 << 20) as destination:
        vm0 = source.vms[0]
        a, b = source.pair(vm0, vm0)
        data = moved(vm0)
        other, seat = destination.vms
        other.device.reset(keep_memory=True)
        other.verbs.add_gid(0, gid_of("10.98.0.9"))  # device 0 of the destination: a VM of another address
        seat.device.close()
        copy = GuestMemory(16 << 20)
        copy.map[:] = vm0.memory.map[:]
        view = ctypes.c_char.from_buffer(copy.map)
        target = RdmaDevice("vm0", fabric=destination.fabric)
        try:
            assert target.engine_index == 1
            target.set_memory([(0, 16 << 20, ctypes.addressof(view))])
            target.load_state(data)
            target.suspend(False)
            vm0.verbs.fe, vm0.verbs.memory, vm0.verbs.doorbells = LocalPort(target, copy), copy, target.doorbells
            copy.write(a.mr.addr, b"L" * KIB)
            a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, KIB, a.mr.lkey)], wr_id=5, remote_addr=b.mr.addr,
                              rkey=b.mr.rkey)
            done: list[tuple[int, int]] = []
            for _ in range(1_000):
                destination.poll()
                done += [(cqe.wr_id, cqe.status) for cqe in a.completions()]
                if done:
                    break
            assert done == [(5, SUCCESS)]
            assert copy.read(b.mr.addr, KIB) == b"L" * KIB
            assert target.counters_snapshot()["engine"]["bytes"] >= KIB  # type: ignore[index]
            assert other.device.counters_snapshot()["engine"]["bytes"] == 0  # type: ignore[index]
        finally:
            target.close()
            del view
            copy.close()
