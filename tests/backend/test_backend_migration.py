"""A VM migrated through the backend's vhost-user device-state transfer (issue 28), the simulated frontend playing
QEMU: every queue stopped, the state saved through a pipe, the source frontend gone, a destination frontend with a
copy of the guest's memory connected to the VM's socket, the state loaded through a pipe and checked, the device
started where it stopped. Its QPs, keys, handles and the WRITEs it had queued go on, byte for byte."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
from backend_process import BackendProcess, connect_sides, start_side, wait_cqes
from polling import wait_until

from vrdma.device import abi
from vrdma.testing.frontend import Frontend, FrontendError

pytestmark = pytest.mark.backend

GIDS = {"vm0": bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]), "vm1": bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])}
WRITE = abi.const("VRDMA_WR_RDMA_WRITE")
MR_SIZE = 1 << 20
WRITES = 32
PIECE = MR_SIZE // WRITES


def map_doorbells(path: Path) -> mmap.mmap:
    with open(path, "r+b") as region:  # the mapping outlives the file object
        return mmap.mmap(region.fileno(), 0)


def test_a_vm_migrated_with_writes_queued_finishes_them_and_goes_on(backend: BackendProcess) -> None:
    with backend.frontend("vm0") as source, backend.frontend("vm1") as fe1:
        a, b = start_side(source, backend, "vm0", GIDS["vm0"], MR_SIZE), start_side(fe1, backend, "vm1", GIDS["vm1"],
                                                                                  MR_SIZE)
        connect_sides(a, GIDS["vm0"], b, GIDS["vm1"])
        pattern = os.urandom(MR_SIZE)
        source.memory.write(a.mr.addr, pattern)
        q = a.verbs.query_qp(a.qp)
        qp_before = (q.qp_state, q.dest_qp_num, q.sq_psn)  # (the response's memory is the next command's)
        assert qp_before == (abi.const("VRDMA_QPS_RTS"), b.qp.qpn, q.sq_psn)
        # vm0's WRITEs into vm1, each signaled, queued at once and the VM stopped at once: those the engine had not
        # run yet (if any) run at the destination, and the completions of those it had are in the memory copied.
        for i in range(WRITES):
            a.verbs.post_send(a.qp, WRITE, [(a.mr.addr + i * PIECE, PIECE, a.mr.lkey)], wr_id=i, signaled=True,
                              remote_addr=b.mr.addr + i * PIECE, rkey=b.mr.rkey, ring=False)
        a.verbs.ring_send(a.qp)
        fe0 = source.migrate(str(backend.sockets["vm0"]))
        a.verbs.fe, a.verbs.memory = fe0, fe0.memory
        counters = backend.counters("vm0")
        assert counters["connection"]["states_refused_at_start"] == 0 and not counters["connection"]["suspended"]
        completions = wait_cqes(a.verbs, a.cq, WRITES)
        assert sorted(c.wr_id for c in completions) == list(range(WRITES))
        assert all(c.status == abi.const("VRDMA_WC_SUCCESS") for c in completions)
        assert fe1.memory.read(b.mr.addr, MR_SIZE) == pattern
        # The same QP, in the same state with the same attributes, and the device gives new handles and keys.
        q = a.verbs.query_qp(a.qp)
        assert (q.qp_state, q.dest_qp_num, q.sq_psn) == qp_before
        mr2 = a.verbs.reg_mr(a.pd, 4096)
        assert mr2.lkey != a.mr.lkey
        # vm1 WRITEs into vm0's new memory: the keys and the route moved with it.
        fe1.memory.write(b.mr.addr, pattern[::-1])
        b.verbs.post_send(b.qp, WRITE, [(b.mr.addr, MR_SIZE, b.mr.lkey)], wr_id=99, signaled=True,
                          remote_addr=a.mr.addr, rkey=a.mr.rkey)
        assert [c.status for c in wait_cqes(b.verbs, b.cq, 1)] == [abi.const("VRDMA_WC_SUCCESS")]
        assert fe0.memory.read(a.mr.addr, MR_SIZE) == pattern[::-1]
        fe0.close()


def test_a_state_the_destination_cannot_take_fails_the_migration(backend: BackendProcess) -> None:
    """A damaged state, and another VM's, are refused at CHECK_DEVICE_STATE: QEMU's destination then fails the
    migration; the destination's device is left empty and usable."""
    with backend.frontend("vm0") as fe0:
        start_side(fe0, backend, "vm0", GIDS["vm0"], 4096)
        fe0.stop_queues()
        state = fe0.save_device_state()
    with backend.frontend("vm1") as fe1:
        fe1.negotiate()
        with pytest.raises(FrontendError, match="CHECK_DEVICE_STATE"):
            fe1.load_device_state(state)  # vm0's state offered to vm1
        damaged = bytearray(state)
        damaged[len(damaged) // 2] ^= 0x40
        with pytest.raises(FrontendError, match="CHECK_DEVICE_STATE"):
            fe1.load_device_state(bytes(damaged))
        assert "the device refused the state" in backend.log_text()
        counters = backend.counters("vm1")
        assert not any(counters["objects"].values()) and counters["connection"]["state"] == "connected"
    with backend.frontend("vm1") as fe1:  # and the VM's device serves its next frontend as ever
        start_side(fe1, backend, "vm1", GIDS["vm1"], 4096)


def test_a_vm_migrated_between_two_frontends_of_one_backend_keeps_a_peers_writes_landing(
        backend: BackendProcess) -> None:
    """QEMU's migration between two QEMUs served by this backend: the destination connects to the VM's socket while
    the source's connection is open (a second device of the VM, not a refusal), takes the state, and when it
    starts takes the source's place: a peer's WRITEs land in the destination's memory, the VM's own go on, and the
    source's connection is let go without an error counted."""
    with backend.frontend("vm0") as source, backend.frontend("vm1") as fe1:
        a, b = start_side(source, backend, "vm0", GIDS["vm0"], MR_SIZE), start_side(fe1, backend, "vm1", GIDS["vm1"],
                                                                                  MR_SIZE)
        connect_sides(a, GIDS["vm0"], b, GIDS["vm1"])
        pattern = os.urandom(MR_SIZE)
        fe1.memory.write(b.mr.addr, pattern)
        before = backend.counters("vm0")["connection"]
        header_size = abi.sizeof("vrdma_doorbell_header")
        pairing_id = abi.from_bytes("vrdma_doorbell_header", bytes(a.verbs.doorbells[:header_size])).pairing_id
        dest = Frontend(str(backend.sockets["vm0"]), memory_size=4096)
        dest.negotiate()
        migrating = backend.counters("vm0")["connection"]
        assert migrating["incoming"] and migrating["state"] == "connected", migrating
        # vm1's WRITE into vm0 posted while vm0 is stopped: it waits, and its bytes land in the destination's memory
        # (the engine re-aims vm1's QP at the destination's device; without that they would land in the source's).
        def peer_writes() -> None:
            b.verbs.post_send(b.qp, WRITE, [(b.mr.addr, MR_SIZE, b.mr.lkey)], wr_id=7, signaled=True,
                              remote_addr=a.mr.addr, rkey=a.mr.rkey)

        fe0 = source.migrate(str(backend.sockets["vm0"]), dest, while_stopped=peer_writes)
        a.verbs.fe, a.verbs.memory = fe0, fe0.memory
        a.verbs.doorbells = map_doorbells(backend.directory / "vm0.doorbell")  # the region took the VM's path
        # and names the identity the guest saw (a driver probing again pairs config space with it)
        assert abi.from_bytes("vrdma_doorbell_header", bytes(a.verbs.doorbells[:header_size])).pairing_id == pairing_id
        assert [c.status for c in wait_cqes(b.verbs, b.cq, 1)] == [abi.const("VRDMA_WC_SUCCESS")]
        assert fe0.memory.read(a.mr.addr, MR_SIZE) == pattern
        after = backend.counters("vm0")["connection"]
        assert (after["migrations_in"], after["incoming"], after["closed"], after["protocol_errors"]) == \
            (before["migrations_in"] + 1, False, before["closed"], 0), after
        assert not (backend.directory / "vm0.doorbell.incoming").exists()
        # The VM's own WRITE into vm1 after the move.
        fe0.memory.write(a.mr.addr, pattern[::-1])
        a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, MR_SIZE, a.mr.lkey)], wr_id=8, signaled=True,
                          remote_addr=b.mr.addr, rkey=b.mr.rkey)
        assert [c.status for c in wait_cqes(a.verbs, a.cq, 1)] == [abi.const("VRDMA_WC_SUCCESS")]
        assert fe1.memory.read(b.mr.addr, MR_SIZE) == pattern[::-1]
        fe0.close()


def test_a_second_frontend_that_does_not_migrate_is_refused_and_a_failed_migration_leaves_the_source(
        backend: BackendProcess) -> None:
    """A second QEMU of a running VM that starts the device from nothing is refused (the VM keeps its device); a
    destination that goes before starting (a cancelled or failed migration) leaves the source, which resumes
    with its objects, and the incoming device's region is removed."""
    with backend.frontend("vm0") as source:
        a = start_side(source, backend, "vm0", GIDS["vm0"], 4096)
        state_before = a.verbs.query_qp(a.qp).qp_state
        with Frontend(str(backend.sockets["vm0"])) as second, pytest.raises((FrontendError, ConnectionError)):
            second.start()  # (closed by the backend while a reply is awaited)
        wait_until("the refused frontend's device dropped",
                   lambda: not backend.counters("vm0")["connection"]["incoming"], 10)
        counters = backend.counters("vm0")
        assert counters["connection"]["refused"] == 1 and counters["objects"]["qp"] == 1, counters
        assert "without migrating into it" in backend.log_text()
        # A migration that gets as far as the state loaded at the destination, then cancelled: the source resumes.
        with Frontend(str(backend.sockets["vm0"]), memory_size=4096) as dest:
            dest.negotiate()
            bases = source.stop_queues()
            dest.load_device_state(source.save_device_state())
        wait_until("the cancelled destination's device dropped",
                   lambda: not backend.counters("vm0")["connection"]["incoming"], 10)
        source.start_queues(bases)
        assert not backend.counters("vm0")["connection"]["suspended"]
        assert not (backend.directory / "vm0.doorbell.incoming").exists()
        assert a.verbs.query_qp(a.qp).qp_state == state_before
        assert backend.counters("vm0")["objects"]["qp"] == 1
