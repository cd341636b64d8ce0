"""`make bench` / `vrdma bench`: every benchmark, as Metrics written to build/bench/results.json with a plot
(the command line prints the table).

- host memcpy bandwidth (C memcpy, with a 4 KiB..4 MiB sweep, and Python's memoryview copy): the reference;
- the control-command round trip (QUERY_DEVICE) through the simulated frontend against a real
  `vrdma backend` process, i.e. the backend at native speed without a guest;
- the data path at native speed: the simulated frontend plays two VMs set up by vrdma.testing.simulated_guest, and a C
  driver (vrdma.testing.loadgen) posts RDMA WRITEs and polls completions as libvrdma does: doorbell-to-CQE
  latency (8 B), 8-byte WRITE rate, 1 MiB WRITE bandwidth, backend CPU seconds per GB, 1 GiB MR registration;
- the noisy neighbour (neighbours.py): four simulated VMs, a victim's 8-byte WRITE latency and control commands
  alone and beside a neighbour's flood of 1 MiB and of 8-byte WRITEs;
- the backend's CPU while idle: two guests connected, 100 connected idle RC QPs (50 in each guest), measured
  with psutil over 10 s once the engine had time to park. Reported, not asserted: a measurement, not a test;
- containers (containers.py): 1 MiB WRITE bandwidth container to container and container to VM, 8-byte WRITE
  latency container to container;
- between hosts (interhost.py): 1 MiB WRITE bandwidth and small WRITE latency between guests on two hosts for
  vrdma to vrdma, vrdma to rxe and rxe to rxe, and the same path's UDP throughput (iperf3) as the reference; and
  1 MiB WRITEs between two backends with simulated VMs (no guest on the cores), against the same kind of path.

Each result is a Metric (name, value, unit and the command that measures it), so runs can be compared. The
measurements live in backend.py (no guest) and guests.py (two booted guests).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from vrdma import paths
from vrdma.bench.backend import (
    IDLE_SIM_QPS,
    MIB,
    control_round_trip,
    idle_without_recheck,
    memcpy_bandwidth,
    native_backend,
)
from vrdma.bench.containers import containers
from vrdma.bench.guests import BW_TOOLS, IDLE_QPS, LAT_TOOLS, guests_vs_rxe, idle_cpu, plot
from vrdma.bench.interhost import between_backends, interhost
from vrdma.bench.metric import Metric, Report, write
from vrdma.bench.migration import migration
from vrdma.bench.neighbours import ROUNDS, SCALING_THREADS, noisy_neighbour, scaling, sharing

log = logging.getLogger(__name__)

SMOKE_IDLE_SECONDS = 2.0  # `--smoke`: the idle backend's CPU counted this long (10 s each in a measurement)


def ratios(results: list[Metric]) -> list[Metric]:
    """The comparisons the targets are stated in (docs/performance.md), from figures of this same run."""
    value = {r.name: r.value for r in results}
    command = "vrdma bench (ratio of figures measured in this run)"
    out = []

    def ratio(name: str, num: str, den: str) -> None:
        if value.get(num) is not None and value.get(den):
            out.append(Metric(name, round(value[num] / value[den], 3), "x", command))

    ratio("vrdma_write_bw_1mib_vs_memcpy", "vrdma_write_bw_1mib_gbps", "memcpy_1mib_gbps")
    ratio("vrdma_write_bw_1mib_vs_rxe", "vrdma_write_bw_1mib_gbps", "rxe_write_bw_1mib_gbps")
    ratio("vrdma_write_lat_vs_rxe", "vrdma_write_lat_small_us", "rxe_write_lat_small_us")
    ratio("vrdma_send_lat_vs_rxe", "vrdma_send_lat_small_us", "rxe_send_lat_small_us")
    ratio("vrdma_ud_send_lat_vs_rxe", "vrdma_ud_send_lat_small_us", "rxe_ud_send_lat_small_us")
    ratio("vrdma_ud_send_bw_4k_vs_rxe", "vrdma_ud_send_bw_4k_gbps", "rxe_ud_send_bw_4k_gbps")
    ratio("vrdma_qp_create_vs_rxe", "vrdma_qp_create_per_s", "rxe_qp_create_per_s")
    ratio("vrdma_cm_connect_vs_rxe", "vrdma_cm_connect_per_s", "rxe_cm_connect_per_s")
    ratio("backend_write_bw_1mib_vs_memcpy", "backend_write_bw_1mib_gbps", "memcpy_1mib_gbps")
    # containers (issue 29): >= 0.8x memcpy, container to container and container to VM
    ratio("container_write_bw_1mib_vs_memcpy", "container_write_bw_1mib_gbps", "memcpy_1mib_gbps")
    ratio("container_vm_write_bw_1mib_vs_memcpy", "container_vm_write_bw_1mib_gbps", "memcpy_1mib_gbps")
    # sharing a host (issue 27): the victim's p99 under a neighbour's flood against alone, <= 2x
    for flood in ("flood_1mib", "flood_8b"):
        ratio(f"neighbour_victim_write_p99_{flood}_vs_alone", f"neighbour_victim_write_{flood}_p99_us",
              "neighbour_victim_write_alone_p99_us")
        ratio(f"neighbour_victim_control_p99_{flood}_vs_alone", f"neighbour_victim_control_{flood}_p99_us",
              "neighbour_victim_control_alone_p99_us")
    # between hosts (issue 14): >= 0.5 of the UDP reference, >= 5x rxe's bandwidth, <= 0.5x its latency
    ratio("interhost_vrdma_write_bw_vs_udp", "interhost_vrdma_write_bw_1mib_gbps", "interhost_udp_gbps")
    ratio("interhost_vrdma_write_bw_vs_rxe", "interhost_vrdma_write_bw_1mib_gbps", "interhost_rxe_write_bw_1mib_gbps")
    ratio("interhost_vrdma_write_lat_vs_rxe", "interhost_vrdma_write_lat_small_us", "interhost_rxe_write_lat_small_us")
    # the backends alone between hosts (issue 27): >= 0.9 of the UDP reference
    ratio("interhost_backends_write_bw_vs_udp", "interhost_backends_write_bw_1mib_gbps", "interhost_backends_udp_gbps")
    ratio("interhost_backends_write_bw_vs_udp_roce_size", "interhost_backends_write_bw_1mib_gbps",
          "interhost_backends_udp_roce_size_gbps")
    for io, unit in (("randread_4k", "iops"), ("seqread_128k", "gbps")):
        ratio(f"vrdma_nvmeof_{io}_vs_nvmetcp", f"vrdma_nvmeof_{io}_{unit}", f"nvmetcp_{io}_{unit}")
        ratio(f"vrdma_nvmeof_{io}_vs_rxe", f"vrdma_nvmeof_{io}_{unit}", f"rxe_nvmeof_{io}_{unit}")
    return out


Sweeps = dict[str, dict[str, dict[int, float]]]  # device -> tool -> message size -> GB/s


def groups(iterations: int = 5000, scaling_threads: tuple[int, ...] = SCALING_THREADS,
           sweeps: Sweeps | None = None, smoke: bool = False) -> dict[str, tuple[str, Callable[[], list[Metric]]]]:
    """Every benchmark by name, in the order `vrdma bench` runs them: what it does (for the log) and how. The guests'
    bandwidth sweeps, which the plot draws, go into ``sweeps``. ``smoke``: every figure produced in a fraction of
    the time (one run of each, short waits, rxe's runs short: what `make test` checks), none of them a
    measurement."""

    def guests() -> list[Metric]:
        results, guest_sweeps = guests_vs_rxe(smoke)
        if sweeps is not None:
            sweeps.update(guest_sweeps)
        return results

    def idle() -> list[Metric]:
        if smoke:
            return idle_cpu(seconds=SMOKE_IDLE_SECONDS) + idle_without_recheck(seconds=SMOKE_IDLE_SECONDS)
        return idle_cpu() + idle_without_recheck()

    tools = ", ".join(BW_TOOLS + LAT_TOOLS + ["UD ib_send_lat/bw", "QP creation", "ibv_reg_mr", "cmtime",
                                              "NVMe-oF and NVMe/TCP with fio"])
    return {
        "control": (f"control-command round trip: {iterations} QUERY_DEVICE through the simulated frontend",
                    lambda: control_round_trip(iterations)),
        "memcpy": ("host memcpy bandwidth (C and Python)", memcpy_bandwidth),
        "native": ("backend at native speed: the simulated frontend as two VMs, a C driver posting RDMA WRITEs",
                   native_backend),
        "neighbour": ("the noisy neighbour: a victim's 8-byte WRITEs and commands beside a neighbour's flood "
                      "(four VMs)", lambda: noisy_neighbour(1 if smoke else ROUNDS)),
        "sharing": ("sharing the engine: two floods at weights 1:1 and 3:1, one under a byte limit (four VMs)",
                    sharing),
        "scaling": (f"the engine's threads: independent floods served by {', '.join(map(str, scaling_threads))} "
                    "engine thread(s)", lambda: scaling(scaling_threads)),
        "between-backends": ("between hosts without guests: two backends in two namespaces, 1 MiB WRITEs, iperf3 "
                             "between them", lambda: between_backends(smoke=smoke)),
        "idle": (f"backend CPU while idle: two guests with {IDLE_QPS} idle QPs, then two simulated VMs that do not "
                 f"ask for the doorbell recheck with {IDLE_SIM_QPS}", idle),
        "guests": (f"vrdma and rxe side by side in two guests ({tools})", guests),
        "interhost": ("between hosts: four guests on two hosts (vrdma and rxe on each), iperf3 between the hosts",
                      lambda: interhost(smoke=smoke)),
        "migration": ("live migration and a backend upgrade under ib_write_bw over 16 QPs and a checked WRITE "
                      "stream (two guests)", lambda: migration(smoke=smoke)),
        "containers": ("containers on the same device: perftest between two containers and between a container and "
                       "a VM (one host)", lambda: containers(smoke=smoke)),
    }


GROUPS = tuple(groups())  # the names `vrdma bench --only` takes


def run(iterations: int = 5000, output: Path | None = None, only: Sequence[str] = GROUPS,
        scaling_threads: tuple[int, ...] = SCALING_THREADS, smoke: bool = False) -> Report:
    """The benchmarks named in ``only`` (default: every one), one after the other (``smoke``: see groups); the
    results are written to ``output`` (JSON) with a plot beside it."""
    sweeps: Sweeps = {}
    table = groups(iterations, scaling_threads, sweeps, smoke)
    unknown = [name for name in only if name not in table]
    if unknown:
        raise ValueError(f"no benchmark named {', '.join(unknown)} (there are: {', '.join(table)})")
    results: list[Metric] = []
    for name, (what, measure) in table.items():
        if name in only:
            log.info("%s", what)
            results += measure()
    results += ratios(results)
    out = output or paths.build_dir() / "bench" / "results.json"
    write(results, out)
    memcpy_sweep = next((r.sweep for r in results if r.name == "memcpy_1mib_gbps"), None) or {}
    png = out.with_suffix(".png") if sweeps or memcpy_sweep else None
    if png:
        plot(sweeps, {int(k): v for k, v in memcpy_sweep.items() if int(k) <= MIB}, png)
    return Report(results, out, png)
