"""The harness's hosts (vrdma.harness.hosts): network namespaces on one bridge, reachable from each other, and gone
after the fabric's block, even when the block fails."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from pyroute2 import netns

from vrdma.harness.hosts import Fabric

pytestmark = [pytest.mark.backend,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")]

UDP_ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 7000))
s.settimeout(float(sys.argv[2]))
print("ready", flush=True)
try:
    data, peer = s.recvfrom(100)
    print(data.decode(), flush=True)
except TimeoutError:
    print("nothing", flush=True)
"""

UDP_SEND = """
import socket, sys
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(sys.argv[2].encode(), (sys.argv[1], 7000))
"""


def exchange(fabric: Fabric, text: str, wait: float = 10.0) -> str:
    """What host 1 received of a datagram host 0 sent it ("nothing" within `wait` seconds)."""
    receiver = fabric[1].popen([sys.executable, "-c", UDP_ECHO, fabric[1].address, str(wait)])
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        sent = fabric[0].run([sys.executable, "-c", UDP_SEND, fabric[1].address, text])
        assert sent.returncode == 0, sent.stderr
        return receiver.stdout.readline().strip()
    finally:
        receiver.kill()
        receiver.wait()


def test_hosts_reach_each_other_over_the_bridge_and_nothing_else() -> None:
    with Fabric(3, prefix=f"vt{os.getpid() % 10000}") as fabric:
        assert [h.address for h in fabric.hosts] == ["10.98.0.1", "10.98.0.2", "10.98.0.3"]
        assert exchange(fabric, "over the bridge") == "over the bridge"
        # A host's namespace has its link and loopback, and no route out of the fabric.
        routes = fabric[0].run(["ip", "-4", "route"]).stdout
        assert routes.strip() == "10.98.0.0/24 dev eth0 proto kernel scope link src 10.98.0.1", routes
    assert not [n for n in netns.listnetns() if n.startswith(fabric.prefix)]


def test_a_failing_block_leaves_no_namespace_behind() -> None:
    prefix = f"vf{os.getpid() % 10000}"
    with pytest.raises(RuntimeError), Fabric(2, prefix=prefix):
        raise RuntimeError("the test failed")
    assert not [n for n in netns.listnetns() if n.startswith(prefix)]
