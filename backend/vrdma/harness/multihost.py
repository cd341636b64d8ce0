"""Guests on several hosts: vrdma beyond one host, as the harness runs it (issue 14, docs/interhost.md).

Each host is a network namespace of a vrdma.harness.hosts fabric (its `eth0` on the fabric's segment), set up with
the same commands docs/interhost.md gives an operator for a real host (``host_commands``): the host's guests on
tap devices in a bridge (`guests`, 10.99.K.1/24, their default gateway; its ports isolated from each other, the
host answering their ARP for each other, so that guest-to-guest traffic too passes the host's IP layer), forwarding
on, a route to each other
host's guests through that host's address, and RoCE for each vrdma guest's address delivered to the host itself,
where its backend (`vrdma backend --roce`, started in the namespace) takes it: a policy rule `to GUEST ipproto udp
dport 4791` looks up a table whose one route makes everything local. A guest planned with ``rxe=True`` boots
without a vrdma device, its address gets no rule, and its own RoCE traffic reaches it (the kernel's rxe answers).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrdma.errors import VrdmaError
from vrdma.harness import accel as accel_probe
from vrdma.harness import daemon
from vrdma.harness.daemon import DaemonProcess, Served
from vrdma.harness.hosts import HOST_LINK, Host, HostNetwork, HostNetworkError
from vrdma.harness.impair import Impairment
from vrdma.harness.process import Managed
from vrdma.harness.qemu_cmdline import GuestIdentity
from vrdma.harness.verbs import add_rxe
from vrdma.harness.vm import Products, Vm, guest_of, migration_directory

log = logging.getLogger(__name__)

GUEST_BRIDGE = "guests"
# Every host's guest bridge answers as this MAC (a distributed "anycast gateway", as EVPN fabrics give every leaf):
# a guest live-migrated to another host keeps its gateway's address in its ARP cache, and it stays right.
GATEWAY_MAC = "02:76:72:64:6d:01"
ROCE_TABLE = 4791  # the routing table RoCE for local vrdma guests is looked up in (any free number does)
ROCE_RULE_PRIORITY = 100


def guest_subnet(host: int) -> str:
    return f"10.99.{host}"


@dataclass(frozen=True)
class GuestPlan:
    """Guest ``index`` (vm<index>) on host ``host``; ``rxe``: no vrdma device, the guest's kernel rxe serves it."""

    host: int
    rxe: bool = False


def host_commands(host: int, hosts: list[str], vrdma_guests: list[str], guest_taps: list[str],
                  mtu: int = 1500) -> list[list[str]]:
    """The commands that make host number ``host`` (fabric addresses ``hosts``) a home for its guests: the bridge
    and taps (of ``mtu``), forwarding, routes to the other hosts' guests, and RoCE for ``vrdma_guests`` delivered
    locally."""
    net = guest_subnet(host)
    commands = [["ip", "link", "add", GUEST_BRIDGE, "address", GATEWAY_MAC, "mtu", str(mtu), "type", "bridge"],
                ["ip", "addr", "add", f"{net}.1/24", "dev", GUEST_BRIDGE],
                ["ip", "link", "set", GUEST_BRIDGE, "up"]]
    for tap in guest_taps:
        commands += tap_commands(tap, mtu)
    # proxy_arp: a guest that came from another host asks for its old gateway, routed through the host link.
    commands += [["sysctl", "-qw", "net.ipv4.ip_forward=1", f"net.ipv4.conf.{GUEST_BRIDGE}.proxy_arp_pvlan=1",
                  f"net.ipv4.conf.{GUEST_BRIDGE}.proxy_arp=1",
                  f"net.ipv4.conf.{GUEST_BRIDGE}.send_redirects=0", "net.ipv4.conf.all.send_redirects=0"]]
    for other, address in enumerate(hosts):
        if other != host:
            commands.append(["ip", "route", "add", f"{guest_subnet(other)}.0/24", "via", address, "dev", HOST_LINK])
    if vrdma_guests:
        commands.append(["ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", str(ROCE_TABLE)])
    for guest in vrdma_guests:
        commands.append(roce_rule("add", guest))
    return commands


def roce_rule(action: str, guest: str) -> list[str]:
    """The policy rule that delivers RoCE for vrdma guest ``guest`` to its host's backend (``action``: add, del)."""
    return ["ip", "rule", action, "to", f"{guest}/32", "ipproto", "udp", "dport", "4791", "lookup", str(ROCE_TABLE),
            "priority", str(ROCE_RULE_PRIORITY)]


def tap_commands(tap: str, mtu: int) -> list[list[str]]:
    """A guest's tap in the host's guest bridge. Isolated ports: guests of one host reach each other through the
    host's IP layer (which answers their ARP for each other: proxy_arp_pvlan), never straight across the bridge,
    so that RoCE for a vrdma guest meets its rule even from its neighbour."""
    return [["ip", "tuntap", "add", "dev", tap, "mode", "tap"],
            ["ip", "link", "set", tap, "mtu", str(mtu), "master", GUEST_BRIDGE, "up"],
            ["bridge", "link", "set", "dev", tap, "isolated", "on"]]


def arrival_commands(guest: str, tap: str, mtu: int = 1500) -> list[list[str]]:
    """On the host a vrdma guest (address ``guest``) is live-migrated to, before it comes: its tap in the bridge,
    its address routed there (it keeps the address of the host it came from), and its RoCE delivered locally."""
    return [*tap_commands(tap, mtu),
            ["ip", "route", "replace", f"{guest}/32", "dev", GUEST_BRIDGE],
            ["ip", "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", str(ROCE_TABLE)],
            roce_rule("add", guest)]


def departure_commands(guest: str, now_at: str) -> list[list[str]]:
    """On the host a vrdma guest left, once it runs at host address ``now_at``: its RoCE and its address go there."""
    return [roce_rule("del", guest), ["ip", "route", "replace", f"{guest}/32", "via", now_at, "dev", HOST_LINK]]


def elsewhere_commands(guest: str, now_at: str) -> list[list[str]]:
    """On every other host, once a guest runs at host address ``now_at``."""
    return [["ip", "route", "replace", f"{guest}/32", "via", now_at, "dev", HOST_LINK]]


class MultiHost(Managed):
    """``with MultiHost(directory, [GuestPlan(0), GuestPlan(1)]) as mh:`` boots vm0 on host h0 and vm1 on h1, each
    host with its own backend, and waits until every guest is ready; ``mh.vms[i]``, ``mh.fabric[k]``."""

    def __init__(self, directory: Path, plan: list[GuestPlan], *, accel: str = "auto", memory_mib: int = 1024,
                 boot_timeout: float = 120.0, products: Products | None = None, prefix: str | None = None,
                 impairment: Impairment | None = None, mtu: int = 1500, detach: bool = False,
                 host_count: int | None = None) -> None:
        """``mtu``: of every link, the hosts' and the guests' (9000: jumbo frames, 4096-byte RoCE packets);
        ``host_count``: hosts in all, some of them with no guest yet (where migrate() can take one);
        ``detach``: the guests and backends outlive this process (`vrdma vm up --hosts`), and so do the fabric's
        namespaces until `vrdma vm down` removes them."""
        self.detach = detach
        if not plan:
            raise ValueError("no guests planned")
        self.directory = directory
        self.plan = plan
        self.host_count = max(max(p.host for p in plan) + 1, host_count or 0)
        self.requested_accel = accel
        self.memory_mib = memory_mib
        self.boot_timeout = boot_timeout
        self.products = products
        self.mtu = mtu
        self.fabric = HostNetwork(self.host_count, prefix=prefix, impairment=impairment, mtu=mtu)
        self.identities = [GuestIdentity(i, cidr=f"{guest_subnet(p.host)}.{i + 2}/24",
                                         gateway=f"{guest_subnet(p.host)}.1") for i, p in enumerate(plan)]
        self.backends: dict[int, DaemonProcess] = {}
        self.vms: list[Vm] = []
        self.accel = ""
        self.hosts_of: list[int] = [p.host for p in plan]  # where each guest runs now (migrate() moves them)

    def __getitem__(self, key: int | str) -> Vm:
        return guest_of(self.vms, key)

    def host_directory(self, host: int) -> Path:
        return self.directory / f"h{host}"

    def guests_on(self, host: int) -> list[int]:
        return [i for i, p in enumerate(self.plan) if p.host == host]

    def start(self) -> None:
        products = self.products or Products.load()
        self.accel = accel_probe.choose(self.requested_accel, str(products.qemu["binary_path"]),
                                        list(products.qemu["firmware_dirs"]), str(products.kernel["vmlinuz_path"]))
        self.fabric.start()
        self.prepare_hosts()
        for k, host in enumerate(self.fabric.hosts):
            mine = self.guests_on(k)
            vrdma = [self.identities[i].ip for i in mine if not self.plan[i].rxe]
            if vrdma:
                self.backends[k] = self._backend(k, host, [self.identities[i] for i in mine if not self.plan[i].rxe])
        for i, ident in enumerate(self.identities):
            k = self.plan[i].host
            host = self.fabric[k]
            self.vms.append(Vm(ident, self.host_directory(k) / ident.name, accel=self.accel, products=products,
                               link_remote="", memory_mib=self.memory_mib, boot_timeout=self.boot_timeout,
                               with_device=not self.plan[i].rxe, tap=f"tap{i}", wrapper=host.command([]),
                               detach=self.detach))
        for vm in self.vms:
            vm.launch()  # from this thread: QEMU's parent-death signal follows the launching thread
        with concurrent.futures.ThreadPoolExecutor(len(self.vms)) as pool:
            errors = [f.exception() for f in [pool.submit(vm.wait_ready) for vm in self.vms]]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        for i, vm in enumerate(self.vms):
            if self.mtu != 1500:
                vm.run(["ip", "link", "set", "eth0", "mtu", str(self.mtu)]).check(f"ip link set eth0 mtu {self.mtu}")
            if self.plan[i].rxe:
                add_rxe(vm)
        log.info("%d guests on %d hosts: %s", len(self.vms), self.host_count,
                 ", ".join(f"{vm.name}@h{p.host} {vm.address}{' (rxe)' if p.rxe else ''}"
                           for vm, p in zip(self.vms, self.plan, strict=True)))

    def prepare_hosts(self) -> None:
        """Make each host of the (started) fabric a home for its guests (host_commands): the step of start() before
        any backend or guest, which a test runs alone."""
        addresses = [h.address for h in self.fabric.hosts]
        for k, host in enumerate(self.fabric.hosts):
            mine = self.guests_on(k)
            vrdma = [self.identities[i].ip for i in mine if not self.plan[i].rxe]
            run_on(host, host_commands(k, addresses, vrdma, [f"tap{i}" for i in mine], self.mtu))

    def _backend(self, k: int, host: Host, identities: list[GuestIdentity]) -> DaemonProcess:
        directory = self.host_directory(k)
        backend = DaemonProcess([Served(i.name, daemon.socket_path(directory, i), i.mac) for i in identities],
                                log_file=directory / "backend.log", admin_socket=directory / "backend" / "admin.sock",
                                doorbell_dir=directory / "backend", roce=True, detach=self.detach,
                                launcher=host.command([sys.executable, "-m", "vrdma.cli"]))
        backend.start()
        return backend

    def backend_on(self, host: int) -> DaemonProcess:
        """Host ``host``'s backend, started (with no VM) if it has none yet: where a guest migrates to, or where
        containers are added (vrdma.harness.container)."""
        if host not in self.backends:
            self.backends[host] = self._backend(host, self.fabric[host], [])
        return self.backends[host]

    def migrate(self, key: int | str, to_host: int, **options: Any) -> dict[str, Any]:
        """Live-migrate a vrdma guest to host ``to_host`` (move_guest; ``options``: Vm.migrate_to's), starting a
        backend there first if the host has none. Returns query-migrate's last answer."""
        vm = self[key]
        index = self.vms.index(vm)
        source = self.hosts_of[index]
        if self.plan[index].rxe:
            raise ValueError(f"{vm.name} has no vrdma device (rxe): nothing of vrdma's to migrate")
        if not 0 <= to_host < self.host_count or to_host == source:
            raise ValueError(f"{vm.name} cannot move to host {to_host}: it runs on h{source}, of "
                             f"{self.host_count} hosts")
        identity = self.identities[index]
        self.backend_on(to_host)
        destination, info = move_guest(
            vm, Move(identity.ip, identity.mac, f"tap{index}", self.fabric.hosts, source, to_host,
                     [self.backends[k].admin_socket for k in (source, to_host)],
                     self.host_directory(to_host), self.mtu), **options)
        self.vms[index] = destination
        self.hosts_of[index] = to_host
        return info

    def stop(self) -> None:
        for vm in self.vms:
            with contextlib.suppress(Exception):
                vm.shutdown()
        for backend in self.backends.values():
            with contextlib.suppress(Exception):
                backend.stop()
        self.backends = {}
        self.fabric.stop()


def run_on(host: Host, commands: list[list[str]]) -> None:
    """``commands`` in ``host``, in order; each run of `ip` commands in one `ip -batch` (one process: a few ms)."""
    batch: list[str] = []

    def run(argv: list[str], script: str | None = None) -> None:
        result = subprocess.run(host.command(argv), input=script, capture_output=True, text=True, timeout=60,
                                check=False)
        if result.returncode != 0:
            raise HostNetworkError(f"{host.name}: `{' '.join(argv)}` of {script!r} failed: {result.stderr.strip()}")

    for argv in [*commands, ["end"]]:
        if argv[0] == "ip":
            batch.append(" ".join(argv[1:]) + "\n")
            continue
        if batch:
            run(["ip", "-batch", "-"], "".join(batch))
            batch = []
        if argv != ["end"]:
            run(argv)


@dataclass(frozen=True)
class Move:
    """A vrdma guest's move between hosts of a fabric: its address, MAC and tap; the hosts, where it runs and where
    it goes; the admin sockets of the two hosts' backends (source, destination); where the destination QEMU's
    directory goes, and the links' MTU."""

    address: str
    mac: str
    tap: str
    hosts: list[Host]
    source: int
    to: int
    admin_sockets: list[Path]
    directory: Path
    mtu: int = 1500


def move_guest(vm: Vm, move: Move, **options: Any) -> tuple[Vm, dict[str, Any]]:
    """Live-migrate ``vm`` to another host (Vm.migrate_to, ``options`` its own), its device's state travelling in
    QEMU's stream to that host's backend, which is given the VM (vm-add). The destination host takes the guest's
    tap, address and RoCE before it comes; the source host and every other one route the address to it as soon as
    QEMU reports the migration done (what an operator's network does: docs/migration.md), since RC retransmission
    covers what the peers sent to the old host only while their QPs have retries left (ibv_rc_pingpong's: 8 tries
    of 67 ms). The source's backend forgets the VM. Returns the guest as it runs now, and query-migrate's last
    answer; a migration that fails leaves the guest where it ran, and the destination host as it was."""
    from vrdma.daemon.admin import ask

    name, to_host = vm.name, move.hosts[move.to]
    run_on(to_host, arrival_commands(move.address, move.tap, move.mtu))
    socket_path = move.directory / name / "vrdma.sock"
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    reply = ask(move.admin_sockets[1], {"command": "vm-add", "name": name, "mac": move.mac,
                                        "socket-path": str(socket_path)})
    if not reply.get("ok"):
        to_host.run(["ip", "link", "del", move.tap])
        raise VrdmaError(f"{to_host.name}'s backend refused {name}: {reply.get('error')}")
    destination = vm.incoming_copy(migration_directory(move.directory, name), vrdma_socket=socket_path,
                                   wrapper=to_host.command([]))

    def follow() -> None:
        for k, other in enumerate(move.hosts):
            if k not in (move.source, move.to):
                run_on(other, elsewhere_commands(move.address, to_host.address))
        run_on(move.hosts[move.source], departure_commands(move.address, to_host.address))

    try:
        info = vm.migrate_to(destination, after_switchover=follow, **options)
    except Exception:
        with contextlib.suppress(Exception):
            ask(move.admin_sockets[1], {"command": "vm-remove", "name": name})
        for argv in (roce_rule("del", move.address), ["ip", "link", "del", move.tap]):
            to_host.run(argv)
        raise
    move.hosts[move.source].run(["ip", "link", "del", move.tap])  # (the source QEMU, its user, has quit)
    ask(move.admin_sockets[0], {"command": "vm-remove", "name": name})
    log.info("%s migrated from %s to %s: %s ms in all, %s ms down", name, move.hosts[move.source].name,
             to_host.name, info.get("total-time"), info.get("downtime"))
    return destination, info
