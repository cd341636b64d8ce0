"""Between hosts (issue 14): RDMA WRITE bandwidth and latency between guests on two hosts of a
vrdma.harness.multihost fabric, for vrdma to vrdma, vrdma to rxe and rxe to rxe in the same run, and the same
path's plain UDP throughput (iperf3 between the two hosts' namespaces) as the reference limit.

The path: each host's backend sends its guests' RoCE packets through its namespace's stack, over a veth pair and a
bridge to the other host. Every link carries jumbo frames (9000 bytes, as RoCE fabrics are run: the guests' ports
report a 4096-byte path MTU), and iperf3 sends the largest datagrams that fit them. The guests run under whatever
accelerator the machine has (TCG here); the figures say what a guest sees.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from vrdma.bench.guests import SMOKE_RXE_ITERATIONS
from vrdma.bench.metric import Metric

if TYPE_CHECKING:
    from vrdma.harness.hosts import Host
    from vrdma.harness.multihost import GuestPlan

log = logging.getLogger(__name__)

MIB = 1 << 20
PLAN_DEVICES = ("vrdma0", "vrdma0", "rxe0", "rxe0")  # vm0 h0, vm1 h1, vm2 h0 (rxe), vm3 h1 (rxe)


def bench_plan() -> list[GuestPlan]:
    """The guests of the inter-host part: vrdma and rxe on each of two hosts."""
    from vrdma.harness.multihost import GuestPlan

    return [GuestPlan(0), GuestPlan(1), GuestPlan(0, rxe=True), GuestPlan(1, rxe=True)]
BW_ITERATIONS = {"vrdma0": 200, "rxe0": 20}
LAT_ITERATIONS = 300
IPERF_PORT = 5201
IPERF_SECONDS = 3
SMOKE_SECONDS = 1             # `vrdma bench --smoke`: iperf3 this long, one run of each WRITE figure, and rxe's
                              # perftest runs as short as between guests (guests.SMOKE_RXE_ITERATIONS)
MTU = 9000
IP_UDP_HEADERS = 28
# A RoCE packet's UDP payload at the largest path MTU (4096): its BTH, the data and the ICRC. The per-packet cost of
# the hosts' stacks bounds this path, so UDP in datagrams of this size is what RoCE's packets could carry at best.
ROCE_DATAGRAM = 12 + 4096 + 4
BACKENDS_DEPTH = 256          # 1 MiB WRITEs between two backends without guests: posted this many at a time ...
BACKENDS_SLEEP_US = 500       # ... the driver looking this often whether they all completed ...
BACKENDS_RUNS = 3             # ... for a second (neighbours.SHARE_SECONDS), this many runs (the median)


def interhost(memory_mib: int = 1024, mtu: int = MTU, smoke: bool = False) -> list[Metric]:
    from vrdma.harness import verbs
    from vrdma.harness.multihost import MultiHost

    plan = bench_plan()
    results: list[Metric] = []
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-interhost-") as tmp, \
            MultiHost(Path(tmp), plan, memory_mib=memory_mib, mtu=mtu) as mh:
        accel = mh.accel.upper()
        where = f"two {accel} guests on two hosts"
        seconds = SMOKE_SECONDS if smoke else IPERF_SECONDS
        iterations = {**BW_ITERATIONS, "rxe0": SMOKE_RXE_ITERATIONS} if smoke else BW_ITERATIONS
        runs = 1 if smoke else 3
        results.append(udp_reference((mh.fabric[0], mh.fabric[1]), mtu - IP_UDP_HEADERS, seconds=seconds))
        gids = [verbs.ipv4_gid_index(vm, dev) for vm, dev in zip(mh.vms, PLAN_DEVICES, strict=True)]

        def bandwidth(server: int, client: int) -> float:
            """ib_write_bw of 1 MiB from guest `client` to guest `server`: the median of three runs, in GB/s."""
            figures = []
            for _ in range(5):
                row = verbs.perftest(mh.vms[server], mh.vms[client], "ib_write_bw", PLAN_DEVICES[server],
                                     gids[server], ("-s", str(MIB), "-n", str(iterations[PLAN_DEVICES[client]])),
                                     client_device=(PLAN_DEVICES[client], gids[client]))[-1]
                if row["BW average[MiB/sec]"] > 0:  # (perftest under TCG now and then reports 0: run again)
                    figures.append(row["BW average[MiB/sec]"] * MIB / 1e9)
                if len(figures) == runs:
                    break
            if not figures:
                raise RuntimeError(f"ib_write_bw vm{client} -> vm{server} reported no bandwidth")
            return round(statistics.median(figures), 3)

        for name, server, client in (("interhost_vrdma_write_bw_1mib_gbps", 1, 0),
                                     ("interhost_vrdma_rxe_write_bw_1mib_gbps", 3, 0),
                                     ("interhost_rxe_write_bw_1mib_gbps", 3, 2)):
            value = bandwidth(server, client)
            log.info("%s: %.3f GB/s", name, value)
            results.append(Metric(name, value, "GB/s", f"vrdma bench (ib_write_bw -s 1048576, {PLAN_DEVICES[client]} "
                                                       f"on h0 to {PLAN_DEVICES[server]} on h1, {where})"))
        for name, server, client in (("interhost_vrdma_write_lat_small_us", 1, 0),
                                     ("interhost_rxe_write_lat_small_us", 3, 2)):
            row = verbs.perftest(mh.vms[server], mh.vms[client], "ib_write_lat", PLAN_DEVICES[server], gids[server],
                                 ("-n", str(LAT_ITERATIONS)))[-1]
            results.append(Metric(name, round(row["t_typical[usec]"], 1), "us",
                                  f"vrdma bench (ib_write_lat 2 B, {PLAN_DEVICES[client]} on h0 to h1, {where})"))
    return results


def between_backends(mtu: int = MTU, smoke: bool = False) -> list[Metric]:
    """The backends alone between two hosts: two `vrdma backend --roce` in two network namespaces of a
    vrdma.harness.hosts fabric (jumbo-frame links), one simulated VM each (its GID its host's address), RC QPs
    connected across with a 4096-byte path MTU; the C load generator posts 1 MiB RDMA WRITEs from h0's VM to h1's
    in batches, sleeping while they drain (the median of BACKENDS_RUNS one-second runs), against iperf3's UDP on
    the same path (in the largest datagrams the links carry, and in datagrams of a RoCE packet's size: RoCE's
    payload per packet stops at 4096 bytes, and the hosts' per-packet work bounds the path). What the engine's
    network I/O gives, without TCG guests sharing the cores."""
    import os
    import sys
    from contextlib import ExitStack

    from vrdma.bench.backend import native_pair
    from vrdma.bench.neighbours import SHARE_SECONDS, _floods
    from vrdma.device.gid import gid_of_address as gid_of
    from vrdma.harness.daemon import DaemonProcess, Served, admin, vm_counters
    from vrdma.harness.hosts import HostNetwork
    from vrdma.testing.frontend import Frontend

    command = (f"vrdma bench (two backends on two hosts, {mtu}-byte links, simulated VMs, WRITEs of 1 MiB "
               f"{BACKENDS_DEPTH} at a time for {SHARE_SECONDS:g} s, median of {BACKENDS_RUNS})")
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-backends-") as tmp, ExitStack() as stack:
        directory = Path(tmp)
        fabric = stack.enter_context(HostNetwork(2, subnet="10.95.0.0/24", prefix=f"bb{os.getpid() % 100000}",
                                                 mtu=mtu))
        hosts = (fabric[0], fabric[1])
        seconds = SMOKE_SECONDS if smoke else IPERF_SECONDS
        references = [udp_reference(hosts, mtu - IP_UDP_HEADERS, "interhost_backends_udp_gbps", seconds),
                      udp_reference(hosts, ROCE_DATAGRAM, "interhost_backends_udp_roce_size_gbps", seconds)]
        frontends = []
        daemons = []
        for i, host in enumerate(hosts):
            name = f"vm{i}"
            daemons.append(DaemonProcess(
                [Served(name, directory / f"{name}.sock")], log_file=directory / f"h{i}.log",
                admin_socket=directory / f"h{i}" / "admin.sock", doorbell_dir=directory / "backend",
                launcher=host.command([sys.executable, "-m", "vrdma.cli"]), roce=True))
            stack.enter_context(daemons[-1])
            frontends.append(stack.enter_context(Frontend(str(directory / f"{name}.sock"), memory_size=256 * MIB)))
        gids = tuple(gid_of(host.address) for host in hosts)
        # vm1 (h1) responds, vm0 (h0) requests
        pair = native_pair(directory, frontends[1], frontends[0], ("vm1", "vm0"), BACKENDS_DEPTH,
                           gids=(gids[1], gids[0]), path_mtu=5)
        # The driver sleeps while its queue drains (a spinning one would take one of the cores both backends and
        # the hosts' forwarding need: three spinners on two cores halve what the backends can do).
        figures = [_floods([pair], MIB, BACKENDS_SLEEP_US)[0] * MIB / 1e9 for _ in range(1 if smoke else BACKENDS_RUNS)]
        for i, daemon in enumerate(daemons):
            log.debug("between backends: h%d's RoCE counters %s, engine threads %s", i,
                      vm_counters(daemon, f"vm{i}")["roce"], admin(daemon, {"command": "counters"})["engine_threads"])
    value = round(statistics.median(figures), 3)
    log.info("between backends: %.3f GB/s (%s), UDP %.3f GB/s (%.3f GB/s in datagrams of RoCE's size)", value,
             ", ".join(f"{f:.3f}" for f in figures), references[0].value, references[1].value)
    return [*references, Metric("interhost_backends_write_bw_1mib_gbps", value, "GB/s", command)]


def udp_reference(hosts: tuple[Host, Host], datagram: int, name: str = "interhost_udp_gbps",
                  seconds: int = IPERF_SECONDS) -> Metric:
    """iperf3's UDP throughput from hosts[0] to hosts[1] (what arrived), unlimited rate, in datagrams of ``datagram``
    bytes (the largest the links carry unfragmented, or the size of a RoCE packet's), as the metric ``name``."""
    h0, h1 = hosts
    server = h1.popen(["iperf3", "-s", "-1", "--forceflush", "-B", h1.address, "-p", str(IPERF_PORT)])
    try:
        assert server.stdout is not None
        for line in server.stdout:  # "Server listening on 5201 (test #1)": ready
            if "listening" in line:
                break
        client = h0.run(["iperf3", "-u", "-b", "0", "-l", str(datagram), "-t", str(seconds), "-J",
                         "-c", h1.address, "-p", str(IPERF_PORT)], timeout=60)
        report = json.loads(client.stdout) if client.stdout.strip().startswith("{") else {}
        end = report.get("end", {}).get("sum")
        if client.returncode != 0 or end is None:
            raise RuntimeError(f"iperf3 between the hosts failed: {report.get('error', '')} "
                               f"{client.stdout[-2000:]}{client.stderr}")
        received = end["bits_per_second"] * (1 - end.get("lost_percent", 0.0) / 100) / 8 / 1e9
    finally:
        server.terminate()
        server.wait(10)
    log.info("UDP between the hosts (iperf3): %.3f GB/s received", received)
    return Metric(name, round(received, 3), "GB/s",
                  f"vrdma bench (iperf3 -u -b 0 -l {datagram} -t {seconds}, host h0 to host h1)")
