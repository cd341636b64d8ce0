"""`make bench` / `vrdma bench`: benchmarks, written to build/bench/results.json and printed as a table.

- host memcpy bandwidth (C memcpy, with a 4 KiB..4 MiB sweep, and Python's memoryview copy): the reference;
- the control-command round trip (QUERY_DEVICE) through the simulated frontend against a real
  `vrdma backend` process, i.e. the backend at native speed without a guest;
- the data path at native speed: the simulated frontend plays two VMs set up by vrdma.testing.verbs, and a C
  driver (vrdma.testing.native) posts RDMA WRITEs and polls completions as libvrdma does: doorbell-to-CQE
  latency (8 B), 8-byte WRITE rate, 1 MiB WRITE bandwidth, backend CPU seconds per GB, 1 GiB MR registration;
- the backend's CPU while idle: two guests connected, 100 connected idle RC QPs (50 in each guest), measured
  with psutil over 10 s once the engine had time to park. Reported, not asserted: a measurement, not a test.

Each result is one object with name, value, unit and the command that measures it, so runs can be compared.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vrdma import paths
from vrdma.device import abi
from vrdma.harness import daemon as daemon_launcher
from vrdma.harness.daemon import socket_path
from vrdma.harness.qemu_cmdline import GuestIdentity
from vrdma.testing.frontend import Frontend

log = logging.getLogger(__name__)

WARMUP = 200


def control_round_trip(iterations: int) -> list[dict[str, Any]]:
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE")}))
    response_size = abi.sizeof("vrdma_resp_query_device")
    guest = GuestIdentity(0)
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, daemon_launcher.for_guests(Path(tmp), [guest]), \
            Frontend(str(socket_path(Path(tmp), guest))) as fe:
        fe.start()
        samples = []
        for i in range(WARMUP + iterations):
            start = time.perf_counter_ns()
            fe.command(request, response_size)
            if i >= WARMUP:
                samples.append((time.perf_counter_ns() - start) / 1000)
    quantiles = statistics.quantiles(samples, n=100)
    command = f"vrdma bench --iterations {iterations}"
    return [
        {"name": "backend_control_rtt_p50_us", "value": round(statistics.median(samples), 1), "unit": "us",
         "command": command},
        {"name": "backend_control_rtt_p99_us", "value": round(quantiles[98], 1), "unit": "us", "command": command},
    ]


GIB, MIB = 1 << 30, 1 << 20
STREAM_TIMEOUT_NS = 60 * 10**9


def _pct(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1]


def native_backend() -> list[dict[str, Any]]:
    """The backend at native speed: the simulated frontend plays two VMs, and a C driver (vrdma.testing.native)
    posts RDMA WRITEs and polls completions the way libvrdma does, so the figures are the backend's."""
    from vrdma.testing._native import ffi as nffi  # built by `make backend`
    from vrdma.testing._native import lib as nlib
    from vrdma.testing.verbs import SimVerbs

    guests = [GuestIdentity(0), GuestIdentity(1)]
    command = "vrdma bench (simulated frontend, native driver)"
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, \
            daemon_launcher.for_guests(Path(tmp), guests) as backend, \
            Frontend(str(socket_path(Path(tmp), guests[0])), memory_size=GIB + 256 * MIB) as fa, \
            Frontend(str(socket_path(Path(tmp), guests[1])), memory_size=256 * MIB) as fb:
        assert backend.process is not None
        gids = [ident.name.encode().ljust(16, b"\0") for ident in guests]
        sides = []
        for fe, ident, gid in zip((fa, fb), guests, gids, strict=True):
            fe.start()
            verbs = SimVerbs(fe, Path(tmp) / "backend" / f"{ident.name}.doorbell")
            verbs.add_gid(0, gid)
            pd = verbs.alloc_pd()
            cq = verbs.create_cq(4096)
            sides.append((verbs, pd, cq, verbs.create_qp(pd, cq, cq, depth=1024, max_sge=1, max_inline=0),
                          verbs.reg_mr(pd, 4 * MIB)))
        (va, pda, _, qpa, mra), (vb, _, cqb, qpb, mrb) = sides
        va.connect(qpa, qpb.qpn, gids[1])
        vb.connect(qpb, qpa.qpn, gids[0])

        # The requester is vb (vm1): its rings, doorbell page and memory as the C driver sees them.
        mem_b = int(nffi.cast("uintptr_t", nffi.from_buffer(fb.memory.map)))
        db_b = int(nffi.cast("uintptr_t", nffi.from_buffer(vb.doorbells)))
        queue = nffi.new("struct nat_queue *", {
            "base": mem_b + qpb.buf.gpa + qpb.sq_offset, "ring_hdr": mem_b + qpb.buf.gpa,
            "doorbell_page": db_b + vb.doorbell_page * abi.const("VRDMA_DOORBELL_PAGE_SIZE"),
            "depth": qpb.sq_depth, "stride": qpb.sq_stride, "prod": qpb.sq_prod, "db_slot": qpb.sq_db_slot,
            "wake_fd": fb.queues[abi.const("VRDMA_QUEUE_WAKE")].kick})
        cq = nffi.new("struct nat_cq *", {"hdr": mem_b + cqb.buf.gpa, "cqes": mem_b + cqb.buf.gpa + 4096,
                                          "entries": cqb.entries, "cons": cqb.cons})

        def write(length: int) -> Any:
            return nffi.new("struct nat_write *", {"laddr": mrb.addr, "raddr": mra.addr, "lkey": mrb.lkey,
                                                   "rkey": mra.rkey, "len": length})

        results: list[dict[str, Any]] = []
        iters = 20000
        samples = nffi.new("int64_t[]", iters)
        if nlib.nat_write_latency(queue, cq, write(8), iters, samples, STREAM_TIMEOUT_NS) != 0:
            raise RuntimeError("8-byte WRITE latency run failed")
        lat = [samples[i] / 1000 for i in range(1000, iters)]  # the first thousand warm up
        results += [
            {"name": "backend_db_to_cqe_p50_us", "value": round(statistics.median(lat), 2), "unit": "us",
             "command": command},
            {"name": "backend_db_to_cqe_p99_us", "value": round(_pct(lat, 99), 2), "unit": "us", "command": command},
        ]
        count = 2_000_000
        elapsed = nlib.nat_write_stream(queue, cq, write(8), count, 64, STREAM_TIMEOUT_NS)
        if elapsed < 0:
            raise RuntimeError("8-byte WRITE stream failed")
        results.append({"name": "backend_write_rate_8b_mops", "value": round(count / elapsed * 1000, 3),
                        "unit": "Mops/s", "command": command})
        count = 4000
        cpu_before = backend.process.cpu_times()
        elapsed = nlib.nat_write_stream(queue, cq, write(MIB), count, 16, STREAM_TIMEOUT_NS)
        cpu_after = backend.process.cpu_times()
        if elapsed < 0:
            raise RuntimeError("1 MiB WRITE stream failed")
        gigabytes = count * MIB / 1e9
        cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
        results += [
            {"name": "backend_write_bw_1mib_gbps", "value": round(gigabytes / (elapsed / 1e9), 2), "unit": "GB/s",
             "command": command},
            {"name": "backend_cpu_s_per_gb", "value": round(cpu / gigabytes, 3), "unit": "CPU s/GB",
             "command": command},
        ]
        # Registering 1 GiB (262,144 pages): the REG_MR round trip, page lists prepared beforehand.
        big = va.alloc(GIB)
        pages = va.page_list(big)
        start = time.perf_counter()
        va.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=pda, access=0xF, iova=big.gpa,
                length=GIB, page_offset=0, pages=pages)
        results.append({"name": "backend_reg_mr_1gib_ms", "value": round((time.perf_counter() - start) * 1000, 1),
                        "unit": "ms", "command": command})
    return results


def memcpy_bandwidth() -> list[dict[str, Any]]:
    """The physical reference: copying buffers in this process, in C (memcpy) and in Python (memoryview)."""
    from vrdma.testing._native import ffi as nffi
    from vrdma.testing._native import lib as nlib

    results: list[dict[str, Any]] = []
    src, dst = bytearray(os.urandom(4 * MIB)), bytearray(4 * MIB)
    psrc, pdst = (int(nffi.cast("uintptr_t", nffi.from_buffer(b))) for b in (src, dst))
    sweep = {}
    for size in (4096, 16384, 65536, 262144, MIB, 4 * MIB):
        iters = max(16, (512 * MIB) // size)
        sweep[size] = size * iters / (nlib.nat_memcpy(pdst, psrc, size, iters) / 1e9) / 1e9
    # The headline reference is the median of five measurements, like the figures it is compared with.
    sweep[MIB] = statistics.median(MIB * 512 / (nlib.nat_memcpy(pdst, psrc, MIB, 512) / 1e9) / 1e9
                                   for _ in range(5))
    results.append({"name": "memcpy_1mib_gbps", "value": round(sweep[MIB], 2), "unit": "GB/s",
                    "command": "vrdma bench (C memcpy, 1 MiB)", "sweep": {str(k): round(v, 2)
                                                                          for k, v in sweep.items()}})
    view_src, view_dst = memoryview(src)[:MIB], memoryview(dst)[:MIB]
    iters = 512
    start = time.perf_counter()
    for _ in range(iters):
        view_dst[:] = view_src
    results.append({"name": "memcpy_1mib_python_gbps", "value": round(MIB * iters / (time.perf_counter() - start)
                                                                       / 1e9, 2),
                    "unit": "GB/s", "command": "vrdma bench (Python memoryview copy, 1 MiB)"})
    return results


# Guest side: message sizes for the bandwidth sweeps, and how many messages per size for each device (rxe under
# TCG moves a few MB/s: it gets fewer messages, the figure is the rate either way).
SWEEP = [4096, 65536, MIB]
BW_TOOLS = ["ib_write_bw", "ib_read_bw", "ib_send_bw"]
BW_ITERATIONS = {"vrdma0": 5000, "rxe0": 20}  # perftest's default on vrdma: ~0.2 s of copying at 1 MiB
LAT_TOOLS = ["ib_write_lat", "ib_send_lat"]
LAT_ITERATIONS = 300
REG_MR_SCRIPT = Path(__file__).parent / "harness" / "guest" / "reg_mr.py"
GUEST_MEMORY_MIB = 3072  # room for a 1 GiB registration next to the guest's own RAM disk


def guests_vs_rxe() -> tuple[list[dict[str, Any]], dict[str, dict[str, dict[int, float]]]]:
    """vrdma and the kernel's software RoCE (rxe) side by side in the same two guests, same runs, same sizes.

    Returns the metrics and the bandwidth sweeps ({device: {tool: {size: GB/s}}}) for the plot."""
    from vrdma.harness import verbs
    from vrdma.harness.cluster import Cluster

    results: list[dict[str, Any]] = []
    sweeps: dict[str, dict[str, dict[int, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, \
            Cluster(2, Path(tmp), memory_mib=GUEST_MEMORY_MIB) as guests:
        server, client = guests[0], guests[1]
        for vm in guests:
            verbs.add_rxe(vm, "rxe0")
        accel = guests.accel.upper()
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
                    runs = 3 if tool == "ib_write_bw" and size == MIB else 1
                    figures: list[float] = []
                    with sampler or contextlib.nullcontext():
                        for _ in range(runs + 2):
                            row = verbs.perftest(server, client, tool, device, gid,
                                                 ("-s", str(size), "-n", str(BW_ITERATIONS[device])))[-1]
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
                        results.append({"name": "vrdma_write_bw_1mib_backend_cpu_pct",
                                        "value": round(sampler.peak, 1), "unit": "% of a core (peak 100 ms)",
                                        "command": "vrdma bench (psutil, during ib_write_bw -s 1048576)"})
                log.info("%s %s: %s", device, tool, ", ".join(f"{s} B {g:.3f} GB/s"
                                                             for s, g in sweeps[name][tool].items()))
            results.append({"name": f"{name}_write_bw_1mib_gbps", "value": round(sweeps[name]["ib_write_bw"][MIB], 3),
                            "unit": "GB/s", "command": f"vrdma bench (ib_write_bw -s 1048576, two {accel} guests)"})
            for tool in LAT_TOOLS:
                row = verbs.perftest(server, client, tool, device, gid, ("-n", str(LAT_ITERATIONS)))[-1]
                label = tool.removeprefix("ib_").removesuffix("_lat")
                results.append({"name": f"{name}_{label}_lat_small_us", "value": round(row["t_typical[usec]"], 1),
                                "unit": "us", "command": f"vrdma bench ({tool} 2 B, two {accel} guests)"})
            reg = client.run(["python3", "-c", REG_MR_SCRIPT.read_text(), device, str(GIB), "3"], timeout=600)
            reg.check(f"ibv_reg_mr of 1 GiB on {device}")
            results.append({"name": f"{name}_reg_mr_1gib_ms", "value": round(json.loads(reg.stdout)["median_ms"], 1),
                            "unit": "ms", "command": f"vrdma bench (ibv_reg_mr 1 GiB in a {accel} guest)"})
    return results, sweeps


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
IDLE_SCRIPT = Path(__file__).parent / "harness" / "guest" / "idle_qps.py"


def idle_cpu(qps: int = IDLE_QPS, seconds: float = IDLE_SECONDS) -> list[dict[str, Any]]:
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
    return [{"name": "backend_idle_cpu_pct", "value": percent, "unit": "% of a core",
             "command": f"vrdma bench (2 guests, {qps} idle RC QPs, {seconds:g} s)"}]


def _parked(region: Path) -> bool:
    """Slot 0 of the first user-context page of a VM's doorbell region: nonzero while the engine is parked."""
    page = abi.const("VRDMA_DOORBELL_PAGE_SIZE")
    with region.open("rb") as f:
        f.seek(page)
        return int.from_bytes(f.read(4), "little") != 0


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The comparisons the targets are stated in (docs/performance.md), from figures of this same run."""
    value = {r["name"]: r["value"] for r in results}
    command = "vrdma bench (ratio of figures measured in this run)"
    out = []

    def ratio(name: str, num: str, den: str) -> None:
        if value.get(num) is not None and value.get(den):
            out.append({"name": name, "value": round(value[num] / value[den], 3), "unit": "x", "command": command})

    ratio("vrdma_write_bw_1mib_vs_memcpy", "vrdma_write_bw_1mib_gbps", "memcpy_1mib_gbps")
    ratio("vrdma_write_bw_1mib_vs_rxe", "vrdma_write_bw_1mib_gbps", "rxe_write_bw_1mib_gbps")
    ratio("vrdma_write_lat_vs_rxe", "vrdma_write_lat_small_us", "rxe_write_lat_small_us")
    ratio("vrdma_send_lat_vs_rxe", "vrdma_send_lat_small_us", "rxe_send_lat_small_us")
    ratio("backend_write_bw_1mib_vs_memcpy", "backend_write_bw_1mib_gbps", "memcpy_1mib_gbps")
    return out


def run(iterations: int = 5000, output: Path | None = None) -> int:
    log.info("control-command round trip: %d QUERY_DEVICE through the simulated frontend", iterations)
    results = control_round_trip(iterations)
    log.info("host memcpy bandwidth (C and Python)")
    results += memcpy_bandwidth()
    log.info("backend at native speed: the simulated frontend as two VMs, a C driver posting RDMA WRITEs")
    results += native_backend()
    log.info("backend CPU while idle: booting two guests with %d idle QPs", IDLE_QPS)
    results += idle_cpu()
    log.info("vrdma and rxe side by side in two guests (%s)", ", ".join(BW_TOOLS + LAT_TOOLS + ["ibv_reg_mr"]))
    guest_results, sweeps = guests_vs_rxe()
    results += guest_results
    results += ratios(results)
    out = output or paths.build_dir() / "bench" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    memcpy_sweep = next(r["sweep"] for r in results if r["name"] == "memcpy_1mib_gbps")
    png = out.with_suffix(".png")
    plot(sweeps, {int(k): v for k, v in memcpy_sweep.items() if int(k) <= MIB}, png)
    print(f"plot: {png}")
    print(f"{'metric':<32} {'value':>10}  unit")
    for r in results:
        print(f"{r['name']:<32} {r['value']:>10}  {r['unit']}")
    print(f"written to {out}")
    return 0
