"""SET_BACKEND_REQ_FD: the backend channel, and what the backend sends on it: the doorbell region, mapped into
vhost-user-rdma-pci's shared memory region VRDMA_SHM_DOORBELL (VHOST_USER_BACKEND_SHMEM_MAP, docs/qemu.md)."""

from __future__ import annotations

import array
import os
import socket
import struct

import pytest
from backend_process import BackendProcess, Bystander
from message_helpers import harms_only_its_sender, raw

from vrdma.device import abi
from vrdma.testing.frontend import Frontend
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import ProtocolFeature, Request

pytestmark = pytest.mark.backend

SHMEM_MAP = 9                          # VHOST_USER_BACKEND_SHMEM_MAP
MMAP = struct.Struct("<B7xQQQQ")       # VhostUserMMap: shmid, fd_offset, shm_offset, len, flags


def backend_channel(fe: Frontend, features: int) -> socket.socket:
    """Negotiate ``features`` and hand the backend its channel (as QEMU does at realize); our end of it."""
    fe.get_u64(Request.GET_FEATURES)
    fe.send_raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(features))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fe.acked(Request.SET_BACKEND_REQ_FD, fds=[theirs.fileno()])
    theirs.close()
    ours.settimeout(5)
    return ours


def test_the_doorbell_region_is_mapped_over_the_backend_channel(fe: Frontend, backend: BackendProcess) -> None:
    offered = fe.get_u64(Request.GET_PROTOCOL_FEATURES)
    with backend_channel(fe, offered) as channel:
        fds = array.array("i")
        # The header carries the fds; the payload may come in a write of its own (libvhost-user's way).
        message, ancillary, _, _ = channel.recvmsg(protocol.HEADER.size, socket.CMSG_SPACE(4 * 8))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
        while len(message) < protocol.HEADER.size + MMAP.size:
            chunk = channel.recv(protocol.HEADER.size + MMAP.size - len(message))
            assert chunk, "the backend closed its channel mid-message"
            message += chunk
        request, flags, size = protocol.HEADER.unpack_from(message)
        assert (request, size) == (SHMEM_MAP, MMAP.size), message
        assert not flags & protocol.FLAG_NEED_REPLY, "a map that waits for QEMU's answer can deadlock QEMU 10.0"
        shmid, fd_offset, shm_offset, length, map_flags = MMAP.unpack_from(message, protocol.HEADER.size)
        doorbell = backend.directory / "vm0.doorbell"
        assert (shmid, fd_offset, shm_offset, map_flags) == (abi.const("VRDMA_SHM_DOORBELL"), 0, 0, 1)
        assert length == doorbell.stat().st_size == 4 << 20
        assert len(fds) == 1
        try:
            assert os.fstat(fds[0]).st_ino == doorbell.stat().st_ino, "the fd is not the VM's doorbell region"
        finally:
            os.close(fds[0])
    assert backend.connection("vm0")["shared_memory_maps"] == 1


def test_without_the_shmem_feature_nothing_is_sent(fe: Frontend, backend: BackendProcess) -> None:
    """A frontend that did not take SHMEM (QEMU's generic device path works with the ivshmem file instead)."""
    offered = fe.get_u64(Request.GET_PROTOCOL_FEATURES)
    with backend_channel(fe, offered & ~ProtocolFeature.SHMEM) as channel:
        assert fe.get_u64(Request.GET_QUEUE_NUM) == abi.const("VRDMA_NUM_QUEUES")  # processed after the channel
        channel.setblocking(False)
        with pytest.raises(BlockingIOError):
            channel.recv(1)
    assert backend.connection("vm0")["shared_memory_maps"] == 0


ATTACKS = {
    "no fd": raw(Request.SET_BACKEND_REQ_FD),
    "two fds": raw(Request.SET_BACKEND_REQ_FD, fds=2),
    "a payload": raw(Request.SET_BACKEND_REQ_FD, b"\0" * 8, fds=1),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_malformed_set_backend_req_fd(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
