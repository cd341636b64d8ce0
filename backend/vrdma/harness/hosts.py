"""Hosts for tests that need more than one: network namespaces on one L2 segment, each a place to run a backend
and its guests, rxe, iperf3. A switch namespace holds a Linux bridge; each host namespace has an `eth0` (one end
of a veth pair, the other end a port of the bridge) with an address of the fabric's subnet; pyroute2 configures
namespaces, links and addresses. The fabric is a context manager (harness.process.Managed): its namespaces go
when it exits, and with them every link it made, even after a failure.

Impairments (loss, duplication, reordering, delay) are not tc netem's here: this machine's kernel has no sch_netem
(docs/interhost.md). A fabric given an Impairment joins its hosts with vrdma.harness.impair's user-space switch
instead of the bridge, and stops it on exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pyroute2 import Ethtool, IPRoute, NetlinkError, NetNS, netns

from vrdma.errors import VrdmaError
from vrdma.harness.impair import Impairment
from vrdma.harness.process import Managed, die_with_parent

SWITCH_BRIDGE = "br0"
HOST_LINK = "eth0"
NUD_PERMANENT = 0x80
# What a host's link must do itself when a user-space switch carries its frames: a veth hands its peer packets
# with checksums not yet computed and segments not yet cut (the kernel finishes them further on), which a socket
# forwarding raw frames would pass on unfinished.
OFFLOADS = ("tx-checksum-ip-generic", "tx-checksum-ipv4", "tx-checksum-ipv6", "tx-generic-segmentation",
            "tx-tcp-segmentation", "tx-tcp6-segmentation", "tx-udp-segmentation")


class HostNetworkError(VrdmaError):
    """A namespace, link, address or impairment could not be set up; the message says which and why."""


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    address: str
    prefixlen: int

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` as it runs inside this host."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, check=False)

    def popen(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class HostNetwork(Managed):
    """``count`` hosts (``<prefix>-h0`` ...) on one bridge (in ``<prefix>-sw``), addresses from ``subnet``."""

    def __init__(self, count: int, subnet: str = "10.98.0.0/24", prefix: str | None = None,
                 impairment: Impairment | None = None, mtu: int = 1500) -> None:
        """``mtu``: of every link of the fabric (9000: jumbo frames, RoCE's 4096-byte path MTU)."""
        self.impairment = impairment
        self.mtu = mtu
        self.switch_process: subprocess.Popen[str] | None = None
        # What the impairing switch did, once it stopped: IP frames passed, lost, duplicated, reordered.
        self.switch_counters: dict[str, int] | None = None
        if not 1 <= count <= 16:
            raise ValueError(f"a fabric of {count} hosts (1 to 16)")
        self.prefix = prefix or f"vrdma{os.getpid() % 100000}"
        self.subnet = ipaddress.ip_network(subnet)
        addresses = list(self.subnet.hosts())
        self.switch = f"{self.prefix}-sw"
        self.hosts = [Host(f"h{i}", f"{self.prefix}-h{i}", str(addresses[i]), self.subnet.prefixlen)
                      for i in range(count)]
        # The switch's ends of the hosts' veths: names of this fabric's own (at most 15 bytes, as Linux allows).
        tag = hashlib.sha256(self.prefix.encode()).hexdigest()[:8]
        self.ports = [f"v{tag}p{i}" for i in range(count)]

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def start(self) -> None:
        """Make the namespaces and links. A veth's name is the fabric's own (its prefix's hash), not the `port0`
        every fabric had: two fabrics set up at once took each other's veths in the root namespace (`port0` moved
        into the other's switch, or "File exists")."""
        taken = set(netns.listnetns()) & {self.switch, *(h.netns for h in self.hosts)}
        if taken:
            raise HostNetworkError(f"network namespaces {', '.join(sorted(taken))} exist already (another fabric's?)")
        for name in (self.switch, *(h.netns for h in self.hosts)):
            with self._step(f"creating network namespace {name}"):
                netns.create(name)
        with self._step(f"creating bridge {SWITCH_BRIDGE} in {self.switch}"), NetNS(self.switch) as sw:
            sw.link("add", ifname=SWITCH_BRIDGE, kind="bridge")
            sw.link("set", index=self._index(sw, SWITCH_BRIDGE, self.switch), state="up")
        with self._step(f"turning off netfilter on bridged frames in {self.switch}"):
            self._plain_bridge()
        for host, port in zip(self.hosts, self.ports, strict=True):
            with self._step(f"creating veth {port} with its peer {HOST_LINK} in {host.netns}"), IPRoute() as ipr:
                # Made here, its peer straight in the host's namespace, the switch's end then moved. The name is the
                # fabric's own, so two fabrics set up at once never meet here.
                ipr.link("add", ifname=port, kind="veth", peer={"ifname": HOST_LINK, "net_ns_fd": host.netns})
                ipr.link("set", index=self._index(ipr, port, "the root namespace"), net_ns_fd=self.switch)
            with self._step(f"attaching {port} in {self.switch}"), NetNS(self.switch) as sw:
                index = self._index(sw, port, self.switch)
                sw.link("set", index=index, mtu=self.mtu)
                if self.impairment is None:
                    sw.link("set", index=index, master=self._index(sw, SWITCH_BRIDGE, self.switch))
                sw.link("set", index=index, state="up")
            with self._step(f"configuring {HOST_LINK} ({host.address}/{host.prefixlen}) in {host.netns}"), \
                    NetNS(host.netns) as ns:
                index = self._index(ns, HOST_LINK, host.netns)
                ns.link("set", index=index, mtu=self.mtu)
                ns.addr("add", index=index, address=host.address, prefixlen=host.prefixlen)
                ns.link("set", index=index, state="up")
                ns.link("set", index=self._index(ns, "lo", host.netns), state="up")
        with self._step("adding permanent neighbour entries"):
            self._neighbours()
        if self.impairment is not None:
            for host in self.hosts:
                with self._step(f"turning off {HOST_LINK}'s offloads in {host.netns}"):
                    self._no_offloads(host)
            self._start_switch(self.impairment)

    @staticmethod
    @contextlib.contextmanager
    def _step(what: str) -> Iterator[None]:
        """A set-up step: what the kernel (or pyroute2) answered becomes a HostNetworkError naming the step."""
        try:
            yield
        except HostNetworkError:
            raise
        except (NetlinkError, OSError, IndexError, ValueError) as err:
            raise HostNetworkError(f"{what}: {type(err).__name__}: {err}") from err

    @staticmethod
    def _index(ns: NetNS | IPRoute, ifname: str, where: str) -> int:
        found = ns.link_lookup(ifname=ifname)
        if not found:
            raise HostNetworkError(f"no link {ifname} in {where} (links there: "
                              f"{', '.join(sorted(link.get_attr('IFLA_IFNAME') for link in ns.get_links()))})")
        return int(found[0])

    def _neighbours(self) -> None:
        """Every host knows every other's MAC address from the start (permanent neighbour entries): no ARP on the
        fabric, so that a burst sent before a neighbour is resolved is not cut short by the kernel's queue of
        unresolved packets, and a fault under test is the only one."""
        macs = {}
        for host in self.hosts:
            with NetNS(host.netns) as ns:
                macs[host.name] = ns.get_links(self._index(ns, HOST_LINK, host.netns))[0].get_attr("IFLA_ADDRESS")
        for host in self.hosts:
            with NetNS(host.netns) as ns:
                index = self._index(ns, HOST_LINK, host.netns)
                for other in self.hosts:
                    if other is not host:
                        ns.neigh("add", dst=other.address, lladdr=macs[other.name], ifindex=index,
                                 state=NUD_PERMANENT)

    def _plain_bridge(self) -> None:
        """The bridge forwards frames as a switch does, without passing them through iptables: where the host has
        br_netfilter loaded (Docker loads it), every new namespace starts with its `bridge-nf-call-*` on, and the
        switch then ran the hosts' every frame through netfilter (16% of a RoCE sender's time in the between-
        backends benchmark, docs/performance.md): a cost no real switch puts on the hosts' path."""
        netns.pushns(self.switch)
        try:
            for family in ("arptables", "iptables", "ip6tables"):
                path = f"/proc/sys/net/bridge/bridge-nf-call-{family}"
                if os.path.exists(path):  # (no br_netfilter on this host: nothing to turn off)
                    with open(path, "w") as knob:
                        knob.write("0")
        finally:
            netns.popns()

    @staticmethod
    def _no_offloads(host: Host) -> None:
        netns.pushns(host.netns)
        try:
            with contextlib.closing(Ethtool()) as ethtool:
                features = ethtool.get_features(HOST_LINK)
                for name in OFFLOADS:
                    if name in features.features:
                        features.features[name].enable = False
                ethtool.set_features(HOST_LINK, features)
        finally:
            netns.popns()

    def _start_switch(self, impairment: Impairment) -> None:
        ports = [arg for port in self.ports for arg in ("--port", port)]
        self.switch_process = subprocess.Popen(
            ["ip", "netns", "exec", self.switch, sys.executable, "-m", "vrdma.harness.impair", *ports,
             *impairment.argv()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=die_with_parent)  # (a crashed test leaves no switch behind)
        assert self.switch_process.stdout is not None and self.switch_process.stderr is not None
        if self.switch_process.stdout.readline().strip() != "ready":
            self.switch_process.wait()
            raise HostNetworkError(f"the impairing switch did not start: {self.switch_process.stderr.read()}")

    def stop(self) -> None:
        """Remove the fabric's namespaces (their links go with them); quietly for what was never made."""
        if self.switch_process is not None:
            self.switch_process.terminate()
            out, _ = self.switch_process.communicate(timeout=30)
            self.switch_counters = next((json.loads(line.split(None, 1)[1]) for line in out.splitlines()
                                         if line.startswith("counters ")), None)
            self.switch_process = None
        existing = set(netns.listnetns())
        for name in (*(h.netns for h in self.hosts), self.switch):
            if name in existing:
                netns.remove(name)
