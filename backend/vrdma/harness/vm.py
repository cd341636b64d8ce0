"""One QEMU guest as a context manager: launch, wait until ready, run commands, shut down, keep the logs.

Readiness is two events, never a sleep: the image's start-up script prints ``vrdma-guest-ready`` on the serial
console, then the guest agent answers a handshake. A kernel panic, a start-up error line, QEMU exiting or the
deadline passing ends the wait with an error that names the cause and carries the QEMU command line, its exit
status and the console tail; the console log stays on disk.

The sockets QEMU serves (console, QMP, agent) are created and bound by the harness and handed to QEMU as file
descriptors, so they exist before QEMU starts and nothing races to connect to a path QEMU has yet to create.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import psutil

from vrdma.harness import qemu_cmdline
from vrdma.harness.agent import ExecResult, GuestAgent
from vrdma.harness.errors import AgentError, GuestBootTimeout, GuestPanicError, MigrationFailed, VmError
from vrdma.harness.process import Managed, die_with_parent, find_process, is_running, record

log = logging.getLogger(__name__)

READY = re.compile(rb"vrdma-guest-ready[^\r\n]*")
PANIC = re.compile(rb"Kernel panic - not syncing[^\r\n]*")
GUEST_ERROR = re.compile(rb"vrdma-guest-error: [^\r\n]*")
QUIT_TIMEOUT = 10.0       # QMP quit, then SIGTERM, then SIGKILL, each given this long
CONSOLE_TAIL_LINES = 40
STATE_FILE = "state.json"
UNLOAD_WAIT_MS = 30_000
MIGRATION_TIMEOUT = 600.0  # a live migration of a TCG guest's RAM (1 GiB) takes seconds; past this it failed
MIGRATION_POLL = 0.1       # how often query-migrate is asked
# ... once the source has stopped, when something waits for the switch-over (after_switchover: the hosts' routes):
# each look is a QMP connection, and looking every few ms took enough of two cores to triple the peers' blackout.
MIGRATION_POLL_STOPPED = 0.02


def unload(*modules: str) -> str:
    """The guest's shell line that removes ``modules`` (and what they alone used), each once nothing holds it.

    A transport's teardown ends after the command that began it (umount, rpc.nfsd 0, nvme disconnect, a target
    cleared): the connection it used releases its module asynchronously, and `rmmod` just after answered EAGAIN
    now and then ("can't unload module 'rpcrdma': Resource temporarily unavailable"). kmod's modprobe waits for the
    reference count to drop (`--wait`); named by path, because busybox's sh runs its own applets (rmmod, modprobe
    without --wait) for bare names. Modules something else still uses (the RDMA core under vrdma) stay."""
    return f"/sbin/modprobe -r --wait={UNLOAD_WAIT_MS} {' '.join(modules)}"


@dataclass(frozen=True)
class Products:
    """The build products a guest needs (see vrdma.buildchain)."""

    qemu: Mapping[str, Any]
    kernel: Mapping[str, Any]
    image: Mapping[str, Any]
    disk: Mapping[str, Any] | None = None  # a full Debian guest's root disk (buildchain.debian_guest)

    @classmethod
    def load(cls, kernel: str | None = None) -> Products:
        """The products of guests booting ``kernel`` (a name of buildchain.kernel.GUEST_KERNELS; None: the default
        guest kernel)."""
        from vrdma.buildchain.cache import product
        from vrdma.buildchain.kernel import kernel_product

        return cls(qemu=product("qemu"), kernel=kernel_product("kernel", kernel),
                   image=kernel_product("image", kernel))

    @classmethod
    def debian_guest(cls) -> Products:
        """The products of a full Debian guest: its own kernel and initramfs, booting its root disk."""
        from vrdma.buildchain.cache import product

        disk = product("debian-guest")
        return cls(qemu=product("qemu"), kernel={"vmlinuz_path": disk["vmlinuz_path"], "release": disk["release"]},
                   image={"initrd_path": disk["initrd_path"], "kernel_release": disk["release"]}, disk=disk)


class Vm(Managed):
    """A guest. ``with Vm(...) as vm:`` boots it and waits until it is ready; leaving the block stops it."""

    def __init__(self, identity: qemu_cmdline.GuestIdentity, directory: Path, *, accel: str,
                 products: Products, link_remote: str, memory_mib: int = 1024, boot_timeout: float = 120.0,
                 detach: bool = False, append_extra: str = "", with_device: bool = True, tap: str | None = None,
                 wrapper: list[str] | None = None, device: str = "rdma", cpus: int = 1,
                 link_name: Path | None = None, vrdma_socket: Path | None = None) -> None:
        """``tap``: the guest's netdev is this tap device instead of the private link; ``wrapper``: the command QEMU
        runs under (a host of vrdma.harness.hosts: its network namespace, where the tap is); ``device``: how QEMU
        gives the vrdma device (qemu_cmdline.DEVICE_TEMPLATES: the named device, or the generic one); ``cpus``: its
        vCPUs (1, the default: under TCG more cost host cores the backend needs); ``link_name``: the name its peers
        send its frames to (default: its QEMU's end of the private link, ``directory``/link.sock; a migration's
        destination keeps its source's name, pointed at its own end once it runs); ``vrdma_socket``: the backend's
        socket when not in ``directory`` (incoming_copy)."""
        if device not in qemu_cmdline.DEVICE_TEMPLATES:
            raise ValueError(f"device {device!r}: one of {', '.join(qemu_cmdline.DEVICE_TEMPLATES)}")
        self.device = device
        self.identity = identity
        self.tap = tap
        self.wrapper = wrapper or []
        self.name = identity.name
        self.directory = directory
        self.accel = accel
        self.products = products
        self.link_remote = link_remote
        self.memory_mib = memory_mib
        self.cpus = cpus
        self.boot_timeout = boot_timeout
        self.detach = detach
        self.append_extra = append_extra
        self.with_device = with_device
        self.link_name = link_name or directory / "link.sock"
        self.vrdma_socket = vrdma_socket or directory / "vrdma.sock"
        self.cmdline: list[str] = []
        self.process: psutil.Process | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self.boot_seconds: float | None = None
        self._launched_at = 0.0
        self.agent = GuestAgent(self.name, directory / "agent.sock", directory / "agent.lock",
                                directory / "console.log")

    # -- paths ------------------------------------------------------------------------------------------------

    @property
    def console_log(self) -> Path:
        return self.directory / "console.log"

    @property
    def qemu_log(self) -> Path:
        return self.directory / "qemu.log"

    @property
    def address(self) -> str:
        return self.identity.ip

    # -- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def stop(self) -> None:
        self.shutdown()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        super().__exit__(exc_type, exc, tb)
        if exc is not None and not isinstance(exc, VmError):  # a VmError already names the log
            log.error("%s: console log kept at %s", self.name, self.console_log)

    def launch(self, incoming: bool = False) -> None:
        """Start QEMU (from the calling thread: the parent-death signal is tied to it); ``incoming``: as a
        migration's destination, waiting for the guest to arrive (migrate_to) rather than booting it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in ("console.sock", "qmp.sock", "agent.sock", "link.sock", "console.log", "qemu.log"):
            (self.directory / stale).unlink(missing_ok=True)
        listeners = {role: _listen(self.directory / f"{role}.sock") for role in ("console", "qmp", "agent")}
        try:
            disk = self.products.disk
            append = " ".join(a for a in (disk["append"] if disk else "", self.append_extra) if a)
            fields = qemu_cmdline.standard_fields(
                self.identity, qemu=self.products.qemu, kernel=self.products.kernel, image=self.products.image,
                accel=self.accel, memory_mib=self.memory_mib, directory=self.directory,
                link_remote=self.link_remote, append_extra=append, tap=self.tap, cpus=self.cpus,
                vrdma_socket=self.vrdma_socket)
            if disk:
                fields["disk"] = str(disk["disk_path"])
            fields.update({role: f"fd={sock.fileno()}" for role, sock in listeners.items()})
            self.cmdline = [*self.wrapper, str(self.products.qemu["binary_path"]),
                            *qemu_cmdline.render_guest(fields, self.with_device, self.device),
                            *(["-incoming", "defer"] if incoming else [])]
            log.debug("%s: %s", self.name, " ".join(self.cmdline))
            with self.qemu_log.open("wb") as qemu_out:
                self._popen = subprocess.Popen(
                    self.cmdline, stdin=subprocess.DEVNULL, stdout=qemu_out, stderr=subprocess.STDOUT,
                    pass_fds=[s.fileno() for s in listeners.values()], start_new_session=self.detach,
                    preexec_fn=None if self.detach else die_with_parent)
        finally:
            for sock in listeners.values():
                sock.close()  # QEMU holds its own copies
        self._launched_at = time.monotonic()
        self.process = psutil.Process(self._popen.pid)
        self._write_state()

    def reboot(self) -> None:
        """Reboot the guest from inside (``systemctl reboot``) and wait until it is ready again, in the same QEMU:
        its disk's writes (snapshot=on) stay. For that one reset QEMU resets the machine instead of exiting
        (-no-reboot's action, restored once the guest is back)."""
        qmp = self.directory / "qmp.sock"
        asyncio.run(_qmp_execute(qmp, "set-action", {"reboot": "reset"}))
        self.agent.spawn(["systemctl", "reboot"])
        self._launched_at = time.monotonic()
        self.wait_ready()
        asyncio.run(_qmp_execute(qmp, "set-action", {"reboot": "shutdown"}))

    def incoming_copy(self, directory: Path, vrdma_socket: Path | None = None,
                      wrapper: list[str] | None = None) -> Vm:
        """This guest as a migration's destination in ``directory``, not launched (migrate_to launches it): the same
        machine, connected to ``vrdma_socket`` (default: the socket this guest's QEMU uses, the same backend: a
        migration between two QEMUs of one backend), and the name its peers send to on the private link, which
        migrate_to points at the destination once it runs. ``wrapper``: the destination QEMU runs under it (another
        host of vrdma.harness.hosts, where a tap of the same name waits for it)."""
        if self.tap is not None and (wrapper is None or wrapper == self.wrapper):
            raise VmError(self.name, "is on a tap device: a second QEMU on one host cannot open it")
        return Vm(self.identity, directory, accel=self.accel, products=self.products, link_remote=self.link_remote,
                  memory_mib=self.memory_mib, boot_timeout=self.boot_timeout, detach=self.detach,
                  append_extra=self.append_extra, with_device=self.with_device,
                  wrapper=self.wrapper if wrapper is None else wrapper, device=self.device, cpus=self.cpus,
                  link_name=self.link_name, vrdma_socket=vrdma_socket or self.vrdma_socket, tap=self.tap)

    def migrate_to(self, destination: Vm, *, max_bandwidth: int | None = None,
                   timeout: float = MIGRATION_TIMEOUT,
                   cancel_when: Callable[[], bool] | None = None,
                   while_copying: Callable[[], None] | None = None,
                   before_switchover: Callable[[], None] | None = None,
                   after_switchover: Callable[[], None] | None = None) -> dict[str, Any]:
        """Live-migrate this guest into ``destination`` (the same guest, as a Vm of its own directory, whose
        vrdma.sock is the destination backend's, not launched yet): QEMU's migration over a unix socket with the
        return path on (a destination that refuses the device's state fails the migration here, and this guest
        runs on). Afterwards this QEMU has quit and ``destination`` is the guest, its agent the one to use.
        ``max_bandwidth``: bytes per second (a slower copy of RAM); ``cancel_when``: asked while the migration is
        under way, it is cancelled (migrate_cancel) once this is true (a test of a migration given up);
        ``while_copying``: called at each look while RAM is copied; ``before_switchover``: called once this guest has
        stopped and its devices are quiesced, before any device state is sent (QEMU's pause-before-switchover), the
        migration going on when it returns; ``after_switchover``: called as soon as QEMU reports the migration
        completed (the destination starting), before this QEMU is shut down. Returns
        query-migrate's last answer (status, total-time, downtime in ms, ram); MigrationFailed says why QEMU gave up
        (``cancelled`` for one cancelled)."""
        destination.launch(incoming=True)
        uri = f"unix:{destination.directory / 'migration.sock'}"
        return_path = [{"capability": "return-path", "state": True}]
        for vm in (destination, self):
            vm.qmp("migrate-set-capabilities", capabilities=return_path)
        self.qmp("migrate-set-capabilities", capabilities=[
            {"capability": "pause-before-switchover", "state": before_switchover is not None}])
        destination.qmp("migrate-incoming", uri=uri)
        if max_bandwidth is not None:
            self.qmp("migrate-set-parameters", **{"max-bandwidth": max_bandwidth})
        self.qmp("migrate", uri=uri)
        deadline = time.monotonic() + timeout
        while True:
            info = cast(dict[str, Any], self.qmp("query-migrate"))
            status = info.get("status")
            if status == "completed":
                if after_switchover is not None:
                    after_switchover()
                break
            if cancel_when is not None and status == "active" and cancel_when():
                self.qmp("migrate_cancel")
                cancel_when = None
            if while_copying is not None and status == "active":
                while_copying()
            if before_switchover is not None and status == "pre-switchover":
                before_switchover()
                before_switchover = None
                self.qmp("migrate-continue", state="pre-switchover")
            if status in ("failed", "cancelled") or time.monotonic() > deadline:
                with contextlib.suppress(Exception):
                    self.qmp("migrate_cancel")
                destination.shutdown()
                raise MigrationFailed(f"{self.name}: migration {status or 'unanswered'} "
                                      f"({info.get('error-desc', f'not done in {timeout:g} s')})")
            # QEMU reports progress only when asked
            soon = after_switchover is not None and status not in ("setup", "active")
            time.sleep(MIGRATION_POLL_STOPPED if soon else MIGRATION_POLL)
        while cast(dict[str, Any], destination.qmp("query-status")).get("status") != "running":
            if time.monotonic() > deadline:
                raise MigrationFailed(f"{destination.name}: the destination did not run after the migration")
            time.sleep(MIGRATION_POLL)
        own_end = destination.directory / "link.sock"
        if destination.link_name != own_end and destination.tap is None:
            # The peers' frames to the guest's name go to the QEMU it runs in now (a unix datagram's address is
            # looked up at each send, through a symbolic link as well).
            pointer = destination.directory / "link.name.tmp"
            pointer.unlink(missing_ok=True)
            pointer.symlink_to(own_end)
            os.replace(pointer, destination.link_name)
        self.shutdown()
        destination._launched_at = time.monotonic()
        return info

    def qmp(self, command: str, **arguments: object) -> object:
        """One QMP command to this guest's QEMU; its answer (qemu.qmp's ExecuteError when QEMU refuses it)."""
        return asyncio.run(_qmp_execute(self.directory / "qmp.sock", command, arguments))

    def wait_ready(self) -> None:
        deadline = self._launched_at + self.boot_timeout
        self._watch_console(deadline)
        try:
            self.agent.wait_ready(deadline)
        except Exception as err:
            raise self._failure(GuestBootTimeout, f"guest agent did not answer: {err}") from err
        self.boot_seconds = time.monotonic() - self._launched_at
        log.info("%s ready in %.1f s (%s, %s)", self.name, self.boot_seconds, self.accel.upper(), self.address)
        self._write_state()

    def _watch_console(self, deadline: float) -> None:
        console = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        seen = b""
        try:
            console.connect(str(self.directory / "console.sock"))
            with selectors.DefaultSelector() as sel:
                sel.register(console, selectors.EVENT_READ)
                while True:
                    if READY.search(seen):
                        return
                    if (match := PANIC.search(seen)) is not None:
                        raise self._failure(GuestPanicError, "kernel panic: " + match.group().decode(errors="replace"),
                                            wait_exit=True)
                    if (match := GUEST_ERROR.search(seen)) is not None:
                        raise self._failure(VmError, "start-up failed: " + match.group().decode(errors="replace"))
                    if not self.running:
                        raise self._failure(VmError, "QEMU exited during boot")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._failure(GuestBootTimeout, f"not ready within {self.boot_timeout:g} s")
                    # Wake at least every half second to notice QEMU exiting without console output.
                    if sel.select(min(remaining, 0.5)):
                        chunk = console.recv(65536)
                        if not chunk:
                            raise self._failure(VmError, "QEMU closed the console", wait_exit=True)
                        seen = (seen + chunk)[-65536:]
        except OSError as err:
            raise self._failure(VmError, f"console socket: {err}") from err
        finally:
            console.close()

    @property
    def running(self) -> bool:
        return is_running(self._popen, self.process)

    def shutdown(self) -> int | None:
        """Stop QEMU: QMP quit, then SIGTERM, then SIGKILL. Returns its exit status when it is our child."""
        if self.process is None:
            return None
        if self.running:
            try:
                asyncio.run(_qmp_quit(self.directory / "qmp.sock", QUIT_TIMEOUT))
            except Exception as err:
                log.debug("%s: QMP quit failed: %s", self.name, err)
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None and self.running:
                    log.warning("%s: QEMU did not quit, sending %s", self.name, sig.name)
                    with contextlib.suppress(psutil.NoSuchProcess):
                        self.process.send_signal(sig)
                if self._wait_exit(QUIT_TIMEOUT):
                    break
        status = self._popen.wait() if self._popen is not None else None
        self.process = None
        with contextlib.suppress(OSError):
            (self.directory / STATE_FILE).unlink()
        return status

    def _wait_exit(self, timeout: float) -> bool:
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        assert self.process is not None
        try:
            self.process.wait(timeout)
        except psutil.TimeoutExpired:
            return False
        except psutil.NoSuchProcess:
            pass
        return True

    def _failure(self, kind: type[VmError], reason: str, wait_exit: bool = False) -> VmError:
        if wait_exit:  # a panicking guest reboots, which with -no-reboot ends QEMU: collect its status
            self._wait_exit(30.0)
        status = self._popen.poll() if self._popen is not None else None
        return kind(self.name, reason, cmdline=self.cmdline, exit_status=status, console_log=self.console_log,
                    console_tail=console_tail(self.console_log))

    # -- commands ---------------------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: float = 300.0, env: Sequence[str] = ()) -> ExecResult:
        """Run a command in the guest; its exit status and output come back (CommandTimeout past timeout)."""
        if not self.running:
            raise self._failure(VmError, "QEMU is not running")
        return self.agent.run(argv, timeout=timeout, env=env)

    def sh(self, script: str, timeout: float = 300.0) -> ExecResult:
        """Run a shell script in the guest."""
        return self.run(["/bin/sh", "-c", script], timeout=timeout)

    def setup(self, script: str, what: str, timeout: float = 120.0, peers: Sequence[Vm] = ()) -> str:
        """Run a set-up or tear-down script in the guest, stopping at its first failing command (sh -e); its output,
        or AgentError with the output and the tail of the guest's kernel log, which says why a module or a mount
        refused, and of each of ``peers``' (the other end of a connection the script makes: a target that did not
        answer says why in its own log)."""
        result = self.run(["/bin/sh", "-ec", script], timeout=timeout)
        if result.exit_status != 0:
            logs = "".join(f"\n{vm.name}'s kernel log:\n{vm.kernel_log_tail()}" for vm in (self, *peers))
            raise AgentError(f"{what} in {self.name} failed (exit {result.exit_status}):\n{result.stdout}"
                             f"{result.stderr}{logs}")
        return result.stdout

    def kernel_log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the guest's kernel log (or why they could not be read)."""
        try:
            return "\n".join(self.run(["dmesg"], timeout=30.0).stdout.splitlines()[-lines:])
        except (VmError, AgentError) as err:
            return f"(unreadable: {err})"

    # -- persistence for `vrdma vm` ---------------------------------------------------------------------------

    def _write_state(self) -> None:
        assert self.process is not None
        state = {"name": self.name, "index": self.identity.index, **record(self.process), "accel": self.accel,
                 "address": self.address, "boot_seconds": self.boot_seconds, "cmdline": self.cmdline,
                 # what incoming_copy needs of a guest attached to later (`vrdma vm migrate`)
                 "launch": {"products": dataclasses.asdict(self.products), "link_remote": self.link_remote,
                            "memory_mib": self.memory_mib, "boot_timeout": self.boot_timeout,
                            "append_extra": self.append_extra, "with_device": self.with_device, "tap": self.tap,
                            "wrapper": self.wrapper, "device": self.device, "cpus": self.cpus,
                            "link_name": str(self.link_name), "vrdma_socket": str(self.vrdma_socket)}}
        tmp = self.directory / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.rename(self.directory / STATE_FILE)

    @classmethod
    def attach(cls, directory: Path) -> Vm | None:
        """The guest whose state is in ``directory``, or None when its QEMU is gone."""
        try:
            state = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        vm = cls.__new__(cls)
        vm.identity = qemu_cmdline.GuestIdentity(int(state["index"]))
        vm.name = state["name"]
        vm.directory = directory
        vm.accel = state["accel"]
        vm.cmdline = list(state["cmdline"])
        vm.boot_seconds = state.get("boot_seconds")
        vm._popen = None
        vm.agent = GuestAgent(vm.name, directory / "agent.sock", directory / "agent.lock",
                              directory / "console.log")
        vm.process = find_process(int(state["pid"]), float(state["create_time"]))
        launch = state.get("launch")
        if isinstance(launch, dict):
            vm.products = Products(**launch["products"])
            vm.link_remote, vm.memory_mib = launch["link_remote"], launch["memory_mib"]
            vm.boot_timeout, vm.append_extra = launch["boot_timeout"], launch["append_extra"]
            vm.with_device, vm.tap, vm.wrapper = launch["with_device"], launch["tap"], launch["wrapper"]
            vm.device, vm.cpus, vm.detach = launch["device"], launch["cpus"], True
            vm.link_name, vm.vrdma_socket = Path(launch["link_name"]), Path(launch["vrdma_socket"])
        return vm


def guest_of(vms: list[Vm], key: int | str) -> Vm:
    """A guest of ``vms`` by index or name (a cluster's guest as it is now: a migrated guest is a new Vm)."""
    if isinstance(key, int):
        return vms[key]
    for vm in vms:
        if vm.name == key:
            return vm
    raise KeyError(key)


def span_switchover(guest: Vm, pid: int, progress: Callable[[], int], more: int, what: str) -> dict[str, Any]:
    """Vm.migrate_to's hooks that make program ``pid`` in ``guest`` (a peer of the guest that migrates) span the
    switch-over on a machine of any speed, not by a guessed iteration count: held with SIGSTOP once ``progress()``
    has moved on by ``more`` while RAM is copied (the process only: its guest's device goes on answering), found
    still running and let go once the source has stopped, before its device state is saved."""
    start = progress()
    held: list[bool] = []

    def while_copying() -> None:
        if not held and progress() > start + more:
            guest.run(["kill", "-STOP", str(pid)]).check(f"{what} held")
            held.append(True)

    def before_switchover() -> None:
        ended = guest.agent.poll(pid)
        if ended is not None:
            raise AssertionError(f"{what} ended before the switch-over (exit {ended.exit_status}):\n"
                                 f"{ended.stdout}{ended.stderr}")
        if held:
            guest.run(["kill", "-CONT", str(pid)]).check(f"{what} let go")

    return {"while_copying": while_copying, "before_switchover": before_switchover}


def migration_directory(parent: Path, name: str) -> Path:
    """Where guest ``name``'s next migration puts its destination QEMU: NAME.m1, NAME.m2, ... in ``parent`` (each
    source's directory, with its logs, stays)."""
    moves = 1
    while (parent / f"{name}.m{moves}").exists():
        moves += 1
    return parent / f"{name}.m{moves}"


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(16)
    sock.set_inheritable(True)
    return sock


async def _qmp_execute(path: Path, command: str, arguments: Mapping[str, object] | None = None,
                       timeout: float = QUIT_TIMEOUT) -> object:
    from qemu.qmp import QMPClient

    client = QMPClient("vrdma-harness")
    await asyncio.wait_for(client.connect(str(path)), timeout)
    try:
        return await asyncio.wait_for(client.execute(command, dict(arguments or {})), timeout)
    finally:
        with contextlib.suppress(Exception):
            await client.disconnect()


async def _qmp_quit(path: Path, timeout: float) -> None:
    from qemu.qmp import QMPClient

    client = QMPClient("vrdma-harness")
    await asyncio.wait_for(client.connect(str(path)), timeout)
    try:
        await asyncio.wait_for(client.execute("quit"), timeout)
    except Exception:
        pass
    finally:
        with contextlib.suppress(Exception):
            await client.disconnect()


def console_tail(path: Path, lines: int = CONSOLE_TAIL_LINES) -> str:
    try:
        text = path.read_bytes()[-65536:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "").splitlines()[-lines:])


logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)  # its own disconnect chatter is noise for us
