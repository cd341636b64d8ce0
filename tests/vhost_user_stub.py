"""A minimal vhost-user backend that stands in for the vrdma backend in QEMU device tests.

It answers the messages QEMU sends while realizing a vhost-user device (feature queries, ownership, vring call
descriptors) and nothing more: enough to prove that QEMU creates `vhost-user-device-pci,virtio-id=42` without
aborting. The real backend comes with its own protocol tests.
"""

from __future__ import annotations

import array
import socket
import struct
import threading
from pathlib import Path
from types import TracebackType

HEADER = struct.Struct("<III")  # request, flags, payload size
FLAG_VERSION = 0x1
FLAG_REPLY = 0x4
FLAG_NEED_REPLY = 0x8
VIRTIO_F_VERSION_1 = 1 << 32
# Offered so that QEMU asks for protocol features (answered with none) and assumes the baseline 8 memory slots.
VHOST_USER_F_PROTOCOL_FEATURES = 1 << 30

GET_FEATURES, GET_PROTOCOL_FEATURES, GET_VRING_BASE, GET_QUEUE_NUM, GET_MAX_MEM_SLOTS = 1, 15, 11, 17, 36


class VhostUserStub:
    """``with VhostUserStub(path) as stub:`` listens at ``path`` and serves one QEMU connection in a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: list[int] = []
        self.error: BaseException | None = None
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> VhostUserStub:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.close()
        self._thread.join(10)

    def _serve(self) -> None:
        try:
            conn, _ = self._server.accept()
        except OSError:
            return
        with conn:
            try:
                while self._one(conn):
                    pass
            except OSError as err:
                self.error = err

    def _one(self, conn: socket.socket) -> bool:
        fds = array.array("i")
        data, ancdata, _, _ = conn.recvmsg(HEADER.size, socket.CMSG_SPACE(8 * fds.itemsize))
        for level, kind, cmsg in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(cmsg[: len(cmsg) - len(cmsg) % fds.itemsize])
        for fd in fds:
            socket.close(fd)
        if len(data) < HEADER.size:
            return False
        request, flags, size = HEADER.unpack(data)
        payload = b""
        while len(payload) < size:
            chunk = conn.recv(size - len(payload))
            if not chunk:
                return False
            payload += chunk
        self.requests.append(request)
        if request == GET_FEATURES:
            reply = struct.pack("<Q", VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES)
        elif request == GET_VRING_BASE:
            reply = payload[:4] + struct.pack("<I", 0)
        elif request in (GET_PROTOCOL_FEATURES, GET_QUEUE_NUM, GET_MAX_MEM_SLOTS) or flags & FLAG_NEED_REPLY:
            reply = struct.pack("<Q", 0)
        else:
            return True
        conn.sendall(HEADER.pack(request, FLAG_VERSION | FLAG_REPLY, len(reply)) + reply)
        return True
