"""The `vrdma backend` process as the backend tests run it, and the command every test ends with.

With VRDMA_SANITIZE=1 the backend runs with the ASan/UBSan build of its C (fuzz/sanitize.py: the data engine,
libvhost-user and its glue, the fault guard), and a test whose backend wrote a sanitizer report fails.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from vrdma.device import abi
from vrdma.harness.daemon import DaemonProcess, DaemonStartError, DaemonStopError, Served
from vrdma.harness.hosts import Host
from vrdma.testing.frontend import Frontend
from vrdma.testing.simulated_guest import SimCq, SimMr, SimQp, SimVerbs

SANITIZE = os.environ.get("VRDMA_SANITIZE") == "1"
ROOT = Path(__file__).resolve().parents[1]


def _sanitized_launch() -> tuple[list[str], dict[str, str]]:
    """The command prefix and environment of a backend with the sanitizer build (built first if stale)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # fuzz/ lives in the checkout, beside the tests
    from fuzz import sanitize

    sanitize.build()
    # No quarantine of freed memory: tests bound the backend's RSS growth to a MiB, and ASan's quarantine (256 MiB
    # by default) is all they would measure.
    return sanitize.backend_command(), sanitize.environment(quarantine_mb=0)


def sanitizer_report(text: str) -> bool:
    if not SANITIZE:
        return False
    from fuzz import sanitize

    return sanitize.report_in(text)


# The GIDs of the simulated VMs (vm0 ... vm3): IPv4-mapped 169.254.100.<n>.
GID = {f"vm{i}": bytes.fromhex(f"00000000000000000000ffffa9fe64{i + 1:02x}") for i in range(4)}


class BackendProcess:
    """`vrdma backend` serving vm0 and vm1, started and stopped by a test (through the harness's one launcher,
    vrdma.harness.daemon)."""

    # Every backend a test session started (the sanitizer tier reads their logs after each test).
    started: ClassVar[weakref.WeakSet[BackendProcess]] = weakref.WeakSet()

    def __init__(self, directory: Path, names: tuple[str, ...] = ("vm0", "vm1"), test_hooks: bool = False,
                 host: Host | None = None, options: list[str] | None = None) -> None:
        """``host``: run it in that host's network namespace, speaking RoCE v2 to the others (`--roce`);
        ``options``: further `vrdma backend` options (``--max-vms``, ``--config``)."""
        self.directory = directory
        self.sockets = {name: directory / f"{name}.sock" for name in names}
        self.log = directory / "backend.log"
        self.admin = directory / "admin.sock"
        launcher, env = _sanitized_launch() if SANITIZE else (None, None)
        if host is not None:
            launcher = host.command(launcher or [sys.executable, "-m", "vrdma.cli"])
        vms = [Served(name, path, "52:54:00:76:72:00" if name == "vm0" else None)
               for name, path in self.sockets.items()]
        self.daemon = DaemonProcess(vms, log_file=self.log, admin_socket=self.admin, test_hooks=test_hooks,
                                    verbose=True, launcher=launcher, env=env, roce=host is not None,
                                    options=options)
        self.log.unlink(missing_ok=True)  # a backend restarted in the same directory writes a log of its own
        try:
            self.daemon.start()
        except DaemonStartError as err:
            raise AssertionError(f"backend did not start: {err}") from None
        assert self.daemon.popen is not None
        self.proc = self.daemon.popen
        if SANITIZE:
            # The launcher says which modules it loaded: the tier must not quietly run the normal build.
            assert self.log_text().count("sanitizer build: loaded") == 3, self.log_text()
        BackendProcess.started.add(self)

    def frontend(self, name: str) -> Frontend:
        return Frontend(str(self.sockets[name]))

    def upgrade(self) -> dict[str, Any]:
        """`vrdma admin upgrade`: a new backend process takes every VM over; this handle follows it (it is not this
        test's child: its exit status is not ours to read, only whether it runs)."""
        status = self.daemon.upgrade()
        self.proc = _Follower(self.daemon)  # type: ignore[assignment]
        return status

    def admin_ask(self, command: str, **fields: Any) -> dict[str, Any]:
        """One admin request; the reply as it came (``ok`` false with ``error`` when refused)."""
        from vrdma.daemon.admin import ask

        return ask(self.admin, {"command": command, **fields})

    def add_vm(self, name: str, **fields: Any) -> dict[str, Any]:
        """Serve one more VM (vm-add), its socket in the test's directory; the backend's description of it."""
        path = self.directory / f"{name}.sock"
        reply = self.admin_ask("vm-add", name=name, **{"socket-path": str(path), **fields})
        assert reply["ok"], reply
        self.sockets[name] = path
        return reply["vm"]  # type: ignore[no-any-return]

    def remove_vm(self, name: str) -> None:
        reply = self.admin_ask("vm-remove", name=name)
        assert reply["ok"], reply
        self.sockets.pop(name, None)

    def stop(self) -> int:
        try:
            status = self.daemon.terminate(30 if SANITIZE else 10)
        except DaemonStopError as err:
            # A backend stuck in C never runs its SIGTERM handler: it was killed rather than left spinning after
            # the tests (a test that hung it fails here instead), with its stacks and fds in the message.
            raise AssertionError(str(err)) from None
        self.check_sanitizer()
        return status if status is not None else self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def check_sanitizer(self) -> None:
        """Fail if the backend (sanitizer build) reported anything: once, in the test that was running then (a
        module's backend outlives that test; its log still holds the report for the tests after it)."""
        if getattr(self, "_reported", False) or not self.log.exists():
            return
        if sanitizer_report(text := self.log_text()):
            self._reported = True
            raise AssertionError(f"sanitizer report in the backend log {self.log}:\n{text[-20000:]}")

    def counters(self, vm: str = "vm0") -> dict[str, Any]:
        from vrdma.daemon.admin import ask

        return ask(self.admin, {"command": "counters"})["vms"][vm]  # type: ignore[no-any-return]

    def network_counters(self) -> dict[str, int]:
        """What arrived from the network that no QP took, and what went out (a backend with `--roce`)."""
        from vrdma.daemon.admin import ask

        return ask(self.admin, {"command": "counters"})["network"]  # type: ignore[no-any-return]

    def connection(self, vm: str = "vm0") -> dict[str, Any]:
        """The VM's connection counters (accepted, closed, protocol_errors, memory_faults, ...)."""
        return self.counters(vm)["connection"]  # type: ignore[no-any-return]

    def wait_for_counters(self, vm: str, holds: Callable[[dict[str, Any]], bool], what: str,
                          timeout: float = 10.0) -> dict[str, Any]:
        """Wait until the VM's counters satisfy ``holds`` (the backend acts on a message after the frontend sent
        it); return them. A deadline, not a sleep: the counters are read again every 10 ms until it passes."""
        deadline = time.monotonic() + timeout
        while True:
            counters = self.counters(vm)
            if holds(counters):
                return counters
            assert self.proc.poll() is None, f"the backend died:\n{self.log_text()}"
            assert time.monotonic() < deadline, f"{vm}: {what} did not happen within {timeout} s: {counters}"
            time.sleep(0.01)

    def wait_for_closed(self, vm: str, count: int, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until the backend has closed ``count`` of the VM's connections in all; return the counters."""
        return self.wait_for_counters(vm, lambda c: c["connection"]["closed"] >= count,  # type: ignore[no-any-return]
                                      f"{count} closed connections", timeout)["connection"]


class _Follower:
    """poll() and returncode of a backend this test did not start (one an upgrade started)."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon

    def poll(self) -> int | None:
        return None if self.daemon.running else 0

    @property
    def returncode(self) -> int | None:
        return self.poll()


def expect_closed(fe: Frontend, timeout: float = 10.0, replies_first: bool = False) -> None:
    """The backend dropped this VM's connection. ``replies_first``: replies it sent before that are read and
    dropped (a few socket buffers' worth at most); otherwise the first thing read must be the end."""
    fe.sock.settimeout(timeout)
    try:
        for _ in range(64 if replies_first else 1):
            data = fe.sock.recv(4096)
            if not data:
                return
    except ConnectionResetError:
        return
    raise AssertionError(f"expected the connection to close, got {data!r}")


def query_device(fe: Frontend, seq: int = 1) -> object:
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE"),
                                                                  "seq": seq}))
    response = fe.command(request, abi.sizeof("vrdma_resp_query_device"))
    return abi.from_bytes("vrdma_resp_query_device", response)


@dataclass
class SimSide:
    """One simulated VM ready for RC traffic: its GID at index 0, a PD, a 64-entry CQ, an RC QP on it, one MR."""

    verbs: SimVerbs
    pd: int
    cq: SimCq
    qp: SimQp
    mr: SimMr


def start_side(fe: Frontend, backend: BackendProcess, name: str, gid: bytes, mr_size: int,
               qp_type: str = "RC", device_features: int = 0) -> SimSide:
    """A user context with its GID, a PD, a CQ, a QP of ``qp_type`` on it (an XRC initiator has no receive CQ)
    and an MR of ``mr_size`` bytes; the driver accepts ``device_features`` (VRDMA_F_* bits)."""
    fe.start(device_features=device_features)
    verbs = SimVerbs(fe, backend.directory / f"{name}.doorbell")
    verbs.add_gid(0, gid)
    pd = verbs.alloc_pd()
    cq = verbs.create_cq(64)
    qp = verbs.create_qp(pd, cq, None if qp_type == "XRC_INI" else cq, qp_type=qp_type)
    return SimSide(verbs, pd, cq, qp, verbs.reg_mr(pd, mr_size))


def connect_sides(a: SimSide, a_gid: bytes, b: SimSide, b_gid: bytes) -> None:
    """Move both QPs to RTS, each aimed at the other."""
    a.verbs.connect(a.qp, b.qp.qpn, b_gid)
    b.verbs.connect(b.qp, a.qp.qpn, a_gid)


SideT = TypeVar("SideT", bound=SimSide)


@contextmanager
def two_vms(backend: BackendProcess, make_side: Callable[[Frontend, BackendProcess, str], SideT],
            gids: dict[str, bytes], connect: bool = True) -> Iterator[tuple[SideT, SideT]]:
    """vm0 and vm1 on one backend, each a side made by ``make_side``; their QPs in RTS aimed at each other unless
    ``connect`` is False (a test that connects them with its own attributes)."""
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        a, b = make_side(fe0, backend, "vm0"), make_side(fe1, backend, "vm1")
        if connect:
            connect_sides(a, gids["vm0"], b, gids["vm1"])
        yield a, b


# -- a connected VM and the bystander: what the per-message and per-command tests share ----------------------------

PATTERN_SIZE = 16 << 10


def wait_cqes(verbs: SimVerbs, cq: SimCq, count: int, timeout: float = 10.0) -> list[Any]:
    """Exactly ``count`` completions from a CQ in simulated guest memory, polled until they arrived."""
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(found) < count:
        found += verbs.poll_cq(cq)
        assert time.monotonic() < deadline, f"{len(found)} of {count} completions arrived"
        time.sleep(0.001)  # the engine runs in the backend process: poll what it wrote
    assert len(found) == count, f"{len(found)} completions, expected {count}"
    return found


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled_fds(pid: int, expected: int | None = None, timeout: float = 5.0) -> int:
    """A backend's open fd count once the admin connection a counter query left behind has been closed: the lowest
    count seen over a few samples (or as soon as it reaches ``expected``). A leak never goes away."""
    deadline = time.monotonic() + timeout
    lowest, samples = open_fds(pid), 1
    while time.monotonic() < deadline and (lowest != expected if expected is not None else samples < 20):
        time.sleep(0.01)  # sampling a count another process changes, not waiting for readiness
        lowest, samples = min(lowest, open_fds(pid)), samples + 1
    return lowest


def pattern(size: int) -> bytes:
    block = hashlib.sha256(b"bystander").digest()
    return (block * (size // len(block) + 1))[:size]


@dataclass
class Vm:
    name: str
    fe: Frontend
    verbs: SimVerbs
    log: Path | None = field(default=None, kw_only=True)  # its backend's log (why the device refused a command)

    def call(self, name: str, request: str, response: str = "vrdma_resp_hdr", **fields: Any) -> Any:
        return self.verbs.call(f"VRDMA_CMD_{name}", request, response, **fields)


@dataclass
class Bystander(Vm):
    """A VM beside the ones a test misbehaves with, the one mechanism the backend tests use: a context with its GID,
    a PD, a CQ, an RC QP connected to itself and an MR holding a pattern. check() proves nothing of it changed and
    it is still served: its device answers, keeps exactly its objects (``objects``: a test that gives it more says
    so) and its connection, its engine counters are what they were, its MR holds the pattern, and a SEND to itself
    arrives."""

    backend: BackendProcess | None = field(default=None, kw_only=True)
    side: SimSide | None = field(default=None, kw_only=True)
    mr: SimMr | None = field(default=None, kw_only=True)
    objects: dict[str, int] | None = field(default=None, kw_only=True)
    before: dict[str, Any] | None = field(default=None, kw_only=True)

    @classmethod
    def beside(cls, backend: BackendProcess, fe: Frontend, name: str) -> Bystander:
        """``name`` made a bystander (its frontend started if it was not); its counters taken now."""
        if not fe.queues:
            fe.start()
        verbs = SimVerbs(fe, backend.directory / f"{name}.doorbell")
        verbs.add_gid(0, GID[name])
        pd = verbs.alloc_pd()
        cq = verbs.create_cq(16)
        qp = verbs.create_qp(pd, cq, cq)
        verbs.connect(qp, qp.qpn, GID[name])
        mr = verbs.reg_mr(pd, PATTERN_SIZE)
        verbs.memory.write(mr.addr, pattern(PATTERN_SIZE))
        before = backend.counters(name)
        return cls(name, fe, verbs, log=backend.log, backend=backend, side=SimSide(verbs, pd, cq, qp, mr), mr=mr,
                   objects=dict(before["objects"]), before=before)

    def check(self) -> None:
        assert self.backend is not None and self.side is not None and self.before is not None
        assert query_device(self.fe).hdr.status == 0, f"{self.name}'s device does not answer"
        after = self.backend.counters(self.name)
        assert after["objects"] == self.objects, (after["objects"], self.objects)
        assert after["engine"] == self.before["engine"], (after["engine"], self.before["engine"])
        assert after["connection"]["closed"] == self.before["connection"]["closed"], "its connection was closed"
        side, verbs = self.side, self.verbs
        assert verbs.memory.read(side.mr.addr, PATTERN_SIZE) == pattern(PATTERN_SIZE), "its memory was written"
        verbs.post_recv(side.qp, [(side.mr.addr + 2048, 64, side.mr.lkey)], wr_id=4)
        verbs.post_send(side.qp, abi.const("VRDMA_WR_SEND"), [(side.mr.addr, 10, side.mr.lkey)])
        assert [c.status for c in wait_cqes(verbs, side.cq, 2)] == [abi.const("VRDMA_WC_SUCCESS")] * 2
        assert verbs.memory.read(side.mr.addr + 2048, 10) == pattern(10)
        verbs.memory.write(side.mr.addr, pattern(PATTERN_SIZE))  # as it was, for another check
        self.before = self.backend.counters(self.name)


def connected_vm(backend: BackendProcess, name: str) -> Iterator[Vm]:
    """``name`` connected and started, with one user context; on the way out, waits until the backend has let go
    of the connection (and so forgotten its objects)."""
    closed = backend.connection(name)["closed"]
    with backend.frontend(name) as fe:
        fe.start()
        yield Vm(name, fe, SimVerbs(fe, backend.directory / f"{name}.doorbell"), log=backend.log)
    backend.wait_for_closed(name, closed + 1)


def backend_for_module(directory: Path) -> Iterator[BackendProcess]:
    """The body of a module-scoped backend fixture: one daemon a test module shares (each test connects its VMs
    afresh), stopped cleanly at the end or the module fails with its log."""
    process = BackendProcess(directory)
    yield process
    assert process.stop() == 0, process.log_text()
