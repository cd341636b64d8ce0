"""`make bench` / `vrdma bench`: benchmarks, written to build/bench/results.json and printed as a table.

For now: the control-command round trip (QUERY_DEVICE) through the simulated frontend against a real
`vrdma backend` process, i.e. the backend at native speed without a guest. Each result is one object with
name, value, unit and the command that measures it, so runs can be compared over time.
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


def run(iterations: int = 5000, output: Path | None = None) -> int:
    log.info("control-command round trip: %d QUERY_DEVICE through the simulated frontend", iterations)
    results = control_round_trip(iterations)
    out = output or paths.build_dir() / "bench" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'metric':<32} {'value':>10}  unit")
    for r in results:
        print(f"{r['name']:<32} {r['value']:>10}  {r['unit']}")
    print(f"written to {out}")
    return 0
