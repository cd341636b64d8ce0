"""Containers on the same device (issue 29; docs/containers.md): Debian's perftest in containers of one host
(vrdma.harness.container), against a VM of the same host, with the host's memcpy (the `memcpy` group) as the
reference:

- ``container_write_bw_1mib_gbps``: ib_write_bw, 1 MiB WRITEs, container to container (one copy by the engine);
- ``container_vm_write_bw_1mib_gbps``: the same, a container writing into a VM (TCG: the VM's side of perftest
  runs translated, the copy does not);
- ``container_write_lat_small_us``: ib_write_lat, 8-byte WRITEs, container to container, its median (t_typical).

rxe between two containers is not measured: these machines' kernels have no rxe (the figure where a host has it
would sit beside these).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from vrdma.bench.metric import Metric

log = logging.getLogger(__name__)

MIB = 1 << 20
BW_SECONDS = 10         # each ib_write_bw (-D); 1 in a smoke run
LAT_ITERATIONS = 20000  # ib_write_lat's; 1,000 in a smoke run


def containers(smoke: bool = False) -> list[Metric]:
    from vrdma.harness import verbs
    from vrdma.harness.container import Container, Side, client_server, root_filesystem
    from vrdma.harness.multihost import GuestPlan, MultiHost, guest_subnet

    bw_seconds, lat_iterations = ("1", "1000") if smoke else (str(BW_SECONDS), str(LAT_ITERATIONS))
    command = "vrdma bench --only containers"
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, \
            MultiHost(Path(tmp), [GuestPlan(0)], host_count=1) as mh:
        root, host, admin = root_filesystem(), mh.fabric[0], mh.backend_on(0).admin_socket
        with Container("c0", host, f"{guest_subnet(0)}.200", f"{guest_subnet(0)}.1", admin, Path(tmp), root) as c0, \
                Container("c1", host, f"{guest_subnet(0)}.201", f"{guest_subnet(0)}.1", admin, Path(tmp), root) as c1:

            def bw(server: Side, client: Side) -> float:
                out = client_server(server, client, "ib_write_bw", "-s", str(MIB), "-D", bw_seconds, "-F",
                                    "--report_gbits")
                return verbs.perftest_rows("ib_write_bw", out)[0]["BW average[Gb/sec]"] / 8  # GB/s

            results = [Metric("container_write_bw_1mib_gbps", round(bw(c0, c1), 3), "GB/s", command),
                       Metric("container_vm_write_bw_1mib_gbps", round(bw(mh[0], c0), 3), "GB/s", command)]
            out = client_server(c0, c1, "ib_write_lat", "-s", "8", "-n", lat_iterations, "-F")
            row = verbs.perftest_rows("ib_write_lat", out)[0]
            results.append(Metric("container_write_lat_small_us", row["t_typical[usec]"], "us", command))
    for metric in results:
        log.info("%s: %s %s", metric.name, metric.value, metric.unit)
    return results
