"""The backend at native speed, and the physical reference: no guest boots here.

- host memcpy bandwidth (C memcpy, with a 4 KiB..4 MiB sweep, and Python's memoryview copy);
- the control-command round trip (QUERY_DEVICE) through the simulated frontend against a real `vrdma backend`;
- the data path: the simulated frontend plays two VMs set up by vrdma.testing.simulated_guest, and a C driver
  (vrdma.testing.loadgen) posts RDMA WRITEs and polls completions as libvrdma does: doorbell-to-CQE latency (8 B),
  8-byte WRITE rate, 1 MiB WRITE bandwidth, backend CPU seconds per GB, 1 GiB MR registration.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrdma.bench.metric import Metric
from vrdma.device import abi
from vrdma.device.constants import CommandOpcode
from vrdma.harness import daemon as daemon_launcher
from vrdma.harness.daemon import socket_path
from vrdma.harness.qemu_cmdline import GuestIdentity
from vrdma.testing.frontend import Frontend

log = logging.getLogger(__name__)

GIB, MIB = 1 << 30, 1 << 20

WARMUP = 200
# The data path's runs (docs/performance.md's method table is generated from these: vrdma.bench.methods).
LATENCY_WRITES = 20_000       # signaled 8-byte WRITEs, one at a time ...
LATENCY_WARMUP = 1000         # ... of which the first are not counted
RATE_WRITES = 2_000_000       # 8-byte WRITEs streamed ...
RATE_SIGNAL_EVERY = 64        # ... every 64th signaled
BW_WRITES = 4000              # 1 MiB WRITEs streamed ...
BW_SIGNAL_EVERY = 16
QUEUE_DEPTH = 1024


def control_round_trip(iterations: int) -> list[Metric]:
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": CommandOpcode.QUERY_DEVICE}))
    response_size = abi.sizeof("vrdma_resp_query_device")
    guest = GuestIdentity(0)
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, \
            daemon_launcher.for_guests(Path(tmp), [guest]) as daemon, \
            Frontend(str(socket_path(Path(tmp), guest))) as fe:
        fe.start()
        samples = []
        for i in range(WARMUP + iterations):
            start = time.perf_counter_ns()
            fe.command(request, response_size)
            if i >= WARMUP:
                samples.append((time.perf_counter_ns() - start) / 1000)
        # The backend's own part of each: from taking the chain off the control queue to the used ring.
        own = daemon_launcher.vm_counters(daemon, guest.name)["command_time_us"]
    quantiles = statistics.quantiles(samples, n=100)
    command = f"vrdma bench --iterations {iterations}"
    return [
        Metric("backend_control_rtt_p50_us", round(statistics.median(samples), 1), "us", command),
        Metric("backend_control_rtt_p99_us", round(quantiles[98], 1), "us", command),
        Metric("backend_command_time_p50_us", own["p50"], "us", command),
        Metric("backend_command_time_p99_us", own["p99"], "us", command),
    ]


STREAM_TIMEOUT_NS = 60 * 10**9


def _pct(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1]


@dataclass
class NativePair:
    """Two simulated VMs with connected RC QPs, the second (the requester) driven by the C load generator: its
    queue, CQ and WRITE descriptions as loadgen.c sees them."""
    responder: Any            # SimVerbs of the first VM
    responder_pd: int
    requester: Frontend       # the second VM's frontend (its control commands)
    requester_verbs: Any      # its SimVerbs: it holds the doorbell mapping the C driver rings
    queue: Any                # struct nat_queue *
    cq: Any                   # struct nat_cq *
    write: Callable[[int], Any]  # a struct nat_write * of `length` bytes from the requester's MR to the responder's


def native_pair(directory: Path, fa: Frontend, fb: Frontend, names: tuple[str, str], depth: int,
                gids: tuple[bytes, bytes] | None = None, path_mtu: int = 3) -> NativePair:
    """Set up a pair of VMs through the control path (vrdma.testing.simulated_guest): fa responds, fb requests.
    ``gids``: theirs (default: made of their names, for VMs of one backend; for two hosts, the hosts' addresses);
    ``path_mtu``: the QPs' (3: 1024 bytes; 5: 4096, what a jumbo-frame link between hosts carries)."""
    from vrdma.testing._loadgen import ffi as nffi  # built by `make backend`
    from vrdma.testing.simulated_guest import SimVerbs

    gids = gids or (names[0].encode().ljust(16, b"\0"), names[1].encode().ljust(16, b"\0"))
    sides = []
    for fe, name, gid in zip((fa, fb), names, gids, strict=True):
        fe.start()
        verbs = SimVerbs(fe, directory / "backend" / f"{name}.doorbell")
        verbs.add_gid(0, gid)
        pd = verbs.alloc_pd()
        cq = verbs.create_cq(4096)
        sides.append((verbs, pd, cq, verbs.create_qp(pd, cq, cq, depth=depth, max_sge=1, max_inline=0),
                      verbs.reg_mr(pd, 4 * MIB)))
    (va, pda, _, qpa, mra), (vb, _, cqb, qpb, mrb) = sides
    va.connect(qpa, qpb.qpn, gids[1], path_mtu=path_mtu)
    vb.connect(qpb, qpa.qpn, gids[0], path_mtu=path_mtu)
    # The requester's rings, doorbell page and memory as the C driver sees them.
    mem_b = int(nffi.cast("uintptr_t", nffi.from_buffer(fb.memory.map)))
    db_b = int(nffi.cast("uintptr_t", nffi.from_buffer(vb.doorbells)))
    queue = nffi.new("struct nat_queue *", {
        "base": mem_b + qpb.sq.base, "ring_hdr": mem_b + qpb.buf.gpa,
        "doorbells": db_b, "depth": qpb.sq.depth, "stride": qpb.sq.stride, "prod": qpb.sq.prod, "db": qpb.sq.db,
        "wake_fd": fb.queues[abi.const("VRDMA_QUEUE_WAKE")].kick})
    cq = nffi.new("struct nat_cq *", {"hdr": mem_b + cqb.buf.gpa, "cqes": mem_b + cqb.buf.gpa + 4096,
                                      "entries": cqb.entries, "cons": cqb.cons})

    def write(length: int) -> Any:
        return nffi.new("struct nat_write *", {"laddr": mrb.addr, "raddr": mra.addr, "lkey": mrb.lkey,
                                               "rkey": mra.rkey, "len": length})

    return NativePair(va, pda, fb, vb, queue, cq, write)


def _driver_failure(what: str, code: int) -> str:
    """What the C driver's negative return means (loadgen.h)."""
    why = {-1: f"no completion within {STREAM_TIMEOUT_NS // 10**9} s",
           -2: "a completion in error"}.get(code, f"code {code}")
    return f"{what} failed: {why}"


def native_backend() -> list[Metric]:
    """The backend at native speed: the simulated frontend plays two VMs, and a C driver (vrdma.testing.loadgen)
    posts RDMA WRITEs and polls completions the way libvrdma does, so the figures are the backend's."""
    from vrdma.testing._loadgen import ffi as nffi  # built by `make backend`
    from vrdma.testing._loadgen import lib as nlib

    guests = [GuestIdentity(0), GuestIdentity(1)]
    command = "vrdma bench (simulated frontend, native driver)"
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, \
            daemon_launcher.for_guests(Path(tmp), guests) as backend, \
            Frontend(str(socket_path(Path(tmp), guests[0])), memory_size=GIB + 256 * MIB) as fa, \
            Frontend(str(socket_path(Path(tmp), guests[1])), memory_size=256 * MIB) as fb:
        assert backend.process is not None
        pair = native_pair(Path(tmp), fa, fb, (guests[0].name, guests[1].name), QUEUE_DEPTH)
        va, pda, queue, cq, write = pair.responder, pair.responder_pd, pair.queue, pair.cq, pair.write
        results: list[Metric] = []
        samples = nffi.new("int64_t[]", LATENCY_WRITES)
        code = nlib.nat_write_latency(queue, cq, write(8), LATENCY_WRITES, samples, STREAM_TIMEOUT_NS, 0)
        if code != 0:
            raise RuntimeError(_driver_failure("8-byte WRITE latency run", code))
        lat = [samples[i] / 1000 for i in range(LATENCY_WARMUP, LATENCY_WRITES)]
        results += [
            Metric("backend_db_to_cqe_p50_us", round(statistics.median(lat), 2), "us", command),
            Metric("backend_db_to_cqe_p99_us", round(_pct(lat, 99), 2), "us", command),
        ]
        count = RATE_WRITES
        elapsed = nlib.nat_write_stream(queue, cq, write(8), count, RATE_SIGNAL_EVERY, STREAM_TIMEOUT_NS)
        if elapsed < 0:
            raise RuntimeError(_driver_failure("8-byte WRITE stream", elapsed))
        results.append(Metric("backend_write_rate_8b_mops", round(count / elapsed * 1000, 3), "Mops/s", command))
        count = BW_WRITES
        cpu_before = backend.process.cpu_times()
        elapsed = nlib.nat_write_stream(queue, cq, write(MIB), count, BW_SIGNAL_EVERY, STREAM_TIMEOUT_NS)
        cpu_after = backend.process.cpu_times()
        if elapsed < 0:
            raise RuntimeError(_driver_failure("1 MiB WRITE stream", elapsed))
        gigabytes = count * MIB / 1e9
        cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
        results += [
            Metric("backend_write_bw_1mib_gbps", round(gigabytes / (elapsed / 1e9), 2), "GB/s", command),
            Metric("backend_cpu_s_per_gb", round(cpu / gigabytes, 3), "CPU s/GB", command),
        ]
        # Registering 1 GiB (262,144 pages): the REG_MR round trip, page lists prepared beforehand.
        big = va.alloc(GIB)
        pages = va.page_list(big)
        start = time.perf_counter()
        va.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=pda, access=0xF, iova=big.gpa,
                length=GIB, page_offset=0, pages=pages)
        results.append(Metric("backend_reg_mr_1gib_ms", round((time.perf_counter() - start) * 1000, 1), "ms",
                              command))
    return results


def memcpy_bandwidth() -> list[Metric]:
    """The physical reference: copying buffers in this process, in C (memcpy) and in Python (memoryview)."""
    from vrdma.testing._loadgen import ffi as nffi
    from vrdma.testing._loadgen import lib as nlib

    results: list[Metric] = []
    src, dst = bytearray(os.urandom(4 * MIB)), bytearray(4 * MIB)
    psrc, pdst = (int(nffi.cast("uintptr_t", nffi.from_buffer(b))) for b in (src, dst))
    sweep = {}
    for size in (4096, 16384, 65536, 262144, MIB, 4 * MIB):
        iters = max(16, (512 * MIB) // size)
        sweep[size] = size * iters / (nlib.nat_memcpy(pdst, psrc, size, iters) / 1e9) / 1e9
    # The headline reference is the median of five measurements, like the figures it is compared with.
    sweep[MIB] = statistics.median(MIB * 512 / (nlib.nat_memcpy(pdst, psrc, MIB, 512) / 1e9) / 1e9
                                   for _ in range(5))
    results.append(Metric("memcpy_1mib_gbps", round(sweep[MIB], 2), "GB/s", "vrdma bench (C memcpy, 1 MiB)",
                          sweep={str(k): round(v, 2) for k, v in sweep.items()}))
    view_src, view_dst = memoryview(src)[:MIB], memoryview(dst)[:MIB]
    iters = 512
    start = time.perf_counter()
    for _ in range(iters):
        view_dst[:] = view_src
    python_gbps = MIB * iters / (time.perf_counter() - start) / 1e9
    results.append(Metric("memcpy_1mib_python_gbps", round(python_gbps, 2), "GB/s",
                          "vrdma bench (Python memoryview copy, 1 MiB)"))
    return results


# Guest side: message sizes for the bandwidth sweeps, and how many messages per size for each device (rxe under
# TCG moves a few MB/s: it gets fewer messages, the figure is the rate either way).


IDLE_SIM_QPS = 100            # idle RC QPs of two simulated drivers that do not ask for the doorbell recheck ...
IDLE_SIM_SECONDS = 10.0       # ... and how long the backend's CPU time is counted


def idle_without_recheck(qps: int = IDLE_SIM_QPS, seconds: float = IDLE_SIM_SECONDS) -> list[Metric]:
    """The backend's CPU while idle when no driver asks for the doorbell recheck (VRDMA_F_DOORBELL_RECHECK: what a
    driver on KVM or bare metal does; the harness's TCG guests ask, so `backend_idle_cpu_pct` is with it): two
    simulated VMs holding ``qps`` connected RC QPs between them, the engine parked, psutil CPU times."""
    from vrdma.testing.simulated_guest import SimVerbs

    guests = [GuestIdentity(0), GuestIdentity(1)]
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, \
            daemon_launcher.for_guests(Path(tmp), guests) as daemon, \
            Frontend(str(socket_path(Path(tmp), guests[0]))) as fa, \
            Frontend(str(socket_path(Path(tmp), guests[1]))) as fb:
        sides = []
        for fe, guest in ((fa, guests[0]), (fb, guests[1])):
            fe.start()  # no device feature accepted: no recheck
            verbs = SimVerbs(fe, Path(tmp) / "backend" / f"{guest.name}.doorbell")
            gid = guest.name.encode().ljust(16, b"\0")
            verbs.add_gid(0, gid)
            pd, cq = verbs.alloc_pd(), verbs.create_cq(64)
            sides.append((verbs, gid, [verbs.create_qp(pd, cq, cq, depth=16) for _ in range(qps // 2)]))
        (va, ga, qa), (vb, gb, qb) = sides
        for a, b in zip(qa, qb, strict=True):
            va.connect(a, b.qpn, gb)
            vb.connect(b, a.qpn, ga)
        deadline = time.monotonic() + 60
        while not (va.parked() and vb.parked()):
            if time.monotonic() > deadline:
                raise RuntimeError("the backend's engine never parked")
            time.sleep(0.01)  # another process's state: nothing to wait on
        assert daemon.process is not None
        process = daemon.process
        before, start = process.cpu_times(), time.monotonic()
        time.sleep(seconds)  # the measurement's length
        after, wall = process.cpu_times(), time.monotonic() - start
    percent = round(100.0 * ((after.user - before.user) + (after.system - before.system)) / wall, 3)
    log.info("backend CPU with 2 simulated VMs and %d idle QPs, no recheck: %.3f%% of one core", qps, percent)
    return [Metric("backend_idle_cpu_no_recheck_pct", percent, "% of a core",
                   f"vrdma bench (2 simulated VMs not asking for the recheck, {qps} idle RC QPs, {seconds:g} s)")]
