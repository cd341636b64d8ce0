"""The RC data path in guests: unmodified libibverbs programs over vrdma0, between two guests and between two
processes of one guest (posting and polling in user space, the backend's engine moving the bytes)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Products, Vm

pytestmark = pytest.mark.vm
log = logging.getLogger(__name__)

DEVICE = "vrdma0"
PLACES = ["two guests", "one guest"]
PERFTEST_TOOLS = ["ib_send_bw", "ib_write_bw", "ib_read_bw", "ib_atomic_bw", "ib_send_lat", "ib_write_lat",
                  "ib_read_lat"]


@pytest.fixture(scope="module")
def guests(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(2, tmp_path_factory.mktemp("datapath"), products=products) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def gid(guests: Cluster) -> int:
    indexes = {verbs.ipv4_gid_index(vm, DEVICE) for vm in guests}
    assert len(indexes) == 1, indexes
    return indexes.pop()


def ends(guests: Cluster, place: str) -> tuple[Vm, Vm]:
    return (guests[0], guests[1]) if place == "two guests" else (guests[0], guests[0])


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize(("size", "iterations", "extra"), [
    (4096, 1000, ()),                # ibv_rc_pingpong's defaults
    (65536, 1000, ()),
    (4096, 1000, ("-e",)),           # sleep on the completion channel instead of polling
], ids=["defaults", "64KiB-x1000", "events"])
def test_rc_pingpong(guests: Cluster, gid: int, place: str, size: int, iterations: int,
                     extra: tuple[str, ...]) -> None:
    server, client = ends(guests, place)
    # -c: both sides check every byte they receive.
    result = verbs.rc_pingpong(server, client, DEVICE, gid, size=size, iterations=iterations, extra=("-c", *extra))
    assert result.iterations == iterations
    log.info("vrdma ibv_rc_pingpong %s, %d B %s: %.1f Mbit/s, %.1f usec/iter", place, size, " ".join(extra),
             result.mbit_per_s, result.usec_per_iter)


@pytest.mark.parametrize("place", PLACES)
def test_srq_pingpong(guests: Cluster, gid: int, place: str) -> None:
    server, client = ends(guests, place)
    _, out = verbs.client_server(server, client, ["ibv_srq_pingpong", "-d", DEVICE, "-g", str(gid)])
    assert re.search(r"\d+ iters in [\d.]+ seconds", out.stdout), out.stdout


@pytest.mark.parametrize("mode", ["defaults", "all sizes"])
@pytest.mark.parametrize("tool", PERFTEST_TOOLS)
def test_perftest(guests: Cluster, gid: int, tool: str, mode: str) -> None:
    argv = [tool, "-d", DEVICE, "-x", str(gid), "-F", *(["-a"] if mode == "all sizes" else [])]
    server, client = guests[0], guests[1]
    if tool == "ib_atomic_bw" and mode == "all sizes":
        # Atomics are 8 bytes by definition: perftest itself refuses -a, whatever the device.
        refused = server.run(argv)
        assert refused.exit_status != 0 and "Message size cannot be changed for Atomic tests" in refused.stdout
        return
    _, out = verbs.client_server(server, client, argv, timeout=900)
    rows = re.findall(r"^\s*(\d+)\s+(\d+)\s+[\d.]+", out.stdout, flags=re.M)
    assert rows, out.stdout
    sizes = [int(size) for size, _ in rows]
    if mode == "all sizes":
        smallest = 8 if tool == "ib_atomic_bw" else 2
        assert sizes[0] == smallest and len(sizes) > 1, sizes  # every size up to the largest ran
    log.info("%s %s: %d result rows, sizes %d..%d", tool, mode, len(rows), sizes[0], sizes[-1])


ISOLATION = (Path(__file__).parents[1] / "guest" / "isolation.py").read_text()
REM_ACCESS_ERR = 10  # IBV_WC_REM_ACCESS_ERR


def test_a_guest_cannot_touch_memory_it_was_not_granted(guests: Cluster, gid: int) -> None:
    victim, attacker = guests[0], guests[1]
    argv = ["python3", "-c", ISOLATION, "victim", str(gid), "18600"]
    victim_pid = victim.agent.spawn(argv)
    try:
        verbs.wait_listening(victim, 18600, server_pid=victim_pid)
        attack = attacker.run(["python3", "-c", ISOLATION, "attacker", str(gid), victim.address, "18600"],
                              timeout=300)
        defended = victim.agent.wait(victim_pid, argv, 300)
    except BaseException:
        victim.agent.kill(victim_pid)
        raise
    assert attack.exit_status == 0 and defended.exit_status == 0, (attack, defended)
    statuses = json.loads(attack.stdout)
    report = json.loads(defended.stdout)
    # Every attack completed with a remote access error ...
    assert {k: v for k, v in statuses.items() if k != "legitimate / write"} == {
        f"{kind} / {op}": REM_ACCESS_ERR for kind in ("wrong rkey", "rkey of another PD", "past the end",
                                                    "no remote access") for op in ("write", "read")}, statuses
    # ... not one byte of the victim's memory changed ...
    assert report["before"] == report["after"]
    # ... and the backend still serves both: a legitimate write afterwards lands.
    assert statuses["legitimate / write"] == 0 and report["scratch"] == "written by the attacker, legally"
