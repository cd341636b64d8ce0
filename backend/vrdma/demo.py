"""`make demo` / `vrdma demo`: the main job.

Boots two guests, each with a vrdma device (vrdma0, served by one backend process on the host), and runs
unmodified libibverbs programs between them over vrdma0: ibv_rc_pingpong at two message sizes, ib_write_bw and
ib_send_lat (perftest); then NVMe over Fabrics: the kernel's NVMe target in one guest exports a namespace in its
RAM, the other connects to it over vrdma0 and fio reads it (4 KiB random reads, 128 KiB sequential reads). Prints a
table of what they measured, with the accelerator the guests ran under (under
TCG the guests' CPUs are emulated: the numbers say more about the emulator than about the device).
"""

from __future__ import annotations

import logging

from vrdma import paths
from vrdma.harness import fio, nvmeof, verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Vm

log = logging.getLogger(__name__)

DEVICE = "vrdma0"
PINGPONG = [(4096, 1000), (65536, 200)]  # (message size in bytes, iterations): seconds under TCG
NVMEOF_MIB, NVMEOF_SECONDS = 64, 3


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
        rows += nvmeof_rows(server, client)
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


def nvmeof_rows(target_vm: Vm, host_vm: Vm) -> list[tuple[str, str, str]]:
    """NVMe-oF over vrdma0: fio from the host guest on the target guest's RAM namespace (written first)."""
    timed = (f"--runtime={NVMEOF_SECONDS}", "--time_based", f"--size={NVMEOF_MIB}M")
    with nvmeof.target(target_vm, "rdma", size_mib=NVMEOF_MIB) as exported, \
            nvmeof.host(host_vm, exported) as device:
        fio.job(host_vm, device, "--rw=write", "--bs=1M", "--iodepth=4", f"--size={NVMEOF_MIB}M")
        rand = fio.job(host_vm, device, "--rw=randread", "--bs=4k", "--iodepth=32", *timed)
        seq = fio.job(host_vm, device, "--rw=read", "--bs=128k", "--iodepth=8", *timed)
    return [("NVMe-oF fio 4 KiB random read", f"{rand['read']['iops']:.0f} IOPS",
             f"{rand['read']['clat_ns']['mean'] / 1000:.0f} us average, depth 32"),
            ("NVMe-oF fio 128 KiB read", f"{seq['read']['bw_bytes'] / 2**20:.0f} MiB/s",
             f"{seq['read']['iops']:.0f} IOPS, depth 8")]
