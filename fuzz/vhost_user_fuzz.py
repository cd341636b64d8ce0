"""Coverage-guided fuzzing of vhost-user framing and validation (vrdma.vhost_user.protocol), with atheris.

Each input is what a hostile frontend controls on its socket: a byte stream, sent in chunks, some chunks carrying
file descriptors (memfds of chosen sizes, pipes, eventfds, /dev/null, sockets, up to more than a message may
carry). The backend's side of a socketpair reads it with MessageReader exactly as VhostUserConnection does, and every
framed message goes through validate() (for ADD_MEM_REG also check_regions against the regions accepted so far).

Properties checked on every input:
- only ProtocolError comes out of framing and validation (and EOFError once the peer has closed);
- every descriptor received is closed when the input is done (the reader's partial ones and the messages');
- a message that validated carries exactly the fds its rule asks for, and a memory table decodes to as many
  regions as it has fds.

Inputs are structured (mostly well-formed headers, payload sizes from the request table, memory tables whose
regions fit their memfds or just do not) so that mutation reaches past the first check; raw bytes are sent too.

``python -m fuzz.vhost_user_fuzz [libFuzzer options] [corpus dirs or files]``
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import sys

import atheris

from fuzz.atheris_main import check_no_new_fds, main, open_fds

with atheris.instrument_imports(include=["vrdma"]):
    from vrdma.vhost_user import protocol
    from vrdma.vhost_user.protocol import HEADER, MEMORY_HEADER, MEMORY_REGION, U64, Request

NUM_QUEUES = 3           # the vrdma device's queues (validate's vring index checks)
MAX_CHUNKS = 8
PAGE = 4096
MEMFD_SIZES = (0, PAGE, 16 * PAGE, 1 << 20)
SIZES = (0, 1, PAGE - 1, PAGE, 1 << 20, (1 << 20) + PAGE, 1 << 63, (1 << 64) - PAGE, (1 << 64) - 1)
REQUESTS = [int(r) for r in Request] + [0x7FFF, 0xFFFFFFFF]
FLAGS = (protocol.VERSION, protocol.VERSION | protocol.FLAG_NEED_REPLY, 0, protocol.VERSION | protocol.FLAG_REPLY,
         0x3, protocol.VERSION | 0x10)


def _new_fd(kind: int, fdp: atheris.FuzzedDataProvider) -> int:
    if kind == 0:
        fd = os.memfd_create("fuzz-region", os.MFD_CLOEXEC)
        os.ftruncate(fd, fdp.PickValueInList(list(MEMFD_SIZES)))
        return fd
    if kind == 1:
        r, w = os.pipe2(os.O_CLOEXEC)
        os.close(w)
        return r
    if kind == 2:
        return os.eventfd(0, os.EFD_CLOEXEC)
    if kind == 3:
        return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    a, b = socket.socketpair()
    b.close()
    return a.detach()


def _region(fdp: atheris.FuzzedDataProvider) -> bytes:
    gpa = fdp.ConsumeIntInRange(0, 64) * PAGE if fdp.ConsumeBool() else fdp.ConsumeInt(8) % (1 << 64)
    size = fdp.PickValueInList(list(SIZES)) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 1 << 21)
    user = (0x7F00_0000_0000 + gpa) % (1 << 64) if fdp.ConsumeBool() else fdp.ConsumeInt(8) % (1 << 64)
    offset = fdp.PickValueInList([0, PAGE, 1, (1 << 64) - PAGE]) if fdp.ConsumeBool() else \
        fdp.ConsumeIntInRange(0, 1 << 21)
    return MEMORY_REGION.pack(gpa, size, user, offset)


def _payload(request: int, fdp: atheris.FuzzedDataProvider) -> bytes:
    """A payload shaped for its request most of the time (so that validation goes past the size check)."""
    shape = fdp.ConsumeIntInRange(0, 3)
    if shape == 0:
        return bytes(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, protocol.MAX_PAYLOAD + 8)))
    if request == Request.SET_MEM_TABLE:
        count = fdp.ConsumeIntInRange(0, protocol.MAX_FDS + 1)
        return MEMORY_HEADER.pack(count, 0) + b"".join(_region(fdp) for _ in range(count))
    if request in (Request.ADD_MEM_REG, Request.REM_MEM_REG):
        return U64.pack(0) + _region(fdp)
    if request in (Request.SET_VRING_KICK, Request.SET_VRING_CALL, Request.SET_VRING_ERR, Request.SET_FEATURES,
                   Request.SET_PROTOCOL_FEATURES):
        index = fdp.ConsumeIntInRange(0, 4) | (protocol.VRING_NOFD if fdp.ConsumeBool() else 0)
        return U64.pack(index if shape == 1 else fdp.ConsumeInt(8) % (1 << 64))
    if request in (Request.GET_CONFIG, Request.SET_CONFIG):
        offset, size = fdp.ConsumeIntInRange(0, 300), fdp.ConsumeIntInRange(0, 300)
        return protocol.CONFIG_HEADER.pack(offset, size, 0) + bytes(size if shape == 1 else
                                                                   fdp.ConsumeIntInRange(0, 64))
    if request in (Request.SET_VRING_NUM, Request.SET_VRING_BASE, Request.GET_VRING_BASE, Request.SET_VRING_ENABLE):
        return protocol.VRING_STATE.pack(fdp.ConsumeIntInRange(0, 4), fdp.ConsumeIntInRange(0, 1 << 16))
    if request == Request.SET_VRING_ADDR:
        index = int(fdp.ConsumeIntInRange(0, 4))
        return index.to_bytes(4, "little") + bytes(fdp.ConsumeBytes(protocol.VRING_ADDR_SIZE - 4))
    return bytes(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16)))


def _chunk(fdp: atheris.FuzzedDataProvider) -> tuple[bytes, int]:
    """Bytes to send in one sendmsg, and how many fds go with them."""
    if fdp.ConsumeIntInRange(0, 7) == 0:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 600)), fdp.ConsumeIntInRange(0, 3)
    request = fdp.PickValueInList(REQUESTS)
    flags = fdp.PickValueInList(list(FLAGS))
    payload = _payload(request, fdp)
    size = len(payload) if fdp.ConsumeIntInRange(0, 15) else fdp.ConsumeIntInRange(0, 400)
    message = HEADER.pack(request, flags, size) + payload
    if request == Request.SET_MEM_TABLE and len(payload) >= MEMORY_HEADER.size:
        nfds = min(MEMORY_HEADER.unpack_from(payload)[0], 40)
    elif request in (Request.ADD_MEM_REG, Request.SET_VRING_KICK, Request.SET_VRING_CALL, Request.SET_VRING_ERR):
        nfds = 1
    else:
        nfds = 0
    if fdp.ConsumeIntInRange(0, 7) == 0:
        nfds = fdp.ConsumeIntInRange(0, 40)  # more than a message may carry, or a stray one
    # Split point: a message may arrive in pieces (its fds with the first piece that is read).
    return message, nfds


class Connection:
    """The backend's side: what VhostUserConnection does with each framed message, minus libvhost-user."""

    def __init__(self, sock: socket.socket) -> None:
        self.reader = protocol.MessageReader(sock)
        self.regions: list[tuple[int, int]] = []
        self.open = True

    def drain(self) -> None:
        while self.open:
            try:
                messages = self.reader.read()
            except (protocol.ProtocolError, EOFError):
                self.open = False
                return
            if not messages:
                return
            for message in messages:
                self.handle(message)

    def handle(self, message: protocol.Message) -> None:
        if not self.open:
            message.close_fds()
            return
        try:
            protocol.validate(message, NUM_QUEUES)
            request = Request(message.request)
            if request in (Request.SET_MEM_TABLE, Request.ADD_MEM_REG, Request.REM_MEM_REG):
                regions = protocol.memory_regions(message)
                if request == Request.SET_MEM_TABLE:
                    assert len(regions) == len(message.fds), "memory table and fds disagree"
                    self.regions = [(r.gpa, r.size) for r in regions]
                elif request == Request.ADD_MEM_REG:
                    assert len(message.fds) == 1
                    protocol.check_regions(regions, self.regions)
                    self.regions.append((regions[0].gpa, regions[0].size))
                else:
                    self.regions = [r for r in self.regions if r != (regions[0].gpa, regions[0].size)]
        except protocol.ProtocolError:
            self.open = False
        finally:
            message.close_fds()


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    before = open_fds()
    frontend, backend = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    backend.setblocking(False)
    connection = Connection(backend)
    try:
        for _ in range(fdp.ConsumeIntInRange(1, MAX_CHUNKS)):
            message, nfds = _chunk(fdp)
            cut = fdp.ConsumeIntInRange(0, len(message)) if fdp.ConsumeIntInRange(0, 3) == 0 else len(message)
            fds = [_new_fd(fdp.ConsumeIntInRange(0, 4), fdp) for _ in range(nfds)]
            try:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
                with contextlib.suppress(BlockingIOError, BrokenPipeError, ConnectionResetError):
                    frontend.sendmsg([message[:cut]], ancillary)
                    if cut < len(message):
                        connection.drain()
                        frontend.sendall(message[cut:])
            finally:
                for fd in fds:
                    os.close(fd)
            connection.drain()
        frontend.close()
        connection.drain()
        if connection.open:
            raise AssertionError("the reader did not report the end of the stream")
    finally:
        connection.reader.close()
        backend.close()
        frontend.close()
    check_no_new_fds(before, "vhost-user framing and validation")


if __name__ == "__main__":
    main(test_one_input)
    sys.exit(0)
