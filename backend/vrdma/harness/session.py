"""Guests kept running in the background for the `vrdma vm up / exec / down / status` commands.

State lives in the run directory (``run/`` or ``$VRDMA_RUN_DIR``): ``session.json`` names the guests and
the link hub; each guest's directory holds its sockets, console log, QEMU log and ``state.json``. Commands from
several processes may use one session at once; only ``up`` and ``down`` take the session lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
from pyroute2 import netns

from vrdma import paths
from vrdma.errors import VrdmaError
from vrdma.harness.agent import ExecResult
from vrdma.harness.cluster import Cluster
from vrdma.harness.errors import NoGuestsError, UnknownGuestError, VmError
from vrdma.harness.hosts import Host
from vrdma.harness.multihost import GuestPlan, Move, MultiHost, move_guest
from vrdma.harness.process import find_process, record
from vrdma.harness.vm import Vm, migration_directory

log = logging.getLogger(__name__)

SESSION_FILE = "session.json"


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "session.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _load(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / SESSION_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def up(count: int, *, accel: str = "auto", memory_mib: int = 1024, boot_timeout: float = 120.0,
       with_device: bool = True, hosts: int = 0) -> list[Vm]:
    """Boot ``count`` guests in the background and return once every one is ready; with ``hosts``, on that many
    hosts (network namespaces, a backend with RoCE each: vrdma.harness.multihost), vm0 on h0, vm1 on h1, ..."""
    directory = paths.run_dir()
    with _locked(directory):
        existing = _load(directory)
        if existing is not None and any(vm.running for vm in _attached(directory, existing)):
            raise VrdmaError(f"guests are already up ({', '.join(existing['guests'])}) in {directory}; "
                             "run `vrdma vm down` first")
        if existing is not None:
            _stop(directory, existing)  # leftovers of a session whose guests died: clear them
        if hosts:
            return _up_on_hosts(directory, count, hosts, accel=accel, memory_mib=memory_mib,
                                boot_timeout=boot_timeout)
        cluster = Cluster(count, directory, accel=accel, memory_mib=memory_mib, boot_timeout=boot_timeout,
                          detach=True, with_device=with_device)
        try:
            cluster.start()
        except BaseException:
            cluster.stop()
            raise
        hub = psutil.Process(cluster.hub.pid) if cluster.hub is not None else None
        backend = cluster.backend.process if cluster.backend is not None else None
        session = {"guests": [vm.name for vm in cluster.vms], "accel": cluster.accel,
                   "hub": record(hub) if hub else None, "backend": record(backend) if backend else None}
        (directory / SESSION_FILE).write_text(json.dumps(session, indent=2))
        return list(cluster.vms)


def _up_on_hosts(directory: Path, count: int, hosts: int, **options: Any) -> list[Vm]:
    if not 1 <= hosts <= count:
        raise VrdmaError(f"--hosts {hosts} for {count} guests: every host gets at least one guest")
    plan = [GuestPlan(i % hosts) for i in range(count)]
    multihost = MultiHost(directory, plan, detach=True, prefix=f"vrdma-run{os.getpid() % 100000}", **options)
    try:
        multihost.start()
    except BaseException:
        multihost.stop()
        raise
    session = {"guests": [vm.name for vm in multihost.vms], "accel": multihost.accel, "hub": None, "backend": None,
               "guest_dirs": {vm.name: str(vm.directory) for vm in multihost.vms},
               "addresses": {vm.name: vm.address for vm in multihost.vms},
               "backends": [record(b.process) for b in multihost.backends.values() if b.process is not None],
               "namespaces": [multihost.fabric.switch, *(h.netns for h in multihost.fabric.hosts)],
               # what `vrdma vm migrate --to` needs to move a guest between the hosts
               "hosts": [dataclasses.asdict(h) for h in multihost.fabric.hosts],
               "guest_hosts": {vm.name: multihost.hosts_of[i] for i, vm in enumerate(multihost.vms)},
               "macs": {vm.name: multihost.identities[i].mac for i, vm in enumerate(multihost.vms)},
               "mtu": multihost.mtu}
    (directory / SESSION_FILE).write_text(json.dumps(session, indent=2))
    return list(multihost.vms)


def _guest_dir(directory: Path, session: dict[str, Any], name: str) -> Path:
    return Path(session.get("guest_dirs", {}).get(name, directory / name))


def _attached(directory: Path, session: dict[str, Any]) -> list[Vm]:
    vms = []
    for name in session.get("guests", []):
        vm = Vm.attach(_guest_dir(directory, session, name))
        if vm is not None:
            vms.append(vm)
    return vms


def guest(name: str) -> Vm:
    """The running guest called ``name``; a clear error when there is no session, no such guest, or it died."""
    directory = paths.run_dir()
    session = _load(directory)
    if session is None:
        raise NoGuestsError(f"no guests are up (nothing in {directory}): start them with `vrdma vm up`")
    names = session.get("guests", [])
    if name not in names:
        raise UnknownGuestError(f"unknown guest {name!r}: the guests that are up are {', '.join(names)}")
    vm = Vm.attach(_guest_dir(directory, session, name))
    if vm is None or not vm.running:
        raise VmError(name, "is not running (its QEMU has exited); `vrdma vm down` clears the session",
                      console_log=_guest_dir(directory, session, name) / "console.log")
    return vm


def migrate(name: str, to: str | None = None) -> tuple[Vm, dict[str, Any]]:
    """Live-migrate guest ``name``: to a new QEMU served by the same backend (Vm.migrate_to), or with ``to`` (a host
    of `vrdma vm up --hosts`: h1 or 1) to that host, whose backend takes its device's state (multihost.move_guest).
    The new QEMU is the session's guest afterwards; returns it and QEMU's last query-migrate answer."""
    directory = paths.run_dir()
    with _locked(directory):
        session = _load(directory)
        on_hosts = session is not None and bool(session.get("backends"))
        if on_hosts and to is None:
            raise VrdmaError("vrdma vm migrate: the guests of `vrdma vm up --hosts` are on tap devices, which a "
                             "second QEMU on the same host cannot open; give the host to move to with --to HOST")
        if not on_hosts and to is not None:
            raise VrdmaError("vrdma vm migrate --to: the guests are on one host (`vrdma vm up` without --hosts): "
                             "leave --to out to migrate within it")
        vm = guest(name)
        if not hasattr(vm, "products"):
            raise VrdmaError(f"{name} was started by a vrdma that did not record how (no \"launch\" in its "
                             "state.json): `vrdma vm down` and `vrdma vm up` again")
        assert session is not None  # (guest() found it)
        if to is None:
            destination = vm.incoming_copy(migration_directory(directory, name))
            info = vm.migrate_to(destination)
        else:
            destination, info = _migrate_between_hosts(directory, session, vm, to)
            session["guest_hosts"][name] = _host_number(session, to)
        session.setdefault("guest_dirs", {})[name] = str(destination.directory)
        (directory / SESSION_FILE).write_text(json.dumps(session, indent=2))
        return destination, info


def _host_number(session: dict[str, Any], to: str) -> int:
    count = len(session.get("hosts", []))
    number = to.removeprefix("h")
    if not number.isdigit() or not 0 <= int(number) < count:
        raise VrdmaError(f"--to {to!r}: the hosts are h0 to h{count - 1}" if count else
                         "these guests were started by a vrdma that did not record their hosts: `vrdma vm down` and "
                         "`vrdma vm up --hosts N` again")
    return int(number)


def _migrate_between_hosts(directory: Path, session: dict[str, Any], vm: Vm, to: str) -> tuple[Vm, dict[str, Any]]:
    hosts = [Host(**h) for h in session["hosts"]]
    to_host, source = _host_number(session, to), int(session["guest_hosts"][vm.name])
    if to_host == source:
        raise VrdmaError(f"{vm.name} runs on h{source} already")
    index = session["guests"].index(vm.name)
    move = Move(session["addresses"][vm.name], session["macs"][vm.name], f"tap{index}", hosts, source, to_host,
                [directory / f"h{k}" / "backend" / "admin.sock" for k in (source, to_host)], directory / f"h{to_host}",
                int(session.get("mtu", 1500)))
    return move_guest(vm, move)


def exec_in(name: str, argv: Sequence[str], timeout: float = 300.0) -> ExecResult:
    return guest(name).agent.run(argv, timeout=timeout)


def down() -> list[str]:
    """Stop every guest of the session and the link hub; returns the names of the guests stopped."""
    directory = paths.run_dir()
    with _locked(directory):
        session = _load(directory)
        if session is None:
            log.info("no guests are up")
            return []
        return _stop(directory, session)


def _stop(directory: Path, session: dict[str, Any]) -> list[str]:
    stopped = []
    for vm in _attached(directory, session):
        if vm.running:
            vm.shutdown()
            stopped.append(vm.name)
    # After the guests (QEMU leaves the backend cleanly). The backend is the process its admin socket names, which an
    # upgrade (`vrdma admin upgrade`) made another than the one recorded.
    _stop_process(_serving_backend(directory) or session.get("backend"))
    _stop_process(session.get("hub"))
    for backend in session.get("backends", []):
        _stop_process(backend)
    existing = set(netns.listnetns())
    for name in session.get("namespaces", []):  # the hosts of `vm up --hosts`, with their links
        if name in existing:
            netns.remove(name)
    (directory / SESSION_FILE).unlink(missing_ok=True)
    return stopped


def _serving_backend(directory: Path) -> dict[str, Any] | None:
    """The backend answering on the session's admin socket, recorded as process.record() does; None if none."""
    from vrdma.daemon.admin import ask

    try:
        pid = ask(directory / "backend" / "admin.sock", {"command": "status"}, timeout=5.0).get("pid")
        return record(psutil.Process(int(pid))) if isinstance(pid, int) else None
    except (OSError, ValueError, psutil.Error):
        return None


def _stop_process(recorded: dict[str, Any] | None) -> None:
    """Terminate a helper process recorded by process.record(), if it is still that process."""
    process = find_process(int(recorded["pid"]), float(recorded["create_time"])) if recorded else None
    if process is None:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        process.terminate()
        try:
            process.wait(10)
        except psutil.TimeoutExpired:
            process.kill()


def status() -> list[tuple[str, str, str, str]]:
    """(name, address, state, directory) of every guest of the session."""
    directory = paths.run_dir()
    session = _load(directory)
    if session is None:
        return []
    rows = []
    for index, name in enumerate(session.get("guests", [])):
        vm = Vm.attach(_guest_dir(directory, session, name))
        state = "running" if vm is not None and vm.running else "stopped"
        address = session.get("addresses", {}).get(name, f"169.254.100.{index + 1}")
        rows.append((name, address, state, str(_guest_dir(directory, session, name))))
    return rows
