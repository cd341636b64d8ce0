"""The first programs a user runs on a new vrdma guest, between two guests: the guest kernel smoke
(tests/vm/test_vm_kernels.py) and the full Debian guest (tests/vm/test_vm_debian_guest.py) run the same checks."""

from __future__ import annotations

import re

from polling import wait_until
from storage_checks import VERIFY

from vrdma.harness import fio, nvmeof, verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Vm

DEVICE = "vrdma0"
RPING_PORT = 7174
PINGS = 100


def check_port_active(cluster: Cluster, release: str) -> None:
    """Each guest runs ``release``, its vrdma.ko was built for it, the port is active and the kernel log clean."""
    for vm in cluster:
        assert vm.run(["uname", "-r"]).check("uname").stdout.strip() == release
        vermagic = vm.run(["modinfo", "-F", "vermagic", "vrdma"]).check("modinfo vrdma").stdout.split()
        assert vermagic[:1] == [release]
        info = vm.run(["ibv_devinfo", "-d", DEVICE]).check("ibv_devinfo").stdout
        assert re.search(r"state:\s+PORT_ACTIVE", info) and re.search(r"link_layer:\s+Ethernet", info), info
        log = vm.run(["dmesg"]).check("dmesg").stdout
        assert "WARNING" not in log and "BUG" not in log, log[-3000:]


def check_rc_pingpong(cluster: Cluster) -> None:
    """ibv_rc_pingpong -c: user verbs through libvrdma, every message's data checked."""
    server, client = cluster[0], cluster[1]
    result = verbs.rc_pingpong(server, client, DEVICE, verbs.ipv4_gid_index(server, DEVICE), size=4096,
                               iterations=200, extra=("-c",))
    assert result.iterations == 200


def check_rping(cluster: Cluster) -> None:
    """The kernel's RDMA CM (its MADs through the GSI QP, then RC): rping checks the data of every ping."""
    server, client = cluster[0], cluster[1]
    _, out = verbs.client_server(
        server, client, ["rping", "-s", "-a", server.address, "-V", "-C", str(PINGS), "-p", str(RPING_PORT)],
        port=RPING_PORT, rdma_cm=True,
        client_argv=["rping", "-c", "-a", server.address, "-V", "-C", str(PINGS), "-v", "-p", str(RPING_PORT)])
    assert out.stdout.count("ping data: rdma-ping-") == PINGS, out.stdout[-2000:]


PORT = f"/sys/class/infiniband/{DEVICE}/ports/1"
# The PMA's counters (the `counters` directory the core makes for a driver that answers PortCounters) and the
# driver's named counters they come from (`hw_counters`, what `rdma statistic` shows); data in four-byte words.
PMA_FROM_HW = {"port_xmit_data": "tx_bytes", "port_rcv_data": "rx_bytes", "port_xmit_packets": "tx_packets",
               "port_rcv_packets": "rx_packets", "unicast_xmit_packets": "tx_packets",
               "unicast_rcv_packets": "rx_packets"}
LINK_ERRORS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors", "port_xmit_discards",
               "multicast_xmit_packets", "multicast_rcv_packets")


def _read_port(vm: Vm) -> dict[str, int]:
    files = [f"{PORT}/hw_counters/{name}" for name in sorted(set(PMA_FROM_HW.values()))]
    files += [f"{PORT}/counters/{name}" for name in (*PMA_FROM_HW, *LINK_ERRORS)]
    out = vm.run(["sh", "-c", 'for f in "$@"; do printf "%s %s\\n" "${f##*/}" "$(cat "$f")"; done', "sh", *files])
    lines = out.check("port counters").stdout.splitlines()
    return {name: int(value) for name, value in (line.split() for line in lines)}


def quiet_port_counters(vm: Vm) -> dict[str, int]:
    """The port's counters, read twice alike (nothing moved in between), by file name."""
    readings = [_read_port(vm)]
    wait_until(f"{vm.name}'s port counters to hold still",
               lambda: readings.append(_read_port(vm)) or readings[-1] == readings[-2], 30, interval=0.5)
    return readings[-1]


def check_port_counters(cluster: Cluster) -> None:
    """After traffic of its own, the PMA's PortCounters (sysfs `counters`, what node_exporter and its kind read)
    carry the driver's data counters: PortXmitData is tx_bytes in four-byte words, all packets unicast, a link
    without errors."""
    check_rc_pingpong(cluster)
    for vm in cluster:
        port = quiet_port_counters(vm)
        assert port["tx_bytes"] > 0 and port["rx_bytes"] > 0 and port["tx_packets"] > 0, port
        for pma, hw in PMA_FROM_HW.items():
            assert port[pma] == (port[hw] // 4 if pma.endswith("_data") else port[hw]), (vm.name, pma, port)
        assert all(port[name] == 0 for name in LINK_ERRORS), (vm.name, port)


def check_nvmeof(cluster: Cluster) -> None:
    """nvmet-rdma in one guest, nvme-rdma in the other (fast registration, remote invalidation): fio writes the
    namespace and reads every block back, checking each."""
    target_vm, host_vm = cluster[0], cluster[1]
    with nvmeof.target(target_vm, "rdma", size_mib=32) as exported, nvmeof.host(host_vm, exported) as device:
        job = fio.job(host_vm, device, "--rw=randwrite", "--bs=4k", "--iodepth=16", "--size=8M", *VERIFY)
    assert job["error"] == 0 and job["write"]["io_bytes"] == job["read"]["io_bytes"] == 8 << 20, job
