"""The attacker's control commands and vhost-user messages (mixed into attacker.Attacker)."""

from __future__ import annotations

import os
import socket
import struct
from typing import TYPE_CHECKING, Any

from fuzz.campaign.common import (
    ATTACKER_TIMEOUT,
    CMD_HDR,
    COMMAND_SLOTS,
    CREATES,
    DESTROYS,
    GID,
    PAGE,
    RESP_HDR,
    RESPONSE_ROOM,
    U32,
    VICTIM_TIMEOUT,
    cmd,
)
from vrdma.testing.frontend import USER_BASE
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

if TYPE_CHECKING:
    import random

    from fuzz.campaign.attacker import AttackerState, Counts
    from fuzz.campaign.victim import Victim


class _Attacker:
    """What the mixins use of the Attacker they are mixed into."""

    rng: random.Random
    victim: Victim
    counts: Counts
    record: list[dict[str, Any]]   # what it sent since it last connected (for a reproducer)
    seq: int


class CommandAttacks(_Attacker):
    """Mutated control commands on its control queue: valid ones built on its objects (and the victim's handles),
    bytes flipped, fields set to edge values, cut short, lengthened, unknown opcodes, short response buffers."""

    def _templates(self, s: AttackerState, seq: int) -> list[tuple[bytes, int]]:
        """One valid command of each kind on the attacker's objects (response room exact)."""
        rng = self.rng
        h = s.handles
        v = self.victim
        any_handle = [x for hs in h.values() for x in hs] + [v.verbs.ucontext, v.pd, v.qp.handle, v.cq.handle]
        buf = s.mrs[0].buf
        pages = s.verbs.page_list(buf) if rng.randrange(4) == 0 else {"addr": 0, "npages": 0, "levels": 1}
        c = cmd
        out = [
            (c("QUERY_DEVICE", "vrdma_cmd_query_device", seq), 120),
            (c("QUERY_PORT", "vrdma_cmd_query_port", seq, port=1), 40),
            (c("ADD_GID", "vrdma_cmd_add_gid", seq, index=rng.randrange(17), type=2, gid=list(GID["vm1"])), 8),
            (c("DEL_GID", "vrdma_cmd_del_gid", seq, index=rng.randrange(17)), 8),
            (c("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", seq), 16),
            (c("ALLOC_PD", "vrdma_cmd_alloc_pd", seq, ucontext=s.verbs.ucontext), 16),
            (c("REG_MR", "vrdma_cmd_reg_mr", seq, pd=s.pd, access=rng.randrange(16), iova=buf.gpa,
               length=rng.choice([buf.size, PAGE, 1]), pages=pages), 24),
            (c("CREATE_CQ", "vrdma_cmd_create_cq", seq, ucontext=s.verbs.ucontext, entries=rng.choice([1, 2, 64]),
               ring=pages), 16),
            (c("MODIFY_CQ", "vrdma_cmd_modify_cq", seq, handle=rng.choice(h["cq"]), cq_count=rng.randrange(8),
               cq_period=rng.randrange(100)), 8),
            (c("QUERY_QP", "vrdma_cmd_destroy", seq, handle=rng.choice(any_handle)), 100),
            (c("QUERY_QP_COUNTERS", "vrdma_cmd_destroy", seq, handle=rng.choice(any_handle)), 56),
            (c("ALLOC_MR", "vrdma_cmd_alloc_mr", seq, pd=s.pd, max_pages=rng.choice([0, 1, 512, 513])), 16),
            (c("MODIFY_QP", "vrdma_cmd_modify_qp", seq, handle=rng.choice(h["qp"]), attr_mask=rng.getrandbits(21),
               attr={"qp_state": rng.randrange(8), "dest_qp_num": v.qp.qpn, "dgid": list(GID["vm1"])}), 8),
            (c("CREATE_SRQ", "vrdma_cmd_create_srq", seq, ucontext=s.verbs.ucontext, pd=s.pd, depth=16, stride=128,
               max_sge=4, ring=pages), 16),
            (c("QUERY_SRQ", "vrdma_cmd_destroy", seq, handle=rng.choice(any_handle)), 24),
            (c("CREATE_AH", "vrdma_cmd_create_ah", seq, pd=s.pd, sgid_index=0, dgid=list(GID["vm1"])), 16),
            (c("CREATE_QP", "vrdma_cmd_create_qp", seq, ucontext=s.verbs.ucontext, pd=s.pd, send_cq=s.cq.handle,
               recv_cq=s.cq.handle, qp_type=2, sq_depth=16, rq_depth=16, sq_stride=128, rq_stride=128,
               sq_offset=PAGE, rq_offset=2 * PAGE, max_send_sge=2, max_recv_sge=2, ring=pages), 24),
        ]
        # Destroys: mostly of handles that are not the attacker's working set (the victim's, stale, made up).
        for opcode in ("DEREG_MR", "DESTROY_CQ", "DESTROY_QP", "DESTROY_SRQ", "DESTROY_AH", "DEALLOC_PD",
                       "DEALLOC_UCONTEXT"):
            target = rng.choice(any_handle) if rng.randrange(20) == 0 else \
                rng.choice([v.pd, v.qp.handle, v.cq.handle, v.verbs.ucontext, rng.getrandbits(32), 0])
            out.append((c(opcode, "vrdma_cmd_destroy", seq, handle=target), 8))
        return out

    def _mutate(self, request: bytes) -> bytes:
        rng = self.rng
        data = bytearray(request)
        how = rng.randrange(10)
        if how < 3:
            return bytes(data)
        if how < 6 and len(data) > CMD_HDR:
            for _ in range(rng.randrange(1, 5)):
                data[rng.randrange(CMD_HDR, len(data))] = rng.getrandbits(8)
        elif how < 8 and len(data) >= CMD_HDR + 4:
            at = rng.randrange(CMD_HDR, len(data) - 3) & ~3
            data[at:at + 4] = U32.pack(rng.choice([0, 1, 0xFFFFFFFF, 0x80000000, rng.getrandbits(32)]))
        elif how == 8:
            return bytes(data[:rng.randrange(len(data))]) if rng.randrange(2) else bytes(data) + rng.randbytes(
                rng.choice([1, 8, 4096 - len(data) + 1]))
        else:
            data[0:2] = rng.getrandbits(16).to_bytes(2, "little")
            data[2:4] = bytes(2) if rng.randrange(4) else rng.randbytes(2)
        return bytes(data)

    def commands(self, s: AttackerState) -> None:
        rng = self.rng
        batch = []
        for _ in range(rng.randrange(1, COMMAND_SLOTS + 1)):
            self.seq += 1
            request, room = rng.choice(self._templates(s, self.seq & 0xFFFFFFFF))
            request = self._mutate(request)
            room = room if rng.randrange(8) else rng.choice([0, 4, RESP_HDR, room - 1, RESPONSE_ROOM])
            batch.append((request, max(room, 1)))
        self.counts.commands += len(batch)
        self.record.append({"commands": [(r.hex(), room) for r, room in batch]})
        results = s.fe.commands(batch, ATTACKER_TIMEOUT)
        for (request, _), response in zip(batch, results, strict=True):
            if response is None:
                s.broken = True  # its own queue stalled (a message or command of its own broke it)
                continue
            if len(response) < RESP_HDR or response[2:4] != bytes(2):
                continue
            opcode = int.from_bytes(request[0:2], "little")
            kind = CREATES.get(opcode)
            if kind and len(response) >= RESP_HDR + 4:
                s.handles.setdefault(kind, []).append(int(U32.unpack(response[RESP_HDR:RESP_HDR + 4])[0]))
            if opcode in DESTROYS and len(request) >= CMD_HDR + 4 and \
                    int(U32.unpack(request[CMD_HDR:CMD_HDR + 4])[0]) in s.core:
                s.broken = True  # it destroyed part of its own working set: start over next batch



class MessageAttacks(_Attacker):
    """vhost-user messages on its socket: benign requests, memory tables that move or shrink its RAM, fd-carrying
    messages, and malformed ones that end its connection."""

    def _memfd(self, size: int) -> int:
        fd = os.memfd_create("campaign", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return fd

    def _message(self, s: AttackerState) -> tuple[int, int, bytes, list[int], bool]:
        """(request, flags, payload, fds, ends the connection)."""
        rng = self.rng
        V = protocol.VERSION
        ack = V | protocol.FLAG_NEED_REPLY
        fe = s.fe
        size = fe.memory.size
        kind = rng.randrange(19)
        if kind == 0:
            return Request.GET_FEATURES, V, b"", [], False
        if kind == 1:
            return Request.GET_PROTOCOL_FEATURES, V, b"", [], False
        if kind == 2:
            return Request.GET_QUEUE_NUM, V, b"", [], False
        if kind == 3:
            offset, length = rng.randrange(200), rng.randrange(57)
            return Request.GET_CONFIG, V, protocol.CONFIG_HEADER.pack(offset, length, 0) + bytes(length), [], False
        if kind == 4:
            return Request.SET_CONFIG, ack, protocol.CONFIG_HEADER.pack(0, 4, 0) + bytes(4), [], False
        if kind == 5:
            # The same table again, or only part of its RAM: its queues and command buffers (low in its memory)
            # stay, objects above the cut become unusable, and it carries on with them: moving QPs whose rings are
            # gone back to RTS, posting into MRs that are not there.
            part = rng.choice([size, size, size // 2, PAGE * 64])
            region = protocol.MEMORY_REGION.pack(0, part, USER_BASE, 0)
            return Request.SET_MEM_TABLE, ack, protocol.MEMORY_HEADER.pack(1, 0) + region, [os.dup(fe.memory.fd)], \
                False
        if kind == 6:  # more memory, then maybe less again
            gpa = (1 << 32) + rng.randrange(16) * (1 << 24)
            fd = self._memfd(1 << 20)
            return Request.ADD_MEM_REG, ack, protocol.U64.pack(0) + protocol.MEMORY_REGION.pack(
                gpa, 1 << 20, USER_BASE + gpa, 0), [fd], False
        if kind == 7:
            gpa = (1 << 32) + rng.randrange(16) * (1 << 24)
            return Request.REM_MEM_REG, ack, protocol.U64.pack(0) + protocol.MEMORY_REGION.pack(
                gpa, 1 << 20, USER_BASE + gpa, 0), [], False
        if kind == 8:  # a new call eventfd for a queue (ours stays where we wait: only kicks matter to us)
            index = rng.randrange(3)
            return Request.SET_VRING_CALL, ack, protocol.U64.pack(index), [os.dup(fe.queues[index].call)], False
        if kind == 9:
            return Request.GET_MAX_MEM_SLOTS, V, b"", [], False
        if kind == 10:  # a memory table with a region that does not fit its memfd, overlaps, wraps, is empty
            regions = [protocol.MEMORY_REGION.pack(rng.choice([0, 1 << 20, 2**64 - PAGE]),
                                                   rng.choice([0, PAGE, 1 << 20, size, 2 * size]),
                                                   rng.choice([USER_BASE, 2**64 - PAGE]),
                                                   rng.choice([0, PAGE, 7, size])) for _ in range(rng.randrange(1, 4))]
            fds = [self._memfd(rng.choice([PAGE, 1 << 20])) for _ in regions]
            return Request.SET_MEM_TABLE, ack, protocol.MEMORY_HEADER.pack(len(regions), 0) + b"".join(regions), \
                fds, True
        if kind == 11:  # ring addresses anywhere, sizes anything: libvhost-user's checks
            index = rng.randrange(3)
            s.broken = True
            if rng.randrange(2):
                return Request.SET_VRING_NUM, ack, protocol.VRING_STATE.pack(index, rng.choice(
                    [0, 1, 3, 64, 1024, 32768, 65535])), [], False
            far = USER_BASE + rng.choice([0, size - 8, size, 2**40])
            return Request.SET_VRING_ADDR, ack, struct.pack("<IIQQQQ", index, 0, far, far, far, 0), [], False
        if kind == 12:
            s.broken = True
            return Request.SET_VRING_ENABLE, ack, protocol.VRING_STATE.pack(rng.randrange(3), rng.randrange(2)), \
                [], False
        if kind == 13:  # all of its RAM taken away (its queues with it: libvhost-user unmaps their rings)
            s.broken = True
            return Request.REM_MEM_REG, ack, protocol.U64.pack(0) + protocol.MEMORY_REGION.pack(
                0, size, USER_BASE, 0), [os.dup(fe.memory.fd)] if rng.randrange(2) else [], False
        if kind == 14:  # a queue stopped (all of them stopped: a stop, the device suspended with all it holds)
            s.broken = True
            return Request.GET_VRING_BASE, V, protocol.VRING_STATE.pack(rng.randrange(3), 0), [], False
        if kind == 15:  # a device reset in the middle of its traffic (and of its peers' traffic into it)
            s.broken = True
            return Request.RESET_DEVICE, V, b"", [], False
        # Malformed: the connection ends.
        request = rng.choice([int(r) for r in Request] + [0x7FFF, rng.getrandbits(32)])
        flags = rng.choice([0, 3, V | protocol.FLAG_REPLY, V | 0x100, V])
        payload = rng.randbytes(rng.randrange(300))
        fds = [self._memfd(PAGE) for _ in range(rng.choice([0, 0, 1, 9]))]
        return request, flags, payload, fds, True

    def messages(self, s: AttackerState) -> None:
        rng = self.rng
        sent: list[dict[str, Any]] = []
        self.record.append({"messages": sent})
        for _ in range(rng.randrange(1, 9)):
            request, flags, payload, fds, fatal = self._message(s)
            sent.append({"request": int(request), "flags": flags, "payload": payload.hex(), "fds": len(fds)})
            header = protocol.HEADER.pack(request, flags, len(payload))
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
            try:
                s.fe.sock.sendmsg([header + payload], ancillary)
            except OSError:
                s.broken = True  # the backend already closed the connection
                return
            finally:
                for fd in fds:
                    os.close(fd)
            self.counts.messages += 1
            if fatal:
                s.broken = True
                return
        self._drain_replies(s)

    def _drain_replies(self, s: AttackerState) -> None:
        """Read whatever replies came (nothing waits for them: they only must not fill the socket)."""
        s.fe.sock.setblocking(False)
        try:
            while s.fe.sock.recv(65536):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            s.broken = True
        finally:
            s.fe.sock.setblocking(True)
            s.fe.sock.settimeout(VICTIM_TIMEOUT)


