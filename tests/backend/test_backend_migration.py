"""A VM migrated through the backend's vhost-user device-state transfer (issue 28), the simulated frontend playing
QEMU: every queue stopped, the state saved through a pipe, the source frontend gone, a destination frontend with a
copy of the guest's memory connected to the VM's socket, the state loaded through a pipe and checked, the device
started where it stopped. Its QPs, keys, handles and the WRITEs it had queued go on, byte for byte."""

from __future__ import annotations

import os

import pytest
from backend_process import BackendProcess, connect_sides, start_side, wait_cqes

from vrdma.device import abi
from vrdma.testing.frontend import FrontendError

pytestmark = pytest.mark.backend

GIDS = {"vm0": bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]), "vm1": bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])}
WRITE = abi.const("VRDMA_WR_RDMA_WRITE")
MR_SIZE = 1 << 20
WRITES = 32
PIECE = MR_SIZE // WRITES


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
