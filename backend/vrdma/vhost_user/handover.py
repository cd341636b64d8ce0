"""A vhost-user connection handed from one backend process to the next (a backend upgrade: vrdma.daemon.upgrade).

The frontend never learns of it. Its socket, the guest's memory, the queues' eventfds and the backend channel go to
the next process as descriptors, with what libvhost-user made of them as data (``snapshot``). The next process
builds its own libvhost-user device from the messages that built the first one (``replay``): SET_OWNER,
SET_PROTOCOL_FEATURES, SET_FEATURES, the backend channel, each memory region (ADD_MEM_REG), and each queue's size,
next index, addresses, eventfds and enable, handed to its own libvhost-user through the same checks as a
frontend's messages, without NEED_REPLY, so that nothing goes back to the frontend; the doorbell region QEMU has
mapped already is not mapped again. What the reader holds of a message half read goes along.

A connection is handed over only at rest: no device-state transfer or dirty log (no migration), and no element
popped and not pushed (the model answers each at once). Like any input, what ``replay`` is handed is checked before
use: a version, every field by type and range, every descriptor index in range and used once.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from vrdma.vhost_user import protocol
from vrdma.vhost_user._libvhost_user import ffi, lib
from vrdma.vhost_user.connection import State, VhostUserConnection

log = logging.getLogger(__name__)

VERSION = 1
MAX_REGIONS = 509  # VHOST_USER_MAX_RAM_SLOTS: the most a frontend's memory table has
U64_MAX = (1 << 64) - 1
QUEUE_KEYS = ("index", "num", "last_avail_idx", "enable", "started", "flags", "desc", "used", "avail", "log",
              "kick", "call", "err")
KEYS = ("version", "socket", "features", "protocol_features", "negotiated_features", "negotiated_protocol_features",
        "backend_fd", "regions", "queues", "partial", "partial_fds", "config_reads", "shared_memory_maps")


class HandoverError(ValueError):
    """A connection that cannot be handed over now, or a hand-over that is not one (the message says which)."""


def snapshot(conn: VhostUserConnection, fds: list[int]) -> dict[str, Any]:
    """``conn`` as data; each descriptor it names is duplicated onto ``fds`` (the caller closes them once sent)."""
    if conn.state is not State.CONNECTED:
        raise HandoverError(f"{conn.name}: the connection is {conn.state.value}")
    if conn.dirty_log is not None or conn.device_state.active:
        raise HandoverError(f"{conn.name}: the VM is migrating (dirty log or device-state transfer under way)")

    def add(fd: int) -> int:
        fds.append(os.dup(fd))
        return len(fds) - 1

    dev = conn._dev
    regions = []
    for i in range(dev.nregions):
        r = dev.regions[i]
        fd = conn.memory_fds.get(int(r.gpa))
        if fd is None:
            raise HandoverError(f"{conn.name}: guest memory region at {int(r.gpa):#x} has no descriptor kept")
        regions.append({"gpa": int(r.gpa), "size": int(r.size), "qva": int(r.qva), "mmap_offset": int(r.mmap_offset),
                        "fd": add(fd)})
    queues = []
    state = ffi.new("VrdmaQueueState *")
    for index in range(conn.model.num_queues):
        if not lib.vrdma_vu_queue_state(conn._vu, index, state) or not state.num:
            continue
        if state.inuse:
            raise HandoverError(f"{conn.name}: queue {index} has {state.inuse} element(s) popped and not pushed")
        queues.append({"index": index, "num": int(state.num), "last_avail_idx": int(state.last_avail_idx),
                       "enable": int(state.enable), "started": bool(state.started), "flags": int(state.flags),
                       "desc": int(state.desc_user_addr), "used": int(state.used_user_addr),
                       "avail": int(state.avail_user_addr), "log": int(state.log_guest_addr),
                       "kick": add(state.kick_fd) if state.kick_fd >= 0 else None,
                       "call": add(state.call_fd) if state.call_fd >= 0 else None,
                       "err": add(state.err_fd) if state.err_fd >= 0 else None})
    backend_fd = lib.vrdma_vu_backend_fd(conn._vu)
    return {"version": VERSION, "socket": add(conn.sock.fileno()), "features": int(dev.features),
            "protocol_features": int(dev.protocol_features), "negotiated_features": conn.negotiated_features,
            "negotiated_protocol_features": conn.negotiated_protocol_features,
            "backend_fd": add(backend_fd) if backend_fd >= 0 else None, "regions": regions, "queues": queues,
            "partial": bytes(conn.reader.buffer).hex(), "partial_fds": [add(fd) for fd in conn.reader.fds],
            "config_reads": conn.config_reads, "shared_memory_maps": conn.shared_memory_maps}


class _Checked:
    """Reads a handed-over connection's fields, each by type and range, and its descriptors, each used once."""

    def __init__(self, fds: list[int], taken: set[int]) -> None:
        self.fds = fds
        self.taken = taken

    def integer(self, data: dict[str, Any], key: str, high: int = U64_MAX) -> int:
        value = data.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
            raise HandoverError(f"hand-over field {key!r}: {value!r} is not an integer of 0 to {high}")
        return value

    def maybe_integer(self, data: dict[str, Any], key: str) -> int | None:
        return None if data.get(key) is None else self.integer(data, key)

    def fd(self, data: dict[str, Any], key: str) -> int:
        index = self.integer(data, key, len(self.fds) - 1 if self.fds else 0)
        if not self.fds or index in self.taken:
            raise HandoverError(f"hand-over field {key!r}: descriptor {index} is none or named twice")
        self.taken.add(index)
        return self.fds[index]

    def maybe_fd(self, data: dict[str, Any], key: str) -> int | None:
        return None if data.get(key) is None else self.fd(data, key)


def _fields(data: Any, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(data, dict) or set(data) != set(keys):
        raise HandoverError(f"{what}: expected the fields {', '.join(keys)}")
    return data


def socket_fd(data: Any, fds: list[int], taken: set[int]) -> int:
    """The frontend's socket of a handed-over connection (checked), before the connection is made around it.
    ``fds``: every descriptor of the hand-over; ``taken``: the indexes of those named so far (each once)."""
    data = _fields(data, KEYS, "hand-over of a connection")
    if data["version"] != VERSION:
        raise HandoverError(f"a connection handed over in version {data['version']!r}; this backend reads {VERSION}")
    return _Checked(fds, taken).fd(data, "socket")


def replay(conn: VhostUserConnection, data: dict[str, Any], fds: list[int], taken: set[int]) -> None:
    """Build ``conn``'s libvhost-user device from a snapshot (``conn`` made around its socket: socket_fd). Each
    descriptor ``data`` names is given to libvhost-user (or the reader), which owns it from then on; HandoverError
    if ``data`` is not a hand-over this backend can take (nothing is given to anybody then)."""
    messages, held = _messages(conn, data, fds, taken)
    conn.replaying = True
    try:
        for message in messages:
            if conn.state is not State.CONNECTED:
                message.close_fds()
                continue
            conn._handle_message(message)
    finally:
        conn.replaying = False
    if conn.state is not State.CONNECTED:
        for fd in held:
            os.close(fd)
        raise HandoverError(f"{conn.name}: the handed-over connection did not rebuild: {conn.broken_reason}")
    conn.reader.buffer = bytearray.fromhex(data["partial"])
    conn.reader.fds = held
    log.info("%s: connection taken over (%d memory region(s), %d queue(s))", conn.name, len(data["regions"]),
             len(data["queues"]))


def _messages(conn: VhostUserConnection, data: dict[str, Any], fds: list[int],
              taken: set[int]) -> tuple[list[protocol.Message], list[int]]:
    """The messages that build the snapshot's device, and the descriptors of its half-read message (checked)."""
    c = _Checked(fds, taken)
    flags = protocol.VERSION  # never NEED_REPLY: the frontend hears nothing of this
    messages: list[protocol.Message] = [protocol.Message(protocol.Request.SET_OWNER, flags, b"")]
    negotiated_protocol = c.maybe_integer(data, "negotiated_protocol_features")
    if negotiated_protocol is not None:
        messages.append(protocol.Message(protocol.Request.SET_PROTOCOL_FEATURES, flags,
                                         protocol.U64.pack(c.integer(data, "protocol_features"))))
    if c.maybe_integer(data, "negotiated_features") is not None:
        messages.append(protocol.Message(protocol.Request.SET_FEATURES, flags,
                                         protocol.U64.pack(c.integer(data, "features"))))
    backend_fd = c.maybe_fd(data, "backend_fd")
    if backend_fd is not None:
        messages.append(protocol.Message(protocol.Request.SET_BACKEND_REQ_FD, flags, b"", [backend_fd]))
    regions = data["regions"] if isinstance(data["regions"], list) else None
    queues = data["queues"] if isinstance(data["queues"], list) else None
    if regions is None or queues is None or len(regions) > MAX_REGIONS or len(queues) > conn.model.num_queues:
        raise HandoverError("hand-over: regions and queues are lists of a device's")
    for region in regions:
        r = _fields(region, ("gpa", "size", "qva", "mmap_offset", "fd"), "hand-over of a memory region")
        payload = protocol.U64.pack(0) + protocol.MEMORY_REGION.pack(
            c.integer(r, "gpa"), c.integer(r, "size"), c.integer(r, "qva"), c.integer(r, "mmap_offset"))
        messages.append(protocol.Message(protocol.Request.ADD_MEM_REG, flags, payload, [c.fd(r, "fd")]))
    for queue in queues:
        q = _fields(queue, QUEUE_KEYS, "hand-over of a queue")
        index = c.integer(q, "index", conn.model.num_queues - 1)
        messages += [
            protocol.Message(protocol.Request.SET_VRING_NUM, flags,
                             protocol.VRING_STATE.pack(index, c.integer(q, "num", 0x8000))),
            protocol.Message(protocol.Request.SET_VRING_BASE, flags,
                             protocol.VRING_STATE.pack(index, c.integer(q, "last_avail_idx", 0xFFFF)))]
        if q["desc"]:
            messages.append(protocol.Message(protocol.Request.SET_VRING_ADDR, flags, protocol.VRING_ADDR.pack(
                index, c.integer(q, "flags", 0xFFFFFFFF), c.integer(q, "desc"), c.integer(q, "used"),
                c.integer(q, "avail"), c.integer(q, "log"))))
        for key, request in (("call", protocol.Request.SET_VRING_CALL), ("err", protocol.Request.SET_VRING_ERR)):
            fd = c.maybe_fd(q, key)
            if fd is not None:
                messages.append(protocol.Message(request, flags, protocol.U64.pack(index), [fd]))
        kick = c.maybe_fd(q, "kick")
        if kick is not None and q["started"] is True:
            messages.append(protocol.Message(protocol.Request.SET_VRING_KICK, flags, protocol.U64.pack(index), [kick]))
        elif kick is not None:
            os.close(kick)  # (a stopped queue's, none in libvhost-user's: its next start brings one; a kick starts)
        messages.append(protocol.Message(protocol.Request.SET_VRING_ENABLE, flags,
                                         protocol.VRING_STATE.pack(index, c.integer(q, "enable", 1))))
    partial = data["partial"]
    partial_fds = data["partial_fds"]
    if not isinstance(partial, str) or len(partial) > 2 * (protocol.HEADER.size + protocol.MAX_PAYLOAD) or \
            not isinstance(partial_fds, list) or len(partial_fds) > protocol.MAX_FDS:
        raise HandoverError("hand-over: a partial message longer than a message, or with too many descriptors")
    try:
        buffered = bytearray.fromhex(partial)
    except ValueError as err:
        raise HandoverError(f"hand-over: partial message: {err}") from err
    held = [c.fd({"fd": index}, "fd") for index in partial_fds]
    conn.config_reads = c.integer(data, "config_reads")
    conn.shared_memory_maps = c.integer(data, "shared_memory_maps")
    del buffered
    return messages, held
