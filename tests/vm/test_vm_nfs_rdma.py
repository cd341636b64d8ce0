"""NFS over RDMA over vrdma0 between two guests: the kernel's NFS server (nfsd) in vm0 listens for RPC-over-RDMA on
port 20049 and exports a tmpfs; the kernel's NFSv4 client in vm1 mounts it with proto=rdma. Files written through
the mount are read back (after dropping the client's page cache) and read on the server itself, checksums compared.
xprtrdma and svcrdma register their pages with fast registration and invalidate them (the memory-management
extensions)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from vrdma.harness import nfs
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters

pytestmark = pytest.mark.vm

FILES = {"small": (4, 1), "one-mib": (1 << 20, 1), "sixteen-mib": (1 << 20, 16)}  # name: (block size, blocks)


@pytest.fixture(scope="module")
def server(two_guests: Cluster) -> Iterator[nfs.Server]:
    with nfs.server(two_guests[0]) as srv:
        yield srv


def sums(vm: object, paths: list[str]) -> dict[str, str]:
    out = vm.run(["sha256sum", *paths]).check("sha256sum").stdout  # type: ignore[attr-defined]
    return {path.rsplit("/", 1)[-1]: digest for digest, path in (line.split() for line in out.splitlines())}


def test_files_written_over_rdma_read_back_the_same_on_both_sides(two_guests: Cluster, server: nfs.Server) -> None:
    client = two_guests[1]
    assert two_guests.backend is not None
    before = vm_counters(two_guests.backend, "vm1")["engine"]
    client.run(["mkdir", "-p", "/tmp/src"]).check("mkdir")
    for name, (bs, count) in FILES.items():
        client.run(["dd", "if=/dev/urandom", f"of=/tmp/src/{name}", f"bs={bs}", f"count={count}"]).check("dd")
    written = sums(client, [f"/tmp/src/{name}" for name in FILES])
    with nfs.mount(client, server) as mnt:
        for name in FILES:
            client.run(["cp", f"/tmp/src/{name}", f"{mnt}/{name}"]).check(f"cp {name} over NFS")
        client.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"]).check("drop the page cache")
        read_back = sums(client, [f"{mnt}/{name}" for name in FILES])
        on_server = sums(server.vm, [f"{server.export}/{name}" for name in FILES])
        mounts = client.run(["cat", "/proc/mounts"]).check("mounts").stdout
    assert read_back == written == on_server
    assert re.search(r" /mnt/nfs nfs4 .*proto=rdma,port=20049", mounts), mounts
    after = vm_counters(two_guests.backend, "vm1")["engine"]
    total = sum(bs * count for bs, count in FILES.values())
    assert after["bytes"] - before["bytes"] >= 2 * total  # written and read back, through the device
