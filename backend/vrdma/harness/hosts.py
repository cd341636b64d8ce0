"""Hosts for tests that need more than one: network namespaces on one L2 segment, each a place to run a backend
and its guests, rxe, iperf3. A switch namespace holds a Linux bridge; each host namespace has an `eth0` (one end
of a veth pair, the other end a port of the bridge) with an address of the fabric's subnet; pyroute2 configures
namespaces, links and addresses. The fabric is a context manager: its namespaces go when it exits, and with them
every link it made, even after a failure.

Impairments (loss, duplication, reordering, delay) are not tc netem's here: this machine's kernel has no sch_netem
(docs/interhost.md); they will come from a user-space switch between the hosts instead.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from pyroute2 import IPRoute, NetNS, netns

from vrdma.errors import VrdmaError

SWITCH_BRIDGE = "br0"
HOST_LINK = "eth0"


class FabricError(VrdmaError):
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


class Fabric:
    """``count`` hosts (``<prefix>-h0`` ...) on one bridge (in ``<prefix>-sw``), addresses from ``subnet``."""

    def __init__(self, count: int, subnet: str = "10.98.0.0/24", prefix: str | None = None) -> None:
        if not 1 <= count <= 16:
            raise ValueError(f"a fabric of {count} hosts (1 to 16)")
        self.prefix = prefix or f"vrdma{os.getpid() % 100000}"
        self.subnet = ipaddress.ip_network(subnet)
        addresses = list(self.subnet.hosts())
        self.switch = f"{self.prefix}-sw"
        self.hosts = [Host(f"h{i}", f"{self.prefix}-h{i}", str(addresses[i]), self.subnet.prefixlen)
                      for i in range(count)]

    def __enter__(self) -> Fabric:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def _build(self) -> None:
        taken = set(netns.listnetns()) & {self.switch, *(h.netns for h in self.hosts)}
        if taken:
            raise FabricError(f"network namespaces {', '.join(sorted(taken))} exist already (another fabric's?)")
        for name in (self.switch, *(h.netns for h in self.hosts)):
            netns.create(name)
        with NetNS(self.switch) as sw:
            sw.link("add", ifname=SWITCH_BRIDGE, kind="bridge")
            sw.link("set", index=sw.link_lookup(ifname=SWITCH_BRIDGE)[0], state="up")
        for i, host in enumerate(self.hosts):
            port = f"port{i}"
            with IPRoute() as ipr:  # made here, then each end moved to its namespace
                ipr.link("add", ifname=port, kind="veth", peer={"ifname": HOST_LINK, "net_ns_fd": host.netns})
                ipr.link("set", index=ipr.link_lookup(ifname=port)[0], net_ns_fd=self.switch)
            with NetNS(self.switch) as sw:
                index = sw.link_lookup(ifname=port)[0]
                sw.link("set", index=index, master=sw.link_lookup(ifname=SWITCH_BRIDGE)[0])
                sw.link("set", index=index, state="up")
            with NetNS(host.netns) as ns:
                index = ns.link_lookup(ifname=HOST_LINK)[0]
                ns.addr("add", index=index, address=host.address, prefixlen=host.prefixlen)
                ns.link("set", index=index, state="up")
                ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")

    def close(self) -> None:
        """Remove the fabric's namespaces (their links go with them); quietly for what was never made."""
        existing = set(netns.listnetns())
        for name in (*(h.netns for h in self.hosts), self.switch):
            if name in existing:
                netns.remove(name)
