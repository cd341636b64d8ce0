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
import sys
from dataclasses import dataclass
from pathlib import Path

from vrdma.harness import accel as accel_probe
from vrdma.harness import daemon
from vrdma.harness.daemon import DaemonProcess, Served
from vrdma.harness.hosts import HOST_LINK, Host, HostNetwork, HostNetworkError
from vrdma.harness.impair import Impairment
from vrdma.harness.process import Managed
from vrdma.harness.qemu_cmdline import GuestIdentity
from vrdma.harness.verbs import add_rxe
from vrdma.harness.vm import Products, Vm

log = logging.getLogger(__name__)

GUEST_BRIDGE = "guests"
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
    commands = [["ip", "link", "add", GUEST_BRIDGE, "mtu", str(mtu), "type", "bridge"],
                ["ip", "addr", "add", f"{net}.1/24", "dev", GUEST_BRIDGE],
                ["ip", "link", "set", GUEST_BRIDGE, "up"]]
    for tap in guest_taps:
        # Isolated ports: guests of one host reach each other through the host's IP layer (which answers their
        # ARP for each other: proxy_arp_pvlan), never straight across the bridge, so that RoCE for a vrdma guest
        # meets the rule below even from its neighbour.
        commands += [["ip", "tuntap", "add", "dev", tap, "mode", "tap"],
                     ["ip", "link", "set", tap, "mtu", str(mtu), "master", GUEST_BRIDGE, "up"],
                     ["bridge", "link", "set", "dev", tap, "isolated", "on"]]
    commands += [["sysctl", "-qw", "net.ipv4.ip_forward=1", f"net.ipv4.conf.{GUEST_BRIDGE}.proxy_arp_pvlan=1",
                  f"net.ipv4.conf.{GUEST_BRIDGE}.send_redirects=0", "net.ipv4.conf.all.send_redirects=0"]]
    for other, address in enumerate(hosts):
        if other != host:
            commands.append(["ip", "route", "add", f"{guest_subnet(other)}.0/24", "via", address, "dev", HOST_LINK])
    if vrdma_guests:
        commands.append(["ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", str(ROCE_TABLE)])
    for guest in vrdma_guests:
        commands.append(["ip", "rule", "add", "to", f"{guest}/32", "ipproto", "udp", "dport", "4791", "lookup",
                         str(ROCE_TABLE), "priority", str(ROCE_RULE_PRIORITY)])
    return commands


class MultiHost(Managed):
    """``with MultiHost(directory, [GuestPlan(0), GuestPlan(1)]) as mh:`` boots vm0 on host h0 and vm1 on h1, each
    host with its own backend, and waits until every guest is ready; ``mh.vms[i]``, ``mh.fabric[k]``."""

    def __init__(self, directory: Path, plan: list[GuestPlan], *, accel: str = "auto", memory_mib: int = 1024,
                 boot_timeout: float = 120.0, products: Products | None = None, prefix: str | None = None,
                 impairment: Impairment | None = None, mtu: int = 1500, detach: bool = False) -> None:
        """``mtu``: of every link, the hosts' and the guests' (9000: jumbo frames, 4096-byte RoCE packets);
        ``detach``: the guests and backends outlive this process (`vrdma vm up --hosts`), and so do the fabric's
        namespaces until `vrdma vm down` removes them."""
        self.detach = detach
        if not plan:
            raise ValueError("no guests planned")
        self.directory = directory
        self.plan = plan
        self.host_count = max(p.host for p in plan) + 1
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
            for argv in host_commands(k, addresses, vrdma, [f"tap{i}" for i in mine], self.mtu):
                result = host.run(argv)
                if result.returncode != 0:
                    raise HostNetworkError(f"{host.name}: `{' '.join(argv)}` failed: {result.stderr.strip()}")

    def _backend(self, k: int, host: Host, identities: list[GuestIdentity]) -> DaemonProcess:
        directory = self.host_directory(k)
        backend = DaemonProcess([Served(i.name, daemon.socket_path(directory, i), i.mac) for i in identities],
                                log_file=directory / "backend.log", admin_socket=directory / "backend" / "admin.sock",
                                doorbell_dir=directory / "backend", roce=True, detach=self.detach,
                                launcher=host.command([sys.executable, "-m", "vrdma.cli"]))
        backend.start()
        return backend

    def stop(self) -> None:
        for vm in self.vms:
            with contextlib.suppress(Exception):
                vm.shutdown()
        for backend in self.backends.values():
            with contextlib.suppress(Exception):
                backend.stop()
        self.backends = {}
        self.fabric.stop()
