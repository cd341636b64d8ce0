"""Guests: vrdma and rxe side by side in the same two guests, and the backend's CPU while guests idle.

- perftest bandwidth and latency (RC, and UD on a jumbo link), QP creation rate, ibv_reg_mr of 1 GiB, for vrdma0
  and rxe0 in the same run;
- the backend's CPU while idle: two guests connected, 100 connected idle RC QPs (50 in each guest), measured
  with psutil over 10 s once the engine had time to park.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vrdma.bench.metric import Metric
from vrdma.device import abi

log = logging.getLogger(__name__)

GIB, MIB = 1 << 30, 1 << 20

SWEEP = [4096, 65536, MIB]
BW_TOOLS = ["ib_write_bw", "ib_read_bw", "ib_send_bw"]
BW_ITERATIONS = {"vrdma0": 5000, "rxe0": 20}  # perftest's default on vrdma: ~0.2 s of copying at 1 MiB
LAT_TOOLS = ["ib_write_lat", "ib_send_lat"]
LAT_ITERATIONS = 300
REG_MR_SCRIPT = Path(__file__).parents[1] / "harness" / "guest" / "reg_mr.py"
QP_SCALE_SCRIPT = Path(__file__).parents[1] / "harness" / "guest" / "qp_scale.py"
# Fewer datagrams than ib_send_bw's receive ring (16000): UD has no flow control, so a sender that outruns the
# receiver's reposting loses datagrams as UD defines, and the server then waits for the missing ones until it gives
# up (seen once in a TCG guest at 20000: 19104 received).
UD_ITERATIONS = {"vrdma0": 10000, "rxe0": 2000}
QP_CREATES = 1000
CM_CONNECTIONS = 100
CMTIME_PORT = 7471
# cmtime's table for its test with QPs: "full connect" runs from the first rdma_create_id to the last connection
# established; its second figure is that total, in microseconds.
FULL_CONNECT = re.compile(r"^qp_conn\s+(\d+)\n.*?^full connect\s+\d+\s+(\d+)", flags=re.M | re.S)
GUEST_MEMORY_MIB = 3072  # room for a 1 GiB registration next to the guest's own RAM disk
NVMEOF_NAMESPACE_MIB = 256
NVMEOF_RUNTIME_S = 5  # per fio run: TCG guests reach a steady rate within a second
# `vrdma bench --smoke` (what `make test` runs: every figure produced, none a measurement): rxe moves a few MB/s
# under TCG, so its perftest runs send this many messages, and fio runs this long.
SMOKE_RXE_ITERATIONS = 5
SMOKE_NVMEOF_RUNTIME_S = 1


def guests_vs_rxe(smoke: bool = False) -> tuple[list[Metric], dict[str, dict[str, dict[int, float]]]]:
    """vrdma and the kernel's software RoCE (rxe) side by side in the same two guests, same runs, same sizes
    (``smoke``: one run of each, rxe's and fio's short).

    Returns the metrics and the bandwidth sweeps ({device: {tool: {size: GB/s}}}) for the plot."""
    from vrdma.harness import verbs
    from vrdma.harness.cluster import Cluster

    results: list[Metric] = []
    sweeps: dict[str, dict[str, dict[int, float]]] = {}
    iterations = {**BW_ITERATIONS, "rxe0": SMOKE_RXE_ITERATIONS} if smoke else BW_ITERATIONS
    fio_seconds = SMOKE_NVMEOF_RUNTIME_S if smoke else NVMEOF_RUNTIME_S
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, \
            Cluster(2, Path(tmp), memory_mib=GUEST_MEMORY_MIB) as guests:
        server, client = guests[0], guests[1]
        accel = guests.accel.upper()
        # rdma_cm picks the device by IP address, and vrdma0 and rxe0 would share eth0's: each is measured alone
        # (vrdma0 before rxe0 exists, rxe0 once vrdma is unloaded, at the end).
        results.append(cm_connect_rate(server, client, "vrdma0", accel))
        results += nvmeof_rates(server, client, "vrdma", "rdma", accel, fio_seconds)
        results += nvmeof_rates(server, client, "nvmetcp", "tcp", accel, fio_seconds)
        for vm in guests:
            verbs.add_rxe(vm, "rxe0")
        for device in ("vrdma0", "rxe0"):
            name = device.rstrip("0")
            gid = verbs.ipv4_gid_index(server, device)
            sweeps[name] = {}
            for tool in BW_TOOLS:
                sweeps[name][tool] = {}
                for size in SWEEP:
                    sampler = CpuSampler(guests.backend.process) if guests.backend and guests.backend.process \
                        else None
                    # The headline figure (1 MiB WRITE) is the median of three runs: memory bandwidth on a
                    # shared host moves from one second to the next. perftest under TCG occasionally reports 0
                    # (its clock is emulated): such a run is repeated, not averaged in.
                    runs = 3 if tool == "ib_write_bw" and size == MIB and not smoke else 1
                    figures: list[float] = []
                    with sampler or contextlib.nullcontext():
                        for _ in range(runs + 2):
                            row = verbs.perftest(server, client, tool, device, gid,
                                                 ("-s", str(size), "-n", str(iterations[device])))[-1]
                            if row["BW average[MiB/sec]"] > 0:
                                figures.append(row["BW average[MiB/sec]"] * MIB / 1e9)
                            if len(figures) == runs:
                                break
                    if not figures:
                        raise RuntimeError(f"{tool} -s {size} on {device} reported no bandwidth")
                    sweeps[name][tool][size] = statistics.median(figures)
                    if sampler is not None and device == "vrdma0" and tool == "ib_write_bw" and size == MIB:
                        # How much of a core the backend got while it copied: on a host where the guests'
                        # vCPUs and the backend share the cores, this bounds the guest figure.
                        results.append(Metric("vrdma_write_bw_1mib_backend_cpu_pct", round(sampler.peak, 1),
                                              "% of a core (peak 100 ms)",
                                              "vrdma bench (psutil, during ib_write_bw -s 1048576)"))
                log.info("%s %s: %s", device, tool, ", ".join(f"{s} B {g:.3f} GB/s"
                                                             for s, g in sweeps[name][tool].items()))
            results.append(Metric(f"{name}_write_bw_1mib_gbps", round(sweeps[name]["ib_write_bw"][MIB], 3), "GB/s",
                                  f"vrdma bench (ib_write_bw -s 1048576, two {accel} guests)"))
            for tool in LAT_TOOLS:
                row = verbs.perftest(server, client, tool, device, gid, ("-n", str(LAT_ITERATIONS)))[-1]
                label = tool.removeprefix("ib_").removesuffix("_lat")
                results.append(Metric(f"{name}_{label}_lat_small_us", round(row["t_typical[usec]"], 1), "us",
                                      f"vrdma bench ({tool} 2 B, two {accel} guests)"))
            results += datagrams_and_setup(server, client, device, gid, accel)
            reg = client.run(["python3", "-c", REG_MR_SCRIPT.read_text(), device, str(GIB), "3"], timeout=600)
            reg.check(f"ibv_reg_mr of 1 GiB on {device}")
            results.append(Metric(f"{name}_reg_mr_1gib_ms", round(json.loads(reg.stdout)["median_ms"], 1), "ms",
                                  f"vrdma bench (ibv_reg_mr 1 GiB in a {accel} guest)"))
        results.append(restart_to_usable(guests, accel))
        for vm in guests:
            vm.run(["rmmod", "vrdma"]).check("rmmod vrdma (rxe0 alone on eth0 for rdma_cm)")
        results.append(cm_connect_rate(server, client, "rxe0", accel))
        results += nvmeof_rates(server, client, "rxe", "rdma", accel, fio_seconds)
    return results, sweeps


def restart_to_usable(guests: Any, accel: str) -> Metric:
    """The backend killed under traffic (ibv_rc_pingpong between the two guests) and started again: the time from
    the new backend being ready (its sockets listening, `DaemonProcess.start` returned) until vrdma0 is
    PORT_ACTIVE again in both guests, the driver having noticed the lost state and probed the device afresh
    (docs/reliability.md). The programs that held the old device end with an error meanwhile."""
    from vrdma.harness import verbs
    from vrdma.harness.daemon import vm_counters

    server, client = guests[0], guests[1]
    backend = guests.backend
    gid = verbs.ipv4_gid_index(server, "vrdma0")
    argv = ["ibv_rc_pingpong", "-d", "vrdma0", "-g", str(gid), "-s", "4096", "-n", "100000000"]
    server_pid = server.agent.spawn(argv)
    verbs.wait_listening(server, verbs.PINGPONG_PORT, timeout=60, server_pid=server_pid)
    client_pid = client.agent.spawn([*argv, server.address])
    sent = vm_counters(backend, client.name)["engine"]["send_wqes"]
    deadline = time.monotonic() + 120
    while vm_counters(backend, client.name)["engine"]["send_wqes"] < sent + 200:  # traffic running
        if time.monotonic() > deadline:
            raise RuntimeError("no ping-pong traffic through the backend within 120 s")
        time.sleep(0.05)
    backend.kill()
    backend.start()
    ready = time.monotonic()
    pending = [server, client]
    deadline = ready + 120
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"vrdma0 not PORT_ACTIVE again in {', '.join(vm.name for vm in pending)} "
                               "within 120 s of the backend's restart")
        pending = [vm for vm in pending if "PORT_ACTIVE" not in vm.run(["ibv_devinfo", "-d", "vrdma0"]).stdout]
    usable_ms = (time.monotonic() - ready) * 1000
    for vm, pid in ((server, server_pid), (client, client_pid)):
        vm.agent.wait(pid, argv, timeout=120)  # ended (with an error) when the device went
    return Metric("backend_restart_to_usable_ms", round(usable_ms, 1), "ms",
                  f"vrdma bench (backend killed under ibv_rc_pingpong and restarted; until vrdma0 is PORT_ACTIVE "
                  f"again in two {accel} guests)")


def nvmeof_rates(target_vm: Any, host_vm: Any, name: str, transport: str, accel: str,
                 seconds: int = NVMEOF_RUNTIME_S) -> list[Metric]:
    """NVMe over Fabrics from ``host_vm`` to ``target_vm``: fio 4 KiB random reads at depth 32 (IOPS) and 128 KiB
    sequential reads at depth 8 (bandwidth) on a RAM namespace written in full first. Over RDMA on whichever RDMA
    device holds the target's address (vrdma0, or rxe0 once vrdma is unloaded), or NVMe/TCP over virtio-net."""
    from vrdma.harness import fio, nvmeof

    label = "nvmetcp" if transport == "tcp" else f"{name}_nvmeof"
    what = "NVMe/TCP over virtio-net" if transport == "tcp" else f"NVMe-oF over {name}"
    timed = (f"--runtime={seconds}", "--time_based", f"--size={NVMEOF_NAMESPACE_MIB}M")
    with nvmeof.target(target_vm, transport, size_mib=NVMEOF_NAMESPACE_MIB) as exported, \
            nvmeof.host(host_vm, exported) as device:
        fio.job(host_vm, device, "--rw=write", "--bs=1M", "--iodepth=4", f"--size={NVMEOF_NAMESPACE_MIB}M")
        rand = fio.job(host_vm, device, "--rw=randread", "--bs=4k", "--iodepth=32", *timed)
        seq = fio.job(host_vm, device, "--rw=read", "--bs=128k", "--iodepth=8", *timed)
    log.info("%s: 4 KiB random reads %.0f IOPS, 128 KiB reads %.3f GB/s", what, rand["read"]["iops"],
             seq["read"]["bw_bytes"] / 1e9)
    return [Metric(f"{label}_randread_4k_iops", round(rand["read"]["iops"]), "IOPS",
                   f"vrdma bench (fio 4 KiB random read, depth 32, {what}, two {accel} guests)"),
            Metric(f"{label}_seqread_128k_gbps", round(seq["read"]["bw_bytes"] / 1e9, 3), "GB/s",
                   f"vrdma bench (fio 128 KiB sequential read, depth 8, {what}, two {accel} guests)")]


def cm_connect_rate(server: Any, client: Any, device: str, accel: str) -> Metric:
    """rdma_cm connection set-up rate: cmtime (rdma-core) connects CM_CONNECTIONS RC QPs from one guest to the
    other (address and route resolution, QP creation and transitions, the CM's REQ/REP/RTU), the only RDMA device
    on eth0 being ``device``."""
    from vrdma.harness import verbs

    count = str(CM_CONNECTIONS)
    _, result = verbs.client_server(server, client, ["cmtime", "-b", server.address, "-c", count],
                                    port=CMTIME_PORT, rdma_cm=True,
                                    client_argv=["cmtime", "-s", server.address, "-c", count], timeout=600)
    found = FULL_CONNECT.search(result.stdout)
    if found is None or int(found.group(1)) != CM_CONNECTIONS or not int(found.group(2)):
        raise RuntimeError(f"cmtime on {device} printed no connection time:\n{result.stdout}")
    per_s = CM_CONNECTIONS / (int(found.group(2)) / 1e6)
    return Metric(f"{device.rstrip('0')}_cm_connect_per_s", round(per_s, 1), "connections/s",
                  f"vrdma bench (cmtime -c {count}, two {accel} guests)")


def datagrams_and_setup(server: Any, client: Any, device: str, gid: int, accel: str) -> list[Metric]:
    """UD send latency and 4 KiB bandwidth (on a jumbo link, so a 4 KiB datagram fits the path MTU), and how fast
    one process creates QPs and moves them to INIT (what MPI and UCX do once per peer)."""
    from vrdma.harness import verbs

    name = device.rstrip("0")
    results = []
    with verbs.link_mtu([server, client]):
        row = verbs.perftest(server, client, "ib_send_lat", device, gid,
                             ("-c", "UD", "-n", str(LAT_ITERATIONS)))[-1]
        results.append(Metric(f"{name}_ud_send_lat_small_us", round(row["t_typical[usec]"], 1), "us",
                              f"vrdma bench (ib_send_lat -c UD 2 B, two {accel} guests)"))
        row = verbs.perftest(server, client, "ib_send_bw", device, gid,
                             ("-c", "UD", "-s", "4096", "-n", str(UD_ITERATIONS[device])))[-1]
        results.append(Metric(f"{name}_ud_send_bw_4k_gbps", round(row["BW average[MiB/sec]"] * MIB / 1e9, 3),
                              "GB/s", f"vrdma bench (ib_send_bw -c UD -s 4096, two {accel} guests, MTU 9000)"))
    rate = client.run(["python3", "-c", QP_SCALE_SCRIPT.read_text(), "rate", device, str(QP_CREATES)], timeout=900)
    rate.check(f"{QP_CREATES} QPs created on {device}")
    results.append(Metric(f"{name}_qp_create_per_s", round(json.loads(rate.stdout)["per_s"]), "QPs/s",
                          f"vrdma bench ({QP_CREATES} RC QPs created and moved to INIT by one process, {accel} "
                          f"guest)"))
    return results


class CpuSampler:
    """The busiest 100 ms of a process while the block runs (psutil CPU times, sampled from a thread)."""

    def __init__(self, process: Any, interval: float = 0.1) -> None:
        self.process, self.interval, self.peak = process, interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last, then = self.process.cpu_times(), time.monotonic()
        while not self._stop.wait(self.interval):
            now_times, now = self.process.cpu_times(), time.monotonic()
            busy = (now_times.user - last.user) + (now_times.system - last.system)
            self.peak = max(self.peak, 100.0 * busy / (now - then))
            last, then = now_times, now

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def plot(sweeps: dict[str, dict[str, dict[int, float]]], memcpy: dict[int, float], dest: Path) -> None:
    """Bandwidth against message size: vrdma and rxe between guests, and host memcpy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for device, tools in sweeps.items():
        for tool, points in tools.items():
            ax.plot(list(points), list(points.values()), marker="o", label=f"{device} {tool}")
    ax.plot(list(memcpy), list(memcpy.values()), color="black", linestyle="--", label="host memcpy (C)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title("vrdma vs rxe between two guests, and host memcpy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)


IDLE_QPS = 100
IDLE_SECONDS = 10.0
IDLE_SCRIPT = Path(__file__).parents[1] / "harness" / "guest" / "idle_qps.py"


def idle_cpu(qps: int = IDLE_QPS, seconds: float = IDLE_SECONDS) -> list[Metric]:
    """The backend's CPU use with two guests connected and ``qps`` idle QPs, measured with psutil."""
    from vrdma.harness import verbs
    from vrdma.harness.cluster import Cluster
    from vrdma.harness.daemon import vm_counters

    script = IDLE_SCRIPT.read_text()
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, Cluster(2, Path(tmp)) as cluster:
        assert cluster.backend is not None and cluster.backend.process is not None
        holders = [(vm, vm.agent.spawn(["python3", "-c", script, str(qps // 2),
                                        str(verbs.ipv4_gid_index(vm, "vrdma0"))])) for vm in cluster]
        try:
            deadline = time.monotonic() + 300
            while sum(vm_counters(cluster.backend, vm.name)["objects"]["qp"] for vm in cluster) < qps:
                for vm, pid in holders:
                    done = vm.agent.poll(pid)
                    if done is not None:
                        raise RuntimeError(f"the QP holder in {vm.name} exited: {done.stdout}{done.stderr}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{qps} QPs were not created within 300 s")
                time.sleep(0.5)  # polling another machine's progress: nothing to wait on
            # Measure the parked state: wait until the engine has set the "parked" slot of the doorbell pages.
            regions = [cluster.directory / "backend" / f"{vm.name}.doorbell" for vm in cluster]
            while not all(_parked(region) for region in regions):
                if time.monotonic() > deadline:
                    raise RuntimeError("the backend's engine never parked")
                time.sleep(0.05)
            process = cluster.backend.process
            before, start = process.cpu_times(), time.monotonic()
            time.sleep(seconds)
            after, wall = process.cpu_times(), time.monotonic() - start
        finally:
            for vm, pid in holders:
                vm.agent.kill(pid)
    busy = (after.user - before.user) + (after.system - before.system)
    percent = round(100.0 * busy / wall, 2)
    log.info("backend CPU with 2 guests and %d idle QPs: %.2f%% of one core over %.0f s", qps, percent, wall)
    return [Metric("backend_idle_cpu_pct", percent, "% of a core",
                   f"vrdma bench (2 guests, {qps} idle RC QPs, {seconds:g} s)")]


def _parked(region: Path) -> bool:
    """Slot 0 of the first user-context page of a VM's doorbell region: nonzero while the engine is parked."""
    page = abi.const("VRDMA_DOORBELL_PAGE_SIZE")
    with region.open("rb") as f:
        f.seek(page)
        return int.from_bytes(f.read(4), "little") != 0

