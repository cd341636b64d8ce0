"""`make demo` / `vrdma demo`: the main job.

Boots two guests, each with a vrdma device (vrdma0, served by one backend process on the host), and runs
unmodified libibverbs programs between them over vrdma0: ibv_rc_pingpong at two message sizes, ib_write_bw and
ib_send_lat (perftest). Prints a table of what they measured, with the accelerator the guests ran under (under
TCG the guests' CPUs are emulated: the numbers say more about the emulator than about the device).
"""

from __future__ import annotations

import logging

from vrdma import paths
from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster

log = logging.getLogger(__name__)

DEVICE = "vrdma0"
PINGPONG = [(4096, 1000), (65536, 200)]  # (message size in bytes, iterations): seconds under TCG


def run(accel: str = "auto") -> int:
    with Cluster(2, paths.build_dir() / "demo", accel=accel) as guests:
        server, client = guests[0], guests[1]
        gid = verbs.ipv4_gid_index(server, DEVICE)
        log.info("%s (%s) -> %s (%s) over %s, GID index %d", client.name, client.address, server.name,
                 server.address, DEVICE, gid)
        rows: list[tuple[str, str, str]] = []
        for size, n in PINGPONG:
            r = verbs.rc_pingpong(server, client, DEVICE, gid, size=size, iterations=n)
            rows.append((f"ibv_rc_pingpong {size} B x{r.iterations}", f"{r.mbit_per_s:.1f} Mbit/s",
                         f"{r.usec_per_iter:.1f} us/iteration"))
        bw = verbs.perftest(server, client, "ib_write_bw", DEVICE, gid)[-1]
        rows.append((f"ib_write_bw {int(bw['#bytes'])} B x{int(bw['#iterations'])}",
                     f"{bw['BW average[MiB/sec]']:.0f} MiB/s", f"{bw['MsgRate[Mpps]']:.4f} Mpps"))
        lat = verbs.perftest(server, client, "ib_send_lat", DEVICE, gid)[-1]
        rows.append((f"ib_send_lat {int(lat['#bytes'])} B x{int(lat['#iterations'])}",
                     f"{lat['t_typical[usec]']:.1f} us typical", f"{lat['t_avg[usec]']:.1f} us average"))
        print(f"\nvrdma demo: {client.name} -> {server.name} over {DEVICE} (vrdma backend on the host), "
              f"{guests.accel.upper()}")
        for name, first, second in rows:
            print(f"  {name:<32} {first:>18}   {second}")
        boots = ", ".join(f"{vm.name} {vm.boot_seconds:.1f} s" for vm in guests if vm.boot_seconds is not None)
        print(f"boot to ready: {boots}")
        if guests.backend is not None:
            print(f"backend log: {guests.backend.log_file}")
        print()
    return 0
