"""`make bench` / `vrdma bench`: benchmarks, written to build/bench/results.json and printed as a table.

- the control-command round trip (QUERY_DEVICE) through the simulated frontend against a real
  `vrdma backend` process, i.e. the backend at native speed without a guest;
- the backend's CPU while idle: two guests connected, 100 connected idle RC QPs (50 in each guest), measured
  with psutil over 10 s once the engine had time to park. Reported, not asserted: a measurement, not a test.

Each result is one object with name, value, unit and the command that measures it, so runs can be compared.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from vrdma import paths
from vrdma.device import abi
from vrdma.harness.backend import BackendService, socket_path
from vrdma.harness.qemu_cmdline import GuestIdentity
from vrdma.testing.frontend import Frontend

log = logging.getLogger(__name__)

WARMUP = 200


def control_round_trip(iterations: int) -> list[dict[str, Any]]:
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE")}))
    response_size = abi.sizeof("vrdma_resp_query_device")
    guest = GuestIdentity(0)
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, BackendService(Path(tmp), [guest]) as backend, \
            Frontend(str(socket_path(backend.directory, guest))) as fe:
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


IDLE_QPS = 100
IDLE_SECONDS = 10.0
IDLE_SCRIPT = Path(__file__).parent / "harness" / "guest" / "idle_qps.py"


def idle_cpu(qps: int = IDLE_QPS, seconds: float = IDLE_SECONDS) -> list[dict[str, Any]]:
    """The backend's CPU use with two guests connected and ``qps`` idle QPs, measured with psutil."""
    from vrdma.harness.backend import admin
    from vrdma.harness.cluster import Cluster

    script = IDLE_SCRIPT.read_text()
    argv = ["python3", "-c", script, str(qps // 2)]
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, Cluster(2, Path(tmp)) as cluster:
        assert cluster.backend is not None and cluster.backend.process is not None
        holders = [(vm, vm.agent.spawn(argv)) for vm in cluster]
        try:
            deadline = time.monotonic() + 300
            while sum(admin(cluster.backend, {"command": "counters"})["vms"][vm.name]["objects"]["qp"]  # type: ignore[index]
                      for vm in cluster) < qps:
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


def run(iterations: int = 5000, output: Path | None = None) -> int:
    log.info("control-command round trip: %d QUERY_DEVICE through the simulated frontend", iterations)
    results = control_round_trip(iterations)
    log.info("backend CPU while idle: booting two guests with %d idle QPs", IDLE_QPS)
    results += idle_cpu()
    out = output or paths.build_dir() / "bench" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'metric':<32} {'value':>10}  unit")
    for r in results:
        print(f"{r['name']:<32} {r['value']:>10}  {r['unit']}")
    print(f"written to {out}")
    return 0
