"""`make demo` / `vrdma demo`: the main job.

For now (the vrdma device answers control commands but has no guest driver yet) it boots two guests with the
device on their private link, gives each a software RoCE device (rxe) on eth0 and runs ibv_rc_pingpong between
them at a few message sizes, then prints a table and where the vrdma device is.
"""

from __future__ import annotations

import logging

from vrdma import paths
from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster

log = logging.getLogger(__name__)

DEVICE = "rxe0"
# (message size in bytes, iterations): sized to finish in seconds under TCG.
RUNS = [(64, 1000), (4096, 1000), (65536, 200)]


def run(accel: str = "auto") -> int:
    with Cluster(2, paths.build_dir() / "demo", accel=accel) as guests:
        server, client = guests[0], guests[1]
        for vm in guests:
            verbs.add_rxe(vm, DEVICE)
        gid = verbs.ipv4_gid_index(server, DEVICE)
        log.info("running ibv_rc_pingpong %s (%s) -> %s (%s) on %s, GID index %d",
                 client.name, client.address, server.name, server.address, DEVICE, gid)
        results = [verbs.rc_pingpong(server, client, DEVICE, gid, size=size, iterations=n) for size, n in RUNS]
        print(f"\nvrdma demo: ibv_rc_pingpong over {DEVICE} (software RoCE), {client.name} -> {server.name}, "
              f"{guests.accel.upper()}")
        print(f"{'size (B)':>10} {'iters':>7} {'Mbit/s':>10} {'usec/iter':>11}")
        for r in results:
            print(f"{r.size:>10} {r.iterations:>7} {r.mbit_per_s:>10.2f} {r.usec_per_iter:>11.2f}")
        boots = ", ".join(f"{vm.name} {vm.boot_seconds:.1f} s" for vm in guests if vm.boot_seconds is not None)
        print(f"boot to ready: {boots}")
        with_device = [vm.name for vm in guests if "1af4:106a" in vm.run(["lspci", "-n", "-d", "1af4:106a"]).stdout]
        if guests.backend is not None:
            print(f"vrdma device (virtio 42, 1af4:106a) in: {', '.join(with_device) or 'none'}; "
                  f"backend log: {guests.backend.log_file}")
        print()
    return 0
