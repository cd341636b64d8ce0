"""The backend process: one event loop serving one vhost-user device per VM.

Each VM has its own socket, its own RDMA device state and its own doorbell region. A listening socket takes one
frontend connection at a time (and a second, a migration's destination, while the first is open:
vrdma.daemon.endpoint); when that connection ends (or breaks), everything the VM owned is freed and the socket waits
for QEMU to reconnect. Nothing one VM sends can reach another VM's state.

VMs come and go while the backend runs (`add_vm`, `remove_vm`: the admin socket's vm-add and vm-remove): the
engine is made with a slot per VM it may ever serve at once (max_vms) and a VM takes a free one; adding or
removing a VM touches no other VM's device, objects or connection.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrdma.daemon import upgrade
from vrdma.daemon.admin import AdminCommand, AdminSocket
from vrdma.daemon.config import DEFAULT_MAX_VMS, ContainerSpec, EndpointSpec
from vrdma.daemon.container import ContainerEndpoint
from vrdma.daemon.endpoint import BackendError, VmEndpoint
from vrdma.daemon.notify import Notifier
from vrdma.daemon.roce import ROCE_PORT, RoceSockets, open_sockets
from vrdma.device import abi
from vrdma.device.fabric import Fabric
from vrdma.engine.api import EngineError
from vrdma.engine.native import Engine
from vrdma.faultguard import FaultGuard
from vrdma.loop import EventLoop

if TYPE_CHECKING:
    from vrdma.daemon.metrics import MetricsEndpoint, Snapshot
    from vrdma.daemon.upgrade import Upgrade

log = logging.getLogger(__name__)

MIGRATION_SLOTS = 2  # migrations between two QEMUs of this backend under way at once, at most


class Backend:
    """``with Backend(specs) as backend: backend.run()`` until SIGTERM/SIGINT or ``stop()``."""

    def __init__(self, specs: list[EndpointSpec], admin_socket: Path | None = None,
                 admin_extensions: dict[str, AdminCommand] | None = None, roce: bool = False,
                 max_vms: int = DEFAULT_MAX_VMS, doorbell_dir: Path | None = None,
                 metrics: str | None = None, engine_threads: int = 1, engine_cpus: list[int] | None = None,
                 take_over: int | None = None) -> None:
        """``admin_extensions``: commands the admin socket answers besides its own (test hooks); ``roce``: speak
        RoCE v2 to other hosts for destinations no VM here holds (vrdma.daemon.roce); ``max_vms``: how many VMs it
        may serve at once (``specs`` and those added later); ``doorbell_dir``: where the doorbell regions of VMs
        added through the admin socket without one go (default: beside their socket); ``metrics``: serve
        Prometheus metrics on this [HOST:]PORT (vrdma.daemon.metrics); ``engine_threads``: the engine's threads,
        pinned to ``engine_cpus`` (one CPU each) if given; ``take_over``: the socket to the backend this one takes
        every VM and the admin socket from (a backend upgrade: vrdma.daemon.upgrade; ``specs`` must be empty)."""
        if len(specs) > max_vms:
            raise BackendError(f"{len(specs)} VMs declared but --max-vms is {max_vms}")
        self.max_vms = max_vms
        self.doorbell_dir = doorbell_dir
        self.loop = EventLoop()
        self.guard: FaultGuard | None = FaultGuard(self.loop)
        # A slot per VM, and MIGRATION_SLOTS for the incoming devices of migrations between two QEMUs served here.
        self.engine = Engine(max_vms + MIGRATION_SLOTS)
        self.fabric = Fabric(self.engine, max_vms + MIGRATION_SLOTS)
        self._engine_events = -1
        self.endpoints: dict[str, VmEndpoint] = {}
        self.containers: dict[str, ContainerEndpoint] = {}  # they share the VMs' slots (--max-vms)
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.stopping = False
        # From here on, not only in run(): a SIGTERM between READY (or a take-over) and the loop's first turn must
        # stop the backend cleanly, not kill it with the default action.
        self._signals = self._take_signals()
        self.notifier = Notifier()  # systemd's, when it started us (Type=notify); otherwise silent
        self.admin: AdminSocket | None = None
        self.admin_path, self.admin_extensions = admin_socket, admin_extensions
        self.metrics: MetricsEndpoint | None = None
        self.metrics_address = metrics
        self.upgrade: Upgrade | None = None             # a hand-over to a new process under way
        self.last_upgrade: dict[str, Any] | None = None  # how the last one ended, when it failed
        self.roce: RoceSockets | None = None
        try:
            if roce:
                self.roce = open_sockets(rings=engine_threads)
                udp6 = self.roce.udp6.fileno() if self.roce.udp6 is not None else -1
                self.engine.attach_network([ring.fileno() for ring in self.roce.rx], self.roce.tx.fileno(),
                                           [ring.fileno() for ring in self.roce.rx6], udp6)
                log.info("RoCE v2 on UDP port %d: destinations no VM here holds are reached over the network",
                         ROCE_PORT)
            self._start_engine(engine_threads, engine_cpus)
            if take_over is not None:
                if specs:
                    raise BackendError("a backend taking over serves the VMs it is handed, no others")
                upgrade.take_over(self, take_over)  # (or this process ends, the one it took over from unharmed)
            for spec in specs:
                self.add_vm(spec)
            if admin_socket is not None and self.admin is None:
                self.open_admin()
            if take_over is None:
                self.restart_metrics()
        except BaseException:
            self.close()
            raise
        if take_over is not None:
            # After the VMs run again (their pause is no time for an HTTP server's start); every VM is this process's
            # now, so a port not free yet costs the metrics, not the VMs.
            try:
                self.restart_metrics()
            except BackendError as err:
                log.error("%s; the backend serves every VM, without metrics", err)
        self.loop.add_reader(self._stop_r, self._drain_stop)

    def open_admin(self, handed_over: socket.socket | None = None) -> None:
        """The admin socket listens (``handed_over``: listening already, a backend upgrade's)."""
        assert self.admin_path is not None
        try:
            self.admin = AdminSocket(self.admin_path, self.loop, self, self.admin_extensions,
                                     self.engine.net_counters if self.roce is not None else None, self.engine_threads,
                                     handed_over)
        except OSError as err:  # (an over-long path raises with no errno: its text says it)
            raise BackendError(f"cannot listen on admin socket {self.admin_path}: {err.strerror or err}") from err

    def restart_metrics(self) -> None:
        """--metrics listens, unless it does already (or was not asked for)."""
        if self.metrics is not None or self.metrics_address is None:
            return
        # Imported only when asked for: prometheus_client costs a backend's start tens of milliseconds.
        from vrdma.daemon.metrics import MetricsEndpoint

        try:
            self.metrics = MetricsEndpoint(self.metrics_address, self.loop, self.snapshot)
        except OSError as err:
            raise BackendError(f"--metrics {self.metrics_address}: {err.strerror}") from err

    # -- a backend upgrade (vrdma.daemon.upgrade) -----------------------------------------------------------------

    def begin_upgrade(self) -> dict[str, Any]:
        """Start the next backend process, which takes every VM over once it is ready: `vrdma admin upgrade`."""
        self.upgrade = upgrade.Upgrade(self)
        return {"pid": self.upgrade.process.pid}

    def status(self) -> dict[str, Any]:
        """Who answers, and how an upgrade goes (the admin socket's "status")."""
        return {"pid": os.getpid(), "serving": sorted(self.endpoints),
                "upgrade": self.upgrade.result if self.upgrade is not None else self.last_upgrade}

    # -- VMs, at start and at run time --------------------------------------------------------------------------

    def served(self) -> dict[str, VmEndpoint]:
        return dict(self.endpoints)

    def snapshot(self) -> Snapshot:
        """What the metrics report, taken now (on the loop's thread)."""
        from vrdma.daemon.metrics import Snapshot

        engine_seconds, engine_work = self.fabric.engine_time()
        return Snapshot(vms={name: vm.counters_snapshot() for name, vm in self.endpoints.items()},
                        network=self.engine.net_counters() if self.roce is not None else None,
                        vm_slots=self.max_vms, engine_seconds=engine_seconds, engine_work=engine_work,
                        engine_threads=self.engine_threads())

    def engine_threads(self) -> list[dict[str, int]]:
        """What each of the engine's threads did (api.THREAD_STATS), thread 0 first."""
        return [self.engine.thread_stats(thread) for thread in range(self.engine.threads)]

    def _start_engine(self, threads: int, cpus: list[int] | None) -> None:
        """The data path in the engine's threads (after the network is attached: they watch its sockets); the loop
        keeps the control path and delivers the events they report (docs/backend.md, "The engine's threads")."""
        if cpus is not None:
            allowed = os.sched_getaffinity(0)
            outside = [cpu for cpu in cpus if cpu not in allowed]
            if outside:
                raise BackendError(f"--engine-cpus: CPU(s) {', '.join(map(str, outside))} not among those this "
                                   f"process may run on ({_cpu_list(allowed)})")
        limits = self.fabric.limits
        try:
            self._engine_events = self.engine.start_threads(threads, limits.poll_budget,
                                                            limits.park_after_idle_us * 1000, cpus)
        except EngineError as err:
            raise BackendError(f"cannot start the engine's threads: {err}") from err
        self.fabric.engine_thread_started()
        self.loop.add_reader(self._engine_events, self._deliver_engine_events)
        log.debug("the engine runs in %d thread(s)%s", threads,
                 f" on CPU(s) {_cpu_list(cpus)}" if cpus else "")

    def _deliver_engine_events(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._engine_events)  # first: a notice written after the events are taken stays
        self.fabric.deliver_events()

    def add_vm(self, spec: EndpointSpec) -> VmEndpoint:
        """Serve one more VM: its socket listens (or its fd is served) when this returns. Refused, with the reason,
        when its name or socket is taken or every slot is; nothing else changes then."""
        if spec.name in self.endpoints:
            raise BackendError(f"a VM named {spec.name} is already served")
        for other in self.endpoints.values():
            if spec.socket_path is not None and other.spec.socket_path == spec.socket_path:
                raise BackendError(f"{spec.name}: socket {spec.socket_path} is VM {other.name}'s")
            if other.doorbell_path == spec.doorbell_path:
                raise BackendError(f"{spec.name}: doorbell region {spec.doorbell_path} is VM {other.name}'s")
        self._check_slot(spec.name)
        endpoint = VmEndpoint(spec, self.loop, self.fabric, self.guard)
        self.endpoints[spec.name] = endpoint
        self.notifier.status(self.status_line())
        return endpoint

    def remove_vm(self, name: str) -> None:
        """Stop serving a VM: its connection closes (its QEMU sees the backend go), its device and every object in
        it are freed, its socket is removed. The other VMs are not touched."""
        endpoint = self.endpoints.pop(name, None)
        if endpoint is None:
            served = ", ".join(sorted(self.endpoints)) or "none"
            raise BackendError(f"no VM named {name!r} is served (served: {served})")
        endpoint.close("removed through the admin socket")
        log.info("%s: removed", name)
        self.notifier.status(self.status_line())

    def _check_slot(self, name: str) -> None:
        if name in self.endpoints or name in self.containers:
            raise BackendError(f"a VM or container named {name} is already served")
        if len(self.endpoints) + len(self.containers) >= self.max_vms:
            raise BackendError(f"cannot serve {name}: all {self.max_vms} VM slots are in use (--max-vms), "
                               "containers' included")

    def add_container(self, spec: ContainerSpec) -> ContainerEndpoint:
        """Serve a container (vrdma.daemon.container): its socket listens when this returns. Refused, with the
        reason, when its name or socket is taken or every slot is; nothing else changes then."""
        self._check_slot(spec.name)
        for other in self.containers.values():
            if other.spec.socket_path == spec.socket_path:
                raise BackendError(f"{spec.name}: socket {spec.socket_path} is container {other.name}'s")
        endpoint = ContainerEndpoint(spec, self.loop, self.fabric)
        self.containers[spec.name] = endpoint
        self.notifier.status(self.status_line())
        return endpoint

    def remove_container(self, name: str) -> None:
        """Stop serving a container: its processes' connections close and every object they made is freed."""
        endpoint = self.containers.pop(name, None)
        if endpoint is None:
            raise BackendError(f"no container named {name!r} is served (served: "
                               f"{', '.join(sorted(self.containers)) or 'none'})")
        endpoint.close("removed through the admin socket")
        self.notifier.status(self.status_line())

    def status_line(self) -> str:
        """What `systemctl status` shows of the backend."""
        return f"serving {len(self.endpoints)} of at most {self.max_vms} VMs" + (
            f": {', '.join(sorted(self.endpoints))}" if 0 < len(self.endpoints) <= 8 else "")

    def announce_ready(self, ready_fd: int | None = None) -> None:
        """Every socket listens: tell whoever started us (``ready_fd``: the harness's pipe; systemd: READY=1)."""
        if ready_fd is not None:
            try:
                os.write(ready_fd, b"READY\n")
                os.close(ready_fd)
            except OSError as err:
                raise BackendError(f"--ready-fd {ready_fd}: {err}") from err
        self.notifier.ready(self.status_line())

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stop(self) -> None:
        """Ask run() to return; safe from a signal handler."""
        self.stopping = True
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")

    def _drain_stop(self) -> None:
        while True:
            try:
                if not os.read(self._stop_r, 64):
                    break
            except BlockingIOError:
                break

    def _take_signals(self) -> dict[int, Any]:
        """SIGTERM and SIGINT ask run() to return; the previous handlers, for close() to put back."""
        previous: dict[int, Any] = {sig: signal.signal(sig, lambda *_: self.stop())
                                    for sig in (signal.SIGTERM, signal.SIGINT)}
        # A VM's QEMU that closes its socket before reading a reply must cost that VM its connection (EPIPE),
        # not the process its life: libvhost-user writes replies with plain sendmsg().
        previous[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        # SIGUSR1 writes every thread's Python stack to stderr (the log), from the signal handler itself: it answers
        # even while the loop is inside C, which is where a backend that does not stop would be.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        # The kernel may give SIGTERM to any thread that does not block it (the metrics server's, say): Python then
        # only notes it, and runs the handler when the main thread next runs Python code, which a select() with no
        # timeout might never do. The wake-up fd is written by whichever thread took the signal.
        previous[-1] = signal.set_wakeup_fd(self._stop_w, warn_on_full_buffer=False)
        return previous

    def _give_signals_back(self) -> None:
        previous, self._signals = self._signals, {}
        if not previous:
            return
        signal.set_wakeup_fd(previous.pop(-1))
        faulthandler.unregister(signal.SIGUSR1)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def run(self) -> None:
        try:
            while not self.stopping:
                self.run_once()
        finally:
            self.notifier.stopping()
        log.info("stopping")

    def run_once(self) -> None:
        """One turn: wait for descriptors (not at all while the data engine is busy), then run the engine; ping
        systemd's watchdog when due (a loop that stops turning stops pinging)."""
        timeout = self.fabric.timeout()
        due = self.notifier.due()
        self.loop.run_once(due if timeout is None else timeout if due is None else min(timeout, due))
        self.fabric.run()
        self.notifier.ping_if_due()

    def close(self) -> None:
        if self.engine.threaded:
            # The data path stops first: what follows (VMs' memory and doorbell regions unmapped, sockets closed)
            # then meets no pass of the engine's.
            self.loop.remove_reader(self._engine_events)
            for thread in range(self.engine.threads):  # (debug: a refused start stays one line)
                log.debug("engine thread %d: %s", thread,
                         ", ".join(f"{k} {v}" for k, v in self.engine.thread_stats(thread).items()))
            self.engine.stop_threads()
            self.fabric.engine_thread_stopped()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        for endpoint in self.endpoints.values():
            endpoint.close("the backend is stopping")
        self.endpoints = {}
        for container in self.containers.values():
            container.close("the backend is stopping")
        self.containers = {}
        if self.roce is not None:
            self.engine.attach_network([], -1)
            self.roce.close()
            self.roce = None
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        self.notifier.close()
        self._give_signals_back()  # (before the wake-up fd closes)
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.loop.close()


def capabilities() -> dict[str, object]:
    """What `vrdma backend --print-capabilities` prints (vhost-user backend program conventions)."""
    return {
        "type": "rdma",
        "virtio-id": abi.const("VRDMA_VIRTIO_ID"),
        "abi-version": abi.const("VRDMA_ABI_VERSION"),
        "num-queues": abi.const("VRDMA_NUM_QUEUES"),
        "config-size": abi.sizeof("vrdma_config"),
        "features": [],
    }


def _cpu_list(cpus: list[int] | set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))
