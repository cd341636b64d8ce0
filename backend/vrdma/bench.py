"""`make bench` / `vrdma bench`: benchmarks, written to build/bench/results.json and printed as a table.

For now: the control-command round trip (QUERY_DEVICE) through the simulated frontend against a real
`vrdma backend` process, i.e. the backend at native speed without a guest. Each result is one object with
name, value, unit and the command that measures it, so runs can be compared over time.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vrdma import paths
from vrdma.device import abi
from vrdma.errors import VrdmaError
from vrdma.testing.frontend import Frontend

log = logging.getLogger(__name__)

WARMUP = 200


def _start_backend(directory: Path) -> subprocess.Popen[bytes]:
    read_end, write_end = os.pipe()
    with (directory / "backend.log").open("wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "vrdma.cli", "backend", "--socket-path",
                                 f"bench={directory / 'bench.sock'}", "--ready-fd", str(write_end)],
                                pass_fds=[write_end], stdout=subprocess.DEVNULL, stderr=log_file)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        if ready.read() != b"READY\n":
            proc.kill()
            raise VrdmaError(f"the backend did not start: {(directory / 'backend.log').read_text()}")
    return proc


def control_round_trip(iterations: int) -> list[dict[str, Any]]:
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE")}))
    response_size = abi.sizeof("vrdma_resp_query_device")
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp:
        proc = _start_backend(Path(tmp))
        try:
            with Frontend(str(Path(tmp) / "bench.sock")) as fe:
                fe.start()
                samples = []
                for i in range(WARMUP + iterations):
                    start = time.perf_counter_ns()
                    fe.command(request, response_size)
                    if i >= WARMUP:
                        samples.append((time.perf_counter_ns() - start) / 1000)
        finally:
            proc.terminate()
            proc.wait(10)
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
