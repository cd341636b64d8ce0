"""Coverage-guided fuzzing of the container channel (vrdma.channel, vrdma.device.scope, vrdma.daemon.container),
with atheris.

One container's device in process (a real data engine), served as the backend serves it; each input is one
process's connection: a socketpair whose backend side a ChannelConnection reads exactly as it reads an accepted
socket, and whose other side sends what a hostile process controls, a message at a time, each message followed by
the backend's turn. Records of [kind u8][aux u8][length u16 LE][length bytes]:

  kind % 8 == 0  HELLO with the given body (aux odd: VRDMA_CHANNEL_VERSION patched in)
  kind % 8 == 1  ADD_MEMORY with the body, and the descriptor aux chooses: a memfd sealed against shrinking (of
                 one of four sizes), one that is not, /dev/null, an eventfd, none, two
  kind % 8 == 2  REMOVE_MEMORY with the body (a small addr names a region added earlier)
  kind % 8 == 3  COMMAND: the body is a device command; small handles name values earlier answers returned (the
                 user context HELLO gave is the first), a small page-list addr a page of the first region
  kind % 8 == 4  raw bytes, as one message, with aux % 4 descriptors of /dev/null
  kind % 8 == 5  the body's 8-byte words written into the first region at page aux (small words: its pages), as a
                 page list
  kind % 8 == 6  CQ_NOTIFY with the body (a small cq names a value an answer returned) and the descriptor aux
                 chooses: a pipe's write end, its read end, a memfd, /dev/null, none (the pipe is drained and
                 closed after the input: the events written into it are read)
  otherwise      a COMMAND, as 3

A message counts as one input of this interface. Properties checked:
- every answer echoes its request's type and sequence number and carries one of the channel's statuses, a
  COMMAND's answer a device response (or the connection is closed: then nothing more is read from it);
- when the process goes, everything it made goes: the container's device holds no object but its GID, the memory
  table is empty, no session is left, and no descriptor is left open in this process.

``python -m fuzz.channel_fuzz [libFuzzer options] [corpus dirs or files]``; ``--write-seeds DIR`` writes the seeds.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import functools
import logging
import os
import socket
import tempfile
from pathlib import Path

import atheris

from fuzz.atheris_main import Stats, check_no_new_fds, main_or_seeds, open_fds

with atheris.instrument_imports(include=["vrdma"]):
    from vrdma.channel import connection, wire
    from vrdma.channel.wire import MessageType
    from vrdma.daemon import container
    from vrdma.daemon.config import container_spec
    from vrdma.device import abi, scope
    from vrdma.device.commands import COMMANDS
    from vrdma.device.fabric import Fabric
    from vrdma.engine.native import Engine
    from vrdma.loop import EventLoop

from fuzz.commands_fuzz import REQUESTS, RESPONSES, Script, records  # (records: the same framing, up to 32)

PAGE = 4096
MEMFD_SIZES = (PAGE, 16 * PAGE, 1 << 20, 3 * PAGE)
STATUSES = {int(s) for s in wire.Status}
HANDLE_FIELDS = {"handle", "pd", "ucontext", "send_cq", "recv_cq", "srq", "dest_qp_num", "cq"}

logging.disable(logging.CRITICAL)
assert connection and scope  # instrumented by the imports above


class Device:
    """The container every input connects to: its endpoint, made once per fuzzer process."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="vrdma-channel-fuzz-"))
        self.loop = EventLoop()
        self.fabric = Fabric(Engine(1), 1)
        spec = container_spec("fuzz", str(self.directory / "c.sock"), "10.9.9.9", max_processes=2)
        self.endpoint = container.ContainerEndpoint(spec, self.loop, self.fabric)
        self.baseline = self.endpoint.rdma.objects.counts()
        self.stats = Stats("messages")


@functools.cache
def device() -> Device:
    return Device()


def _pipe_end(aux: int, pipes: list[int]) -> list[int]:
    """For CQ_NOTIFY: a pipe's write end (mostly), its read end, or another kind of descriptor; the read ends kept in
    ``pipes`` for the input's end."""
    choice = aux % 6
    if choice < 3:
        r, w = os.pipe2(os.O_CLOEXEC)
        pipes.append(r)
        return [w]
    if choice == 3:
        r, w = os.pipe2(os.O_CLOEXEC)
        os.close(w)
        return [r]
    return _descriptor(aux >> 3) if choice == 4 else []


def _descriptor(aux: int) -> list[int]:
    choice = aux % 8
    if choice < 4:
        fd = os.memfd_create("fuzz", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, MEMFD_SIZES[(aux >> 3) % len(MEMFD_SIZES)])
        if choice < 3:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        return [fd]
    if choice == 4:
        return [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)]
    if choice == 5:
        return [os.eventfd(0, os.EFD_CLOEXEC)]
    if choice == 6:
        return []
    return [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in range(2)]


class Process:
    """The hostile process's side of one input."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev
        ours, self.sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.setblocking(False)
        session = dev.endpoint.serve(ours, pid=0)
        assert session is not None, "no process slot free: an earlier input's session was left"
        self.session = session
        self.seq = 0
        self.returned: list[int] = []
        self.regions: list[int] = []
        self.pipes: list[int] = []  # read ends of the pipes given to CQ_NOTIFY
        self.open = True

    def send(self, kind: int, body: bytes, fds: list[int], raw: bool = False) -> None:
        self.seq += 1
        message = body if raw else wire.api.to_bytes(wire.api.new("vrdma_chan_hdr", type=kind, seq=self.seq)) + body
        try:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
            self.sock.sendmsg([message], ancillary)
        except OSError:
            self.open = False
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.dev.stats.inputs += 1
        self.dev.loop.run_once(0)
        self.receive(None if raw else (kind, self.seq))

    def receive(self, expected: tuple[int, int] | None) -> None:
        while True:
            try:
                data, ancdata, _, _ = self.sock.recvmsg(wire.MAX_MESSAGE, socket.CMSG_SPACE(16))
            except BlockingIOError:
                return
            except OSError:
                self.open = False
                return
            fds = array.array("i")
            for _, _, payload in ancdata:
                fds.frombytes(payload[:len(payload) - len(payload) % 4])
            for fd in fds:
                os.close(fd)
            if not data:
                self.open = False
                return
            assert len(data) >= wire.HEADER_SIZE, f"a {len(data)}-byte answer"
            hdr = wire.api.from_bytes("vrdma_chan_hdr", data[:wire.HEADER_SIZE])
            if hdr.type == MessageType.EVENT:
                assert len(data) == wire.HEADER_SIZE + abi.sizeof("vrdma_event"), "an event of the wrong size"
                continue
            assert hdr.status in STATUSES, f"status {hdr.status}"
            if expected is not None:
                assert (hdr.type, hdr.seq) == expected, f"answer {hdr.type}/{hdr.seq} to {expected}"
            self.learn(int(hdr.type), int(hdr.status), data)

    def learn(self, kind: int, status: int, data: bytes) -> None:
        if status:
            return
        if kind == MessageType.HELLO:
            self.returned.insert(0, int(wire.api.from_bytes("vrdma_chan_hello_resp", data).ucontext))
        elif kind == MessageType.ADD_MEMORY:
            self.regions.append(int(wire.api.from_bytes("vrdma_chan_memory_resp", data).addr))
        elif kind == MessageType.COMMAND:
            response = data[wire.HEADER_SIZE:]
            assert len(response) >= abi.sizeof("vrdma_resp_hdr"), "a COMMAND answered without a response"
            opcode = int.from_bytes(response[0:2], "little")
            if opcode in COMMANDS and len(response) == abi.sizeof(COMMANDS[opcode].response):
                self.returned += [int.from_bytes(response[leaf.offset:leaf.offset + leaf.size], "little")
                                  for leaf in RESPONSES[opcode]]

    def command(self, body: bytes) -> None:
        request = bytearray(body)
        opcode = int.from_bytes(request[0:2], "little")
        for leaf in REQUESTS[opcode][0] if opcode in REQUESTS else []:
            if leaf.array or leaf.offset + leaf.size > len(request):
                continue
            value = int.from_bytes(request[leaf.offset:leaf.offset + leaf.size], "little")
            patched = None
            if leaf.name in HANDLE_FIELDS and 0 < value <= len(self.returned):
                patched = self.returned[value - 1]
            elif leaf.name == "addr" and leaf.parent in ("ring", "pages") and 0 < value <= 256 and self.regions:
                patched = self.regions[0] + (value - 1) * PAGE
            if patched is not None:
                request[leaf.offset:leaf.offset + leaf.size] = \
                    (patched % (1 << 8 * leaf.size)).to_bytes(leaf.size, "little")
        self.send(MessageType.COMMAND, bytes(request), [])

    def write_list(self, page: int, body: bytes) -> None:
        """Page-list words into the first region the process added (its own memory: no message)."""
        region = self.session.regions.get(self.regions[0]) if self.regions else None
        if region is None:
            return
        words = [int.from_bytes(body[i:i + 8], "little") for i in range(0, len(body) - 7, 8)][:PAGE // 8]
        words = [self.regions[0] + (w - 1) * PAGE if 0 < w <= 256 else w for w in words]
        offset = (page % (region[1] // PAGE)) * PAGE
        data = b"".join((w % (1 << 64)).to_bytes(8, "little") for w in words)
        ctypes.memmove(region[2] + offset, data, len(data))

    def close(self) -> None:
        self.sock.close()
        self.dev.loop.run_once(0)
        for fd in self.pipes:
            os.close(fd)


def test_one_input(data: bytes) -> None:
    dev = device()
    before = open_fds()
    process = Process(dev)
    try:
        for kind, aux, body in records(data):
            if not process.open:
                break
            action = kind % 8
            if action == 0:
                hello = bytearray(body)
                if aux & 1 and len(hello) >= 12:
                    hello[8:12] = wire.VERSION.to_bytes(4, "little")
                process.send(MessageType.HELLO, bytes(hello[8:]) if len(hello) >= 8 else bytes(hello), [])
            elif action == 1:
                process.send(MessageType.ADD_MEMORY, body, _descriptor(aux))
            elif action == 2:
                request = bytearray(body)
                if len(request) >= 8 and 0 < int.from_bytes(request[:8], "little") <= len(process.regions):
                    request[:8] = process.regions[int.from_bytes(request[:8], "little") - 1].to_bytes(8, "little")
                process.send(MessageType.REMOVE_MEMORY, bytes(request), [])
            elif action == 4:
                process.send(0, body, [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in range(aux % 4)],
                             raw=True)
            elif action == 5:
                process.write_list(aux, body)
            elif action == 6:
                request = bytearray(body)
                if len(request) >= 4 and 0 < int.from_bytes(request[:4], "little") <= len(process.returned):
                    value = process.returned[int.from_bytes(request[:4], "little") - 1]
                    request[:4] = (value % (1 << 32)).to_bytes(4, "little")
                process.send(MessageType.CQ_NOTIFY, bytes(request), _pipe_end(aux, process.pipes))
            else:
                process.command(body)
    finally:
        process.close()
    endpoint = dev.endpoint
    assert not endpoint.sessions, "a process's session outlived its connection"
    assert endpoint.rdma.objects.counts() == dev.baseline, \
        f"objects left: {endpoint.rdma.objects.counts()} (before: {dev.baseline})"
    assert endpoint.rdma.memory == [], f"memory table left: {endpoint.rdma.memory}"
    check_no_new_fds(before, "the container channel")
    dev.stats.done()


# -- seeds: what libvrdma in a container sends, in the records above ---------------------------------------------

def _record(kind: int, aux: int, body: bytes) -> bytes:
    return bytes([kind, aux]) + len(body).to_bytes(2, "little") + body


def seeds() -> dict[str, bytes]:
    hello = _record(0, 1, wire.api.to_bytes(wire.api.new("vrdma_chan_hello", version=wire.VERSION)))
    add = _record(1, 2 | (2 << 3), wire.api.to_bytes(wire.api.new("vrdma_chan_add_memory", size=1 << 20))[8:])
    # Page lists in the first region: page 1 lists pages 8..23 (an MR), page 2 pages 24..25 (a CQ), page 3 26..28.
    lists = b"".join(_record(5, page, b"".join((first + i).to_bytes(8, "little") for i in range(count)))
                     for page, first, count in ((1, 9, 16), (2, 25, 2), (3, 27, 3)))
    s = Script()
    s.returned = 1  # the user context HELLO gave is value 1
    pd = s.cmd("ALLOC_PD", "vrdma_cmd_alloc_pd", ucontext=1)[0]
    s.cmd("REG_MR", "vrdma_cmd_reg_mr", pd=pd, access=0xF, iova=1 << 30, length=16 * PAGE,
          pages={"addr": 2, "npages": 16, "levels": 1})
    cq = s.cmd("CREATE_CQ", "vrdma_cmd_create_cq", ucontext=1, entries=64,
               ring={"addr": 3, "npages": 2, "levels": 1})[0]
    s.cmd("CREATE_QP", "vrdma_cmd_create_qp", ucontext=1, pd=pd, send_cq=cq, recv_cq=cq,
          qp_type=abi.const("VRDMA_QPT_RC"), sq_depth=16, sq_stride=128, sq_offset=PAGE, rq_depth=16,
          rq_stride=128, rq_offset=2 * PAGE, max_send_sge=4, max_recv_sge=4, max_inline_data=64,
          ring={"addr": 4, "npages": 3, "levels": 1})
    commands = b""
    at = 0
    while at + 4 <= len(s.data):
        length = int.from_bytes(s.data[at + 2:at + 4], "little")
        commands += _record(3, 0, bytes(s.data[at + 4:at + 4 + length]))
        at += 4 + length
    remove = _record(2, 0, (1).to_bytes(8, "little"))
    notify = _record(6, 0, cq.to_bytes(4, "little") + bytes(4) + (0x7F00DEADBEEF).to_bytes(8, "little"))
    return {"lifecycle": hello + add + lists + commands + notify,
            "remove-under-objects": hello + add + lists + commands + remove + commands,
            "no-hello": add + commands, "twice": hello + hello + add + add + remove + remove}


if __name__ == "__main__":
    main_or_seeds(test_one_input, seeds)

