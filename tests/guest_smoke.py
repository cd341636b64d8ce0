"""The first programs a user runs on a new vrdma guest, between two guests: the guest kernel smoke
(tests/vm/test_vm_kernels.py) and the full Debian guest (tests/vm/test_vm_debian_guest.py) run the same checks."""

from __future__ import annotations

import re

from storage_checks import VERIFY

from vrdma.harness import fio, nvmeof, verbs
from vrdma.harness.cluster import Cluster

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


def check_nvmeof(cluster: Cluster) -> None:
    """nvmet-rdma in one guest, nvme-rdma in the other (fast registration, remote invalidation): fio writes the
    namespace and reads every block back, checking each."""
    target_vm, host_vm = cluster[0], cluster[1]
    with nvmeof.target(target_vm, "rdma", size_mib=32) as exported, nvmeof.host(host_vm, exported) as device:
        job = fio.job(host_vm, device, "--rw=randwrite", "--bs=4k", "--iodepth=16", "--size=8M", *VERIFY)
    assert job["error"] == 0 and job["write"]["io_bytes"] == job["read"]["io_bytes"] == 8 << 20, job
