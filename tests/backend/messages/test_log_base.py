"""SET_LOG_BASE and dirty logging while a VM migrates (issue 28): with the log QEMU shares (SET_LOG_BASE) and logging on
(VHOST_F_LOG_ALL), every guest page the backend writes into the VM is marked, whoever's work wrote it: a peer's WRITE
(the engine), a command's response and the used ring (the vhost-user layer). With logging off nothing is marked; a
log the backend cannot safely use is a protocol error that harms only its sender."""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from collections.abc import Callable

import pytest
from backend_process import BackendProcess, Bystander, connect_sides, start_side, wait_cqes
from message_helpers import expect_closed, harms_only_its_sender

from vrdma.device import abi
from vrdma.testing.frontend import VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_VERSION_1, Frontend
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend

GIDS = {"vm0": bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]), "vm1": bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])}
WRITE = abi.const("VRDMA_WR_RDMA_WRITE")
PAGE = 4096


def marked(log: mmap.mmap) -> set[int]:
    """The pages marked, and the log cleared (QEMU's sync)."""
    raw = bytes(log)
    log[:] = bytes(len(log))
    return {i * 8 + bit for i, byte in enumerate(raw) if byte for bit in range(8) if byte >> bit & 1}


def pages(gpa: int, length: int) -> set[int]:
    return set(range(gpa // PAGE, (gpa + length - 1) // PAGE + 1))


def test_every_page_the_backend_writes_is_marked_while_logging(backend: BackendProcess) -> None:
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        a, b = start_side(fe0, backend, "vm0", GIDS["vm0"], 256 << 10), start_side(fe1, backend, "vm1", GIDS["vm1"],
                                                                                    256 << 10)
        connect_sides(a, GIDS["vm0"], b, GIDS["vm1"])
        log = fe1.start_dirty_log()
        marked(log)
        start = b.mr.addr + 5 * PAGE + 100
        a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 40 << 10, a.mr.lkey)], wr_id=1, remote_addr=start,
                          rkey=b.mr.rkey)
        assert [c.status for c in wait_cqes(a.verbs, a.cq, 1)] == [abi.const("VRDMA_WC_SUCCESS")]
        assert marked(log) == pages(start, 40 << 10)  # vm1 wrote nothing itself: only the peer's data
        # A command of vm1's: its response and the control queue's used ring, written by the vhost-user layer.
        control = fe1.queues[abi.const("VRDMA_QUEUE_CONTROL")]
        b.verbs.alloc_pd()
        got = marked(log)
        used = pages(control.used, 4 + 8 * control.size + 2)
        assert used <= got and len(got - used) == 1, (sorted(got), sorted(used))  # and the response's page
        # Logging off (the migration ended): nothing more is marked.
        fe1.acked(Request.SET_FEATURES, protocol.U64.pack(VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES))
        a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 8, a.mr.lkey)], wr_id=2, remote_addr=start, rkey=b.mr.rkey)
        wait_cqes(a.verbs, a.cq, 1)
        b.verbs.alloc_pd()
        assert marked(log) == set()
        log.close()


def _log_attack(size: int, offset: int, seal: bool, file_size: int) -> Callable[[Frontend], None]:
    def attack(fe: Frontend) -> None:
        fe.start()
        fd = os.memfd_create("log", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, file_size)
        if seal:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        fe.send_raw(Request.SET_LOG_BASE, struct.pack("<QQ", size, offset), fds=[fd])
        os.close(fd)
        expect_closed(fe)
    return attack


ATTACKS = {
    "a log that can shrink": _log_attack(PAGE, 0, False, PAGE),
    "a log past the end of its file": _log_attack(2 * PAGE, 0, True, PAGE),
    "a log at an offset inside a page": _log_attack(PAGE, 8, True, 2 * PAGE),
    "a log larger than any guest needs": _log_attack(1 << 40, 0, True, PAGE),
    "an empty log": _log_attack(0, 0, True, PAGE),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_log_the_backend_cannot_use_is_refused(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
