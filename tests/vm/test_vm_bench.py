"""`vrdma bench`: every benchmark runs and writes its result (values are measurements, reported, not judged)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm  # the idle-CPU benchmark boots two guests


def test_bench_writes_results_json(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-m", "vrdma.cli", "bench", "--smoke", "--iterations", "100",
                          "--output", str(out)],
                         check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"vrdma bench failed (exit {run.returncode}):\n{run.stdout[-4000:]}{run.stderr[-8000:]}"
    results = {r["name"]: r for r in json.loads(out.read_text())}
    assert {"backend_control_rtt_p50_us", "backend_control_rtt_p99_us", "backend_idle_cpu_pct", "memcpy_1mib_gbps",
            "backend_idle_cpu_no_recheck_pct", "backend_command_time_p50_us", "backend_command_time_p99_us",
            "backend_db_to_cqe_p50_us", "backend_db_to_cqe_p99_us", "backend_write_rate_8b_mops",
            "backend_write_bw_1mib_gbps", "backend_cpu_s_per_gb", "backend_reg_mr_1gib_ms",
            # the noisy neighbour: the victim alone and beside floods, and what the floods moved
            *(f"neighbour_victim_write_{condition}_{q}_us" for condition in ("alone", "flood_1mib", "flood_8b")
              for q in ("p50", "p99", "p999")),
            *(f"neighbour_victim_control_{condition}_p99_us" for condition in ("alone", "flood_1mib", "flood_8b")),
            "neighbour_flood_1mib_gbps", "neighbour_flood_8b_gbps", "neighbour_victim_write_p99_flood_1mib_vs_alone",
            # the engine shared: weights and a limit honoured
            "sharing_weight_1to1_ratio", "sharing_weight_3to1_ratio", "sharing_limit_rate_ratio",
            # the engine's threads: two floods served by one and by two
            *(f"scaling_{size}_{threads}_threads" for size in ("1mib_gbps", "8b_mops") for threads in (1, 2)),
            "scaling_1mib_2_threads_vs_1", "scaling_8b_2_threads_vs_1",
            # NVMe over Fabrics over vrdma and rxe, and NVMe/TCP over virtio-net, in the same guests
            *(f"{name}_{io}" for name in ("vrdma_nvmeof", "rxe_nvmeof", "nvmetcp")
              for io in ("randread_4k_iops", "seqread_128k_gbps")),
            # between hosts: vrdma, vrdma with rxe, rxe, and the path's UDP reference
            "interhost_vrdma_write_bw_1mib_gbps", "interhost_vrdma_rxe_write_bw_1mib_gbps",
            "interhost_rxe_write_bw_1mib_gbps", "interhost_udp_gbps", "interhost_vrdma_write_lat_small_us",
            "interhost_rxe_write_lat_small_us",
            # between two backends without guests, and that path's UDP reference
            "interhost_backends_write_bw_1mib_gbps", "interhost_backends_udp_gbps",
            "interhost_backends_udp_roce_size_gbps", "interhost_backends_write_bw_vs_udp",
            "interhost_backends_write_bw_vs_udp_roce_size",
            # the backend killed under traffic and restarted: until vrdma0 is usable again in both guests
            "backend_restart_to_usable_ms",
            # a live migration and a backend upgrade under traffic
            "migration_device_downtime_ms", "migration_peer_blackout_ms", "migration_qemu_downtime_ms",
            "migration_qemu_total_ms", "migration_state_bytes", "backend_upgrade_pause_ms",
            "backend_upgrade_handover_ms",
            # containers on the same device: perftest between containers, and between a container and a VM
            "container_write_bw_1mib_gbps", "container_vm_write_bw_1mib_gbps", "container_write_lat_small_us",
            "container_write_bw_1mib_vs_memcpy", "container_vm_write_bw_1mib_vs_memcpy"} <= set(results)
    for name, result in results.items():
        assert result["command"].startswith("vrdma bench"), name
        value = result["value"]
        assert isinstance(value, (int, float)) and math.isfinite(value), (name, value)
        # A share of CPU may be 0 (an idle backend), and at most every core; every other figure is a rate, a time
        # or a ratio.
        cores = os.cpu_count() or 1
        assert 0 <= value <= 100 * cores if result["unit"].startswith("%") else value > 0, (name, value)
    for pair in (("backend_control_rtt_p50_us", "backend_control_rtt_p99_us"),
                 ("backend_db_to_cqe_p50_us", "backend_db_to_cqe_p99_us")):
        assert 0 < results[pair[0]]["value"] <= results[pair[1]]["value"]
    assert results["backend_write_bw_1mib_gbps"]["value"] > 0 and results["memcpy_1mib_gbps"]["value"] > 0
    assert results["backend_idle_cpu_pct"]["unit"] == "% of a core"
