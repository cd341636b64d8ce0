"""The harness's hosts (vrdma.harness.hosts): network namespaces on one bridge, reachable from each other, and gone
after the fabric's block, even when the block fails; and the user-space switch (vrdma.harness.impair) that loses,
duplicates, reorders and delays what it is told to."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from pyroute2 import netns

from vrdma.harness.hosts import Fabric
from vrdma.harness.impair import Impairment

pytestmark = [pytest.mark.backend,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")]

UDP_COLLECT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 7000))
s.settimeout(float(sys.argv[2]))
print("ready", flush=True)
try:
    while True:
        print(s.recv(100).decode(), flush=True)
except TimeoutError:
    print("-", flush=True)
"""

UDP_SEND_MANY = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(str(i).encode(), (sys.argv[1], 7000))
"""


def test_hosts_reach_each_other_over_the_bridge_and_nothing_else() -> None:
    with Fabric(3, prefix=f"vt{os.getpid() % 10000}") as fabric:
        assert [h.address for h in fabric.hosts] == ["10.98.0.1", "10.98.0.2", "10.98.0.3"]
        assert collect(fabric, 3) == [0, 1, 2]
        # A host's namespace has its link and loopback, and no route out of the fabric.
        routes = fabric[0].run(["ip", "-4", "route"]).stdout
        assert routes.strip() == "10.98.0.0/24 dev eth0 proto kernel scope link src 10.98.0.1", routes
    assert not [n for n in netns.listnetns() if n.startswith(fabric.prefix)]


def test_a_failing_block_leaves_no_namespace_behind() -> None:
    prefix = f"vf{os.getpid() % 10000}"
    with pytest.raises(RuntimeError), Fabric(2, prefix=prefix):
        raise RuntimeError("the test failed")
    assert not [n for n in netns.listnetns() if n.startswith(prefix)]


def collect(fabric: Fabric, count: int, idle: float = 1.0) -> list[int]:
    """The datagrams (numbered 0 .. count-1) host 1 received, in order, of `count` host 0 sent back to back."""
    receiver = fabric[1].popen([sys.executable, "-c", UDP_COLLECT, fabric[1].address, str(idle)])
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        sent = fabric[0].run([sys.executable, "-c", UDP_SEND_MANY, fabric[1].address, str(count)])
        assert sent.returncode == 0, sent.stderr
        got = []
        for line in receiver.stdout:
            if line.strip() == "-":
                break
            got.append(int(line))
        return got
    finally:
        receiver.kill()
        receiver.wait()


@pytest.mark.parametrize("impairment", [Impairment(), Impairment(loss=1.0), Impairment(loss=0.3, seed=7),
                                        Impairment(duplicate=1.0), Impairment(reorder=0.5, seed=3),
                                        Impairment(delay_ms=20)],
                         ids=["none", "all lost", "30% lost", "all duplicated", "half reordered", "20 ms delay"])
def test_the_impairing_switch_does_what_it_is_told(impairment: Impairment) -> None:
    with Fabric(2, prefix=f"vi{os.getpid() % 10000}", impairment=impairment) as fabric:
        got = collect(fabric, 100)
    if impairment.loss == 1.0:
        assert got == []
    elif impairment.loss:
        assert 45 <= len(got) <= 95 and got == sorted(got) and len(set(got)) == len(got), got
    elif impairment.duplicate:
        assert got == [i for i in range(100) for _ in (0, 1)]
    elif impairment.reorder:
        assert sorted(got) == list(range(100)) and got != list(range(100)), got
    else:
        assert got == list(range(100))
    assert fabric.switch_process is None and not [n for n in netns.listnetns() if n.startswith(fabric.prefix)]
