"""Containers on the same device (issue 29, docs/containers.md): Debian's unmodified verbs programs in containers
made with `ip netns` and `unshare` (vrdma.harness.container), on hosts of the multi-host harness whose kernel has no
RDMA at all, reaching each other, a VM and another host through the backends' container channel.

vm0 runs on h0; containers c0 and c1 on h0, c2 on h1 (whose backend serves no VM). Every pair exchanges its QP
numbers over TCP as the programs do (the containers' veths and vm0's tap are ports of their host's guest bridge).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from polling import wait_until

from vrdma.daemon.admin import ask
from vrdma.harness.container import PORT, Container, ContainerError, Side, client_server, root_filesystem
from vrdma.harness.container import run_in as run
from vrdma.harness.multihost import GuestPlan, MultiHost, guest_subnet
from vrdma.harness.vm import Products, Vm

pytestmark = pytest.mark.vm



@dataclass
class Site:
    mh: MultiHost
    c0: Container
    c1: Container
    c2: Container

    @property
    def vm0(self) -> Vm:
        return self.mh[0]


@pytest.fixture(scope="module")
def site(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    directory = tmp_path_factory.mktemp("containers")
    with MultiHost(directory, [GuestPlan(0)], products=products, host_count=2) as mh:
        root = root_filesystem()
        made = []
        try:
            for name, host, last in (("c0", 0, 200), ("c1", 0, 201), ("c2", 1, 200)):
                container = Container(name, mh.fabric[host], f"{guest_subnet(host)}.{last}",
                                      f"{guest_subnet(host)}.1", mh.backend_on(host).admin_socket, directory, root)
                container.start()
                made.append(container)
            yield Site(mh, *made)
        finally:
            for container in reversed(made):
                container.stop()


def pair(server: Side, client: Side, tool: str, *args: str) -> str:
    try:
        return client_server(server, client, tool, *args)
    except ContainerError as err:
        raise AssertionError(str(err)) from None


def listening(side: Container) -> bool:
    out = subprocess.run(["ip", "netns", "exec", side.netns, "ss", "-ltnH"], capture_output=True, text=True,
                         check=False).stdout
    return re.search(rf":{PORT}\s", out) is not None


def counters(side: Container) -> dict[str, Any]:
    reply = ask(side.admin_socket, {"command": "counters"})
    return reply["containers"][side.name]  # type: ignore[no-any-return]


def write_bw(server: Side, client: Side, *, iterations: int = 100) -> float:
    """ib_write_bw of 1 MiB messages: its average MiB/s; the containers' devices moved every byte."""
    watched = [s for s in (server, client) if isinstance(s, Container)]
    before = {s.name: counters(s)["engine"]["bytes"] for s in watched}
    out = pair(server, client, "ib_write_bw", "-s", str(1 << 20), "-n", str(iterations))
    row = re.search(rf"^\s*{1 << 20}\s+{iterations}\s+([\d.]+)\s+([\d.]+)", out, flags=re.M)
    assert row, out
    for s in watched:
        moved = counters(s)["engine"]["bytes"] - before[s.name]
        assert moved >= iterations << 20, f"{s.name}'s device moved {moved} bytes of {iterations} MiB written"
    return float(row.group(2))


def test_containers_on_one_host_run_pingpongs_and_write_bw(site: Site) -> None:
    out = pair(site.c0, site.c1, "ibv_rc_pingpong", "-n", "200", "-c")
    assert "200 iters in" in out, out
    out = pair(site.c1, site.c0, "ibv_ud_pingpong", "-n", "200", "-c")
    assert "200 iters in" in out, out
    assert write_bw(site.c0, site.c1) > 0


def test_blocking_waits_on_a_completion_channel(site: Site) -> None:
    """ibv_rc_pingpong -e: both sides sleep in ibv_get_cq_event on a completion channel (a pipe the backend writes
    each armed CQ's events into: libvrdma-compchan, preloaded by the containers' root) instead of polling."""
    out = pair(site.c0, site.c1, "ibv_rc_pingpong", "-n", "200", "-c", "-e")
    assert "200 iters in" in out, out
    assert counters(site.c1)["channel"]["cq_events_dropped"] == 0


def test_a_container_and_a_vm_run_pingpongs_and_write_bw(site: Site) -> None:
    out = pair(site.vm0, site.c0, "ibv_rc_pingpong", "-n", "100", "-c")
    assert "100 iters in" in out, out
    out = pair(site.c0, site.vm0, "ibv_ud_pingpong", "-n", "100", "-c")
    assert "100 iters in" in out, out
    assert write_bw(site.vm0, site.c0, iterations=50) > 0


def test_a_container_on_another_host_reaches_the_vm_over_roce(site: Site) -> None:
    before = counters(site.c2)["roce"]
    out = pair(site.vm0, site.c2, "ibv_rc_pingpong", "-n", "100", "-c")
    assert "100 iters in" in out, out
    after = counters(site.c2)["roce"]
    # Every message of the ping-pong went over the network, each way (and its acknowledgements).
    assert after["tx_packets"] - before["tx_packets"] >= 100 and after["rx_packets"] - before["rx_packets"] >= 100, \
        (before, after)


def test_a_container_sees_only_its_own_device(site: Site) -> None:
    status, out = run(site.c1, ["ibv_devices"])
    assert status == 0 and "vrdma-c1" in out and "vrdma-c0" not in out, out
    status, out = run(site.c1, ["ls", "/run/vrdma"])
    assert out.split() == ["vrdma-c1.sock"], out
    status, out = run(site.c1, ["ibv_devinfo", "-d", "vrdma-c0"])
    assert status != 0, out


def test_kill_9_of_a_process_frees_its_objects_within_a_second(site: Site) -> None:
    # ibv_rc_pingpong's server makes its objects, then waits for a client that never comes.
    server = site.c0.popen(["ibv_rc_pingpong", "-d", site.c0.device, "-g", "0"])
    try:
        wait_until("ibv_rc_pingpong's objects in c0", lambda: any(p["objects"].get("qp") for p in
                                                               site.c0.describe()["processes"]) or
                   server.poll() is not None, timeout=60, interval=0.1)
        (process,) = site.c0.describe()["processes"]
        assert process["objects"]["qp"] >= 1 and process["objects"]["mr"] >= 1 and process["regions"] >= 2, process
        os.kill(process["pid"], signal.SIGKILL)
        started = time.monotonic()
        wait_until("the killed process's objects freed", lambda: not site.c0.describe()["processes"], timeout=1.0,
                   interval=0.02)
        assert time.monotonic() - started < 1.0
    finally:
        server.kill()
        server.wait()
    objects = counters(site.c0)["objects"]
    assert {k: v for k, v in objects.items() if k != "gid" and v} == {}, objects


def _syscalls(side: Container, server: Container, iterations: int, out: Path) -> dict[str, int]:
    """The system calls of ``side`` (every process of its command, by name) running ib_write_bw with 8-byte WRITEs
    against ``server`` for ``iterations`` (strace -f -c)."""
    args = ["-s", "8", "-n", str(iterations)]
    proc = server.popen(["ib_write_bw", "-d", server.device, "-x", "0", *args])
    try:
        wait_until("ib_write_bw listening", lambda: listening(server) or proc.poll() is not None, timeout=60,
                   interval=0.1)
        client = ["ib_write_bw", "-d", side.device, "-x", "0", *args, server.address]
        done = subprocess.run(["strace", "-f", "-c", "-o", str(out), *side.command(client)], capture_output=True,
                              text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = re.findall(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", out.read_text(), flags=re.M)
    assert rows, out.read_text()
    return {name: int(calls) for calls, name in rows if name != "total"}


def test_no_system_call_on_the_data_path(site: Site, tmp_path: Path) -> None:
    """10,000 more WRITEs posted and their completions polled cost no more system calls but, rarely, the one that
    wakes an engine that parked meanwhile (a write to the device's wake eventfd: what a VM's kick is). A ping-pong
    (ib_write_lat) lets the engine park before nearly every post, and then pays that write each time
    (docs/containers.md)."""
    few = _syscalls(site.c1, site.c0, 100, tmp_path / "few.txt")
    many = _syscalls(site.c1, site.c0, 10_100, tmp_path / "many.txt")
    more = {name: many.get(name, 0) - few.get(name, 0) for name in many.keys() | few.keys()}
    extra = {name: n for name, n in more.items() if n > 0}
    # (perftest sizes per-iteration arrays by -n: a brk or mmap more at its start is no post's)
    assert sum(extra.values()) < 50, f"system calls for 10,000 more posts and polls: {extra}"


def test_a_containers_qos_limit_is_enforced(site: Site) -> None:
    """A container added with a byte limit: its device's WRITEs are held to it (the engine throttles it, as a VM's),
    and the others' are not."""
    limit = 50_000_000  # bytes per second
    host = site.mh.fabric[0]
    with Container("c3", host, f"{guest_subnet(0)}.202", f"{guest_subnet(0)}.1", site.c0.admin_socket,
                   site.c0.directory.parent, site.c0.root,
                   qos={"bytes-per-s": limit, "bytes-burst": 1 << 20}) as c3:  # (no second's worth saved up)
        out = pair(site.c0, c3, "ib_write_bw", "-s", str(1 << 20), "-n", "100")
        row = re.search(rf"^\s*{1 << 20}\s+100\s+([\d.]+)\s+([\d.]+)", out, flags=re.M)
        assert row, out
        average = float(row.group(2)) * (1 << 20)  # bytes per second (perftest's MiB/s)
        qos = counters(c3)["qos"]
        assert qos["bytes-per-s"] == limit and qos["throttled_ns"] > 0, qos
        assert average <= limit * 1.5, f"{average / 1e6:.1f} MB/s through a {limit / 1e6:.0f} MB/s limit"
    assert counters(site.c0)["qos"]["throttled_ns"] == 0


def test_memory_a_program_registers_is_shared_without_its_help(site: Site) -> None:
    """pyverbs registers a heap buffer, an anonymous mapping and a page of the main thread's stack: each is remapped
    onto a memfd (the device reads and writes them: a WRITE through a QP connected to itself), a shared file mapping
    is refused, and deregistered they are private memory again with their contents."""
    script = (Path(__file__).parents[2] / "backend" / "vrdma" / "harness" / "guest" / "container_memory.py").read_text()
    status, out = run(site.c0, ["python3", "-c", script, site.c0.device])
    assert status == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    for kind in ("heap", "anon", "stack"):
        assert "/memfd:vrdma-mr" not in report["before"][kind], report
        assert "/memfd:vrdma-mr" in report["registered"][kind], (kind, report)
        assert "/memfd:vrdma-mr" not in report["after"][kind] and " rw-p " in report["after"][kind], (kind, report)
    assert report["heap_written"] and report["stack_written"] and report["contents_kept"], report
    assert report["file_mapping"].startswith("refused"), report
