"""Containers on the backend's device (docs/containers.md): a host process on the container channel, played by
vrdma.testing.container_client, moves data to and from a simulated VM and another container through the engine,
is kept to its own objects and memory, and leaves nothing behind however it goes."""

from __future__ import annotations

import array
import fcntl
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backend_process import GID, BackendProcess, SimSide, start_side, wait_cqes
from polling import wait_until

from vrdma.channel import wire
from vrdma.channel.wire import MessageType
from vrdma.device import abi
from vrdma.testing.container_client import ContainerProcess
from vrdma.testing.simulated_guest import CommandError

pytestmark = pytest.mark.backend

WR_WRITE, WR_SEND = abi.const("VRDMA_WR_RDMA_WRITE"), abi.const("VRDMA_WR_SEND")
SUCCESS = abi.const("VRDMA_WC_SUCCESS")
ADDRESS = {"c0": "169.254.100.11", "c1": "169.254.100.12"}
CGID = {name: bytes.fromhex("00000000000000000000ffff") + bytes(int(x) for x in ip.split("."))
        for name, ip in ADDRESS.items()}
INVALID = abi.const("VRDMA_STATUS_INVALID")


def add_container(backend: BackendProcess, name: str, **fields: Any) -> Path:
    path = backend.directory / f"{name}.sock"
    reply = backend.admin_ask("container-add", name=name, address=ADDRESS[name], **{"socket-path": str(path)},
                              **fields)
    assert reply["ok"], reply
    return path


def container_side(process: ContainerProcess, mr_size: int = 64 << 10) -> SimSide:
    verbs = process.verbs
    pd = verbs.alloc_pd()
    cq = verbs.create_cq(64)
    qp = verbs.create_qp(pd, cq, cq)
    return SimSide(verbs, pd, cq, qp, verbs.reg_mr(pd, mr_size))


def processes(backend: BackendProcess, name: str) -> list[dict[str, Any]]:
    reply = backend.admin_ask("container-list")
    assert reply["ok"], reply
    (container,) = [c for c in reply["containers"] if c["name"] == name]
    return container["processes"]  # type: ignore[no-any-return]


@pytest.fixture
def c0(backend: BackendProcess) -> Iterator[ContainerProcess]:
    with ContainerProcess(add_container(backend, "c0")) as process:
        yield process


def write_and_check(src: SimSide, dst: SimSide, dst_gid: bytes, src_gid: bytes, size: int = 40000) -> None:
    payload = os.urandom(size)
    src.verbs.memory.write(src.mr.addr, payload)
    src.verbs.post_send(src.qp, WR_WRITE, [(src.mr.addr, size, src.mr.lkey)], wr_id=11, remote_addr=dst.mr.addr,
                        rkey=dst.mr.rkey)
    (done,) = wait_cqes(src.verbs, src.cq, 1)
    assert done.status == SUCCESS, done
    assert dst.verbs.memory.read(dst.mr.addr, size) == payload


def test_a_container_and_a_vm_write_into_each_other(backend: BackendProcess, c0: ContainerProcess) -> None:
    with backend.frontend("vm0") as fe:
        vm = start_side(fe, backend, "vm0", GID["vm0"], 64 << 10)
        box = container_side(c0)
        vm.verbs.connect(vm.qp, box.qp.qpn, CGID["c0"])
        box.verbs.connect(box.qp, vm.qp.qpn, GID["vm0"])
        write_and_check(box, vm, GID["vm0"], CGID["c0"])
        write_and_check(vm, box, CGID["c0"], GID["vm0"])
        # A SEND from the VM lands in the container's posted receive.
        box.verbs.post_recv(box.qp, [(box.mr.addr, 4096, box.mr.lkey)], wr_id=5)
        vm.verbs.memory.write(vm.mr.addr, b"hello, container")
        vm.verbs.post_send(vm.qp, WR_SEND, [(vm.mr.addr, 16, vm.mr.lkey)], wr_id=6)
        (received,) = wait_cqes(box.verbs, box.cq, 1)
        assert (received.status, received.wr_id, received.byte_len) == (SUCCESS, 5, 16)
        assert box.verbs.memory.read(box.mr.addr, 16) == b"hello, container"
    assert processes(backend, "c0")[0]["objects"] == {"pd": 1, "mr": 1, "mw": 0, "cq": 1, "srq": 0, "qp": 1, "ah": 0}


def test_two_containers_write_into_each_other(backend: BackendProcess, c0: ContainerProcess) -> None:
    with ContainerProcess(add_container(backend, "c1")) as c1:
        a, b = container_side(c0), container_side(c1)
        a.verbs.connect(a.qp, b.qp.qpn, CGID["c1"])
        b.verbs.connect(b.qp, a.qp.qpn, CGID["c0"])
        write_and_check(a, b, CGID["c1"], CGID["c0"], size=1 << 16)
        write_and_check(b, a, CGID["c0"], CGID["c1"], size=1 << 16)


def test_a_process_names_only_its_own_objects_and_memory(backend: BackendProcess, c0: ContainerProcess) -> None:
    """Two processes of one container: the second can neither use nor free the first's objects, nor register the
    first's memory; what a kernel alone makes or changes is refused; the first's objects work on."""
    first = container_side(c0)
    with ContainerProcess(backend.directory / "c0.sock") as other:
        verbs = other.verbs
        mine = verbs.alloc_pd()
        refused = {
            "a QP on the first's PD and CQ": lambda: verbs.create_qp(first.pd, first.cq, first.cq),
            "an MR on the first's PD": lambda: verbs.reg_mr(first.pd, 4096),
            "freeing the first's QP": lambda: verbs.call("VRDMA_CMD_DESTROY_QP", "vrdma_cmd_destroy",
                                                         "vrdma_resp_hdr", handle=first.qp.handle),
            "moving the first's QP": lambda: verbs.modify_qp(first.qp, abi.const("VRDMA_QP_STATE"), qp_state=6),
            "a PD of the first's context": lambda: verbs.call("VRDMA_CMD_ALLOC_PD", "vrdma_cmd_alloc_pd",
                                                              "vrdma_resp_alloc_pd", ucontext=c0.verbs.ucontext),
            "the first's memory in its own MR": lambda: verbs.reg_mr(mine, first.mr.buf.size, buf=first.mr.buf),
            "a user context": lambda: verbs.call("VRDMA_CMD_ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext",
                                                 "vrdma_resp_alloc_ucontext"),
            "a GID": lambda: verbs.add_gid(1, bytes(16)),
            "a fast-registration MR": lambda: verbs.alloc_mr(mine, 4),
        }
        for what, attempt in refused.items():
            with pytest.raises(CommandError) as err:
                attempt()
            assert err.value.status == INVALID, what
        second = container_side(other)
        first.verbs.connect(first.qp, second.qp.qpn, CGID["c0"])
        second.verbs.connect(second.qp, first.qp.qpn, CGID["c0"])
        write_and_check(first, second, CGID["c0"], CGID["c0"])
    log = backend.log_text()
    assert "pd 1 is no pd of the process's" in log or "is no pd of the process's" in log, log[-3000:]
    assert "is not a page of guest RAM" in log, log[-3000:]


def _killed_process_script(socket_path: Path) -> str:
    return textwrap.dedent(f"""
        import sys, time
        from vrdma.testing.container_client import ContainerProcess
        process = ContainerProcess({str(socket_path)!r})
        v = process.verbs
        pd = v.alloc_pd()
        cq = v.create_cq(64)
        qps = [v.create_qp(pd, cq, cq) for _ in range(4)]
        mrs = [v.reg_mr(pd, 1 << 16) for _ in range(3)]
        print("ready", flush=True)
        time.sleep(600)
    """)


def test_kill_9_of_a_process_frees_everything_it_made(backend: BackendProcess, c0: ContainerProcess) -> None:
    survivor = container_side(c0)
    path = backend.directory / "c0.sock"
    child = subprocess.Popen([sys.executable, "-c", _killed_process_script(path)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        (victim,) = [p for p in processes(backend, "c0") if p["pid"] == child.pid]
        assert victim["objects"]["qp"] == 4 and victim["objects"]["mr"] == 3 and victim["regions"] == 1
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    wait_until("the killed process's objects freed within a second",
               lambda: [p["pid"] for p in processes(backend, "c0")] == [os.getpid()], timeout=1.0, interval=0.02)
    # The device holds the survivor's objects and nothing of the killed process's (its context, 4 QPs, 3 MRs...).
    objects = counters_of(backend, "c0")["objects"]
    assert objects == {"gid": 1, "ucontext": 1, "pd": 1, "mr": 1, "cq": 1, "xrcd": 0, "srq": 0, "qp": 1, "ah": 0}, \
        objects
    # The survivor's objects work on.
    survivor.verbs.connect(survivor.qp, survivor.qp.qpn, CGID["c0"])
    write_and_check(survivor, survivor, CGID["c0"], CGID["c0"], size=4096)


def test_container_admin_refusals(backend: BackendProcess) -> None:
    path = str(backend.directory / "cx.sock")
    for fields, error in [
        ({"name": "c0", "socket-path": path, "address": "not-an-ip"}, "must be an IP address"),
        ({"name": "c0", "socket-path": path, "address": "0.0.0.0"}, "cannot name a device"),
        ({"name": "c0", "socket-path": "relative.sock", "address": "10.1.1.1"}, "must be an absolute path"),
        ({"name": "c0", "socket-path": path, "address": "10.1.1.1", "max-processes": 0}, "max-processes"),
        ({"name": "vm0", "socket-path": path, "address": "10.1.1.1"}, "already served"),
        ({"name": "c0", "socket-path": path, "address": "10.1.1.1", "bogus": 1}, "bogus"),
    ]:
        reply = backend.admin_ask("container-add", **fields)
        assert not reply["ok"] and error in reply["error"], (fields, reply)
    assert backend.admin_ask("container-list") == {"ok": True, "containers": []}
    assert "no container named" in backend.admin_ask("container-remove", name="c9")["error"]


def test_a_removed_container_closes_its_processes(backend: BackendProcess, c0: ContainerProcess) -> None:
    container_side(c0)
    assert backend.admin_ask("container-remove", name="c0")["ok"]
    assert not (backend.directory / "c0.sock").exists()
    with pytest.raises(Exception, match="closed the channel"):
        c0.receive()


# -- malformed input, one family of messages at a time: each refused with a status, or the connection closed, and
#    the container's other process (``c0``) goes on working -------------------------------------------------------

def _header(kind: int, seq: int = 1, status: int = 0) -> bytes:
    return wire.api.to_bytes(wire.api.new("vrdma_chan_hdr", type=kind, seq=seq, status=status))


def _status(answer: bytes) -> int:
    return int(wire.api.from_bytes("vrdma_chan_hdr", answer[:wire.HEADER_SIZE]).status)


def _raw(backend: BackendProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(10)
    sock.connect(str(backend.directory / "c0.sock"))
    return sock


def _closed(sock: socket.socket) -> bool:
    return sock.recv(wire.MAX_MESSAGE) == b""


def _still_works(c0: ContainerProcess) -> None:
    side = container_side(c0, mr_size=4096)
    side.verbs.connect(side.qp, side.qp.qpn, CGID["c0"])
    write_and_check(side, side, CGID["c0"], CGID["c0"], size=1024)


def test_malformed_framing_closes_only_that_connection(backend: BackendProcess, c0: ContainerProcess) -> None:
    hello = wire.api.to_bytes(wire.api.new("vrdma_chan_hello", version=wire.VERSION))
    for what, message, fds in [
        ("an empty message", b"", 0),
        ("a short header", b"\x01\x00\x00", 0),
        ("a message before HELLO", _header(MessageType.COMMAND), 0),
        ("a message longer than the longest", hello + bytes(wire.MAX_MESSAGE), 0),
        ("more descriptors than a message carries", hello, 3),
    ]:
        with _raw(backend) as sock:
            extra = [os.open("/dev/null", os.O_RDONLY) for _ in range(fds)]
            try:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", extra).tobytes())] if extra else []
                sock.sendmsg([message], ancillary)
            finally:
                for fd in extra:
                    os.close(fd)
            if message == b"":  # (an empty packet is the peer's end, as a stream's EOF is)
                sock.shutdown(socket.SHUT_WR)
            assert _closed(sock), what
    _still_works(c0)
    assert [p["pid"] for p in processes(backend, "c0")] == [os.getpid()]


def test_malformed_hello_add_and_remove_are_refused_with_a_status(backend: BackendProcess,
                                                                  c0: ContainerProcess) -> None:
    with _raw(backend) as sock:
        def ask(body: bytes, kind: int, fds: list[int] | None = None) -> tuple[int, list[int]]:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
            sock.sendmsg([_header(kind) + body], ancillary)
            data, anc, _, _ = sock.recvmsg(wire.MAX_MESSAGE, socket.CMSG_SPACE(16))
            got = array.array("i")
            for _, _, payload in anc:
                got.frombytes(payload[:len(payload) - len(payload) % 4])
            return _status(data), list(got)

        def hello(version: int, reserved: int = 0) -> bytes:
            return wire.api.to_bytes(wire.api.new("vrdma_chan_hello", version=version, reserved=reserved))[8:]

        assert ask(hello(wire.VERSION + 1), MessageType.HELLO)[0] == wire.Status.INVALID
        assert ask(hello(wire.VERSION, reserved=1), MessageType.HELLO)[0] == wire.Status.INVALID
        assert ask(hello(wire.VERSION) + b"x", MessageType.HELLO)[0] == wire.Status.BAD_LENGTH
        status, fds = ask(hello(wire.VERSION), MessageType.HELLO)
        assert status == wire.Status.OK and len(fds) == 2
        for fd in fds:
            os.close(fd)
        assert ask(hello(wire.VERSION), MessageType.HELLO)[0] == wire.Status.INVALID  # a second HELLO
        assert ask(b"", 99)[0] == wire.Status.NOT_SUPPORTED
        assert ask(b"", MessageType.EVENT)[0] == wire.Status.NOT_SUPPORTED  # the device's to send, not to take

        def add(size: int) -> bytes:
            return size.to_bytes(8, "little")

        unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC)
        os.ftruncate(unsealed, 1 << 16)
        sealed = os.memfd_create("sealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(sealed, 1 << 16)
        fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        null = os.open("/dev/null", os.O_RDWR)
        try:
            for what, body, fds, status in [
                ("no descriptor", add(4096), [], wire.Status.INVALID),
                ("two descriptors", add(4096), [sealed, sealed], wire.Status.INVALID),
                ("no memfd", add(4096), [null], wire.Status.INVALID),
                ("a memfd that may shrink", add(4096), [unsealed], wire.Status.INVALID),
                ("more than the memfd holds", add(1 << 17), [sealed], wire.Status.INVALID),
                ("not whole pages", add(100), [sealed], wire.Status.INVALID),
                ("no bytes", add(0), [sealed], wire.Status.INVALID),
                ("a short message", add(4096)[:4], [sealed], wire.Status.BAD_LENGTH),
            ]:
                assert ask(body, MessageType.ADD_MEMORY, fds)[0] == status, what
            assert ask(add(1 << 16), MessageType.ADD_MEMORY, [sealed])[0] == wire.Status.OK
            assert ask((1 << 63).to_bytes(8, "little"), MessageType.REMOVE_MEMORY)[0] == wire.Status.INVALID
            assert ask(b"", MessageType.REMOVE_MEMORY)[0] == wire.Status.BAD_LENGTH
        finally:
            for fd in (unsealed, sealed, null):
                os.close(fd)
    _still_works(c0)


def test_malformed_commands_get_the_devices_statuses(backend: BackendProcess, c0: ContainerProcess) -> None:
    def command(raw: bytes) -> int:
        answer, _ = c0.exchange(MessageType.COMMAND, raw)
        response = answer[wire.HEADER_SIZE:]
        assert _status(answer) == wire.Status.OK  # (the channel took it: the device answers)
        return int(abi.from_bytes("vrdma_resp_hdr", response[:abi.sizeof("vrdma_resp_hdr")]).status)

    query = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE")}))
    assert command(query) == abi.const("VRDMA_STATUS_OK")
    assert command(b"") == abi.const("VRDMA_STATUS_BAD_LENGTH")
    assert command(query + b"\0") == abi.const("VRDMA_STATUS_BAD_LENGTH")
    assert command(b"\xff\x7f" + query[2:]) == abi.const("VRDMA_STATUS_NOT_SUPPORTED")
    assert command(bytes(600)) == abi.const("VRDMA_STATUS_NOT_SUPPORTED")
    _still_works(c0)


def test_vrdma_admin_container_commands(backend: BackendProcess) -> None:
    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vrdma.cli", "admin", "--admin-socket", str(backend.admin),
                               "container", *args], cwd=backend.directory, capture_output=True, text=True,
                              timeout=60, check=False)

    added = admin("add", "c0", "--socket-path", "c0.sock", "--address", ADDRESS["c0"], "--max-processes", "2",
                  "--bytes-per-s", "1G")
    assert added.returncode == 0 and "c0: listening on" in added.stdout, added
    with ContainerProcess(backend.directory / "c0.sock"):
        listed = admin("list")
        assert listed.returncode == 0 and f"c0  {ADDRESS['c0']}  1/2" in listed.stdout, listed
    refused = admin("add", "c1", "--socket-path", "c0.sock", "--address", ADDRESS["c1"])
    assert refused.returncode == 1 and "the backend refused" in refused.stderr, refused
    assert admin("remove", "c0").stdout.strip() == "c0: removed"
    assert "no containers are served" in admin("list").stdout


def test_a_cqs_events_go_into_its_completion_channels_pipe(backend: BackendProcess, c0: ContainerProcess) -> None:
    """CQ_NOTIFY: an armed CQ's completion event is written into the pipe the process gave (what libvrdma-compchan
    makes a completion channel of) as its 8-byte cookie, where ibv_get_cq_event reads it; a CQ of another process,
    a pipe's read end, no pipe at all are refused."""
    box = container_side(c0)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        c0.request("vrdma_chan_cq_notify", MessageType.CQ_NOTIFY, fds=[write_end], cq=box.cq.handle,
                   cookie=0x7F00C0FFEE00)
        os.close(write_end)  # (the backend holds its own)
        box.verbs.connect(box.qp, box.qp.qpn, CGID["c0"])
        box.verbs.arm_cq(box.cq)
        box.verbs.post_recv(box.qp, [(box.mr.addr + 4096, 64, box.mr.lkey)], wr_id=1)
        box.verbs.post_send(box.qp, WR_SEND, [(box.mr.addr, 64, box.mr.lkey)], wr_id=2)
        wait_cqes(box.verbs, box.cq, 2)
        ready, _, _ = select.select([read_end], [], [], 10)
        assert ready, "no completion event in the pipe"
        assert os.read(read_end, 64) == (0x7F00C0FFEE00).to_bytes(8, "little")
        with ContainerProcess(backend.directory / "c0.sock") as other:
            r2, w2 = os.pipe2(os.O_CLOEXEC)
            try:
                # another process's CQ, a pipe's read end, no descriptor at all
                for fds, cq in (([w2], box.cq.handle), ([r2], None), ([], None)):
                    mine = other.verbs.create_cq(8).handle
                    with pytest.raises(Exception, match="status"):
                        other.request("vrdma_chan_cq_notify", MessageType.CQ_NOTIFY, fds=fds,
                                      cq=cq if cq is not None else mine, cookie=1)
            finally:
                os.close(r2)
                os.close(w2)
    finally:
        os.close(read_end)
    assert counters_of(backend, "c0")["channel"]["cq_events_dropped"] == 0


def counters_of(backend: BackendProcess, name: str) -> dict[str, Any]:
    reply = backend.admin_ask("counters")
    assert reply["ok"], reply
    return reply["containers"][name]  # type: ignore[no-any-return]
