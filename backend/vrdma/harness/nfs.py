"""NFS over RDMA between guests: the kernel's NFS server (nfsd, with rpc.mountd and exportfs from
nfs-kernel-server) in one guest exporting a tmpfs and listening for RPC-over-RDMA on port 20049, the kernel's
NFSv4 client in another mounting it with `proto=rdma`. The connection goes over whichever RDMA device holds the
server's address (vrdma0). Each side is a context manager that undoes what it did."""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

from vrdma.harness.vm import Vm, unload

log = logging.getLogger(__name__)

RDMA_PORT = 20049  # NFS over RDMA (IANA)
EXPORT = "/export"
MOUNTPOINT = "/mnt/nfs"
GRACE_S = 10  # NFSv4 grace period after nfsd starts (default 90 s): opens for writing wait it out


@dataclass(frozen=True)
class Server:
    vm: Vm
    export: str


@contextlib.contextmanager
def server(vm: Vm, size_mib: int = 128) -> Iterator[Server]:
    """nfsd in ``vm``: NFSv4 only, exporting a tmpfs of ``size_mib`` MiB as the root of its pseudo file system, on
    TCP 2049 and RDMA 20049; stopped and unloaded after."""
    vm.setup(f"""
modprobe nfsd
modprobe rpcrdma
mkdir -p {EXPORT} /var/lib/nfs/v4recovery /run/rpc_pipefs
grep -q ' /proc/fs/nfsd ' /proc/mounts || mount -t nfsd nfsd /proc/fs/nfsd
mount -t tmpfs -o size={size_mib}m tmpfs {EXPORT}
echo '{EXPORT} *(rw,no_root_squash,insecure,fsid=0,no_subtree_check)' > /etc/exports
exportfs -ra
echo {GRACE_S} > /proc/fs/nfsd/nfsv4gracetime
echo {GRACE_S} > /proc/fs/nfsd/nfsv4leasetime
rpc.mountd -N 3 -u
rpc.nfsd -N 3 -U 4
echo 'rdma {RDMA_PORT}' > /proc/fs/nfsd/portlist
grep -q 'rdma {RDMA_PORT}' /proc/fs/nfsd/portlist
""", "starting the NFS server")
    log.info("%s: nfsd exports %s (tmpfs, %d MiB) over RDMA on port %d", vm.name, EXPORT, size_mib, RDMA_PORT)
    try:
        yield Server(vm, EXPORT)
    finally:
        vm.setup(f"""
rpc.nfsd 0
exportfs -ua
killall rpc.mountd || true
umount {EXPORT}
umount /proc/fs/nfsd
{unload("nfsd", "rpcrdma")}
""", "stopping the NFS server")


@contextlib.contextmanager
def mount(vm: Vm, srv: Server, timeout: float = 90.0) -> Iterator[str]:
    """The server's export mounted in ``vm`` over RDMA (NFSv4, `proto=rdma,port=20049`); yields the mount point;
    unmounted and unloaded after."""
    vm.setup(f"""
modprobe nfsv4
modprobe rpcrdma
mkdir -p {MOUNTPOINT}
timeout {int(timeout)} mount -t nfs4 -o proto=rdma,port={RDMA_PORT} {shlex.quote(srv.vm.address)}:/ {MOUNTPOINT}
grep -q ' {MOUNTPOINT} nfs4 .*proto=rdma' /proc/mounts
""", "mounting NFS over RDMA", timeout=timeout + 30, peers=[srv.vm])
    log.info("%s: %s:%s mounted on %s over RDMA", vm.name, srv.vm.name, srv.export, MOUNTPOINT)
    try:
        yield MOUNTPOINT
    finally:
        vm.setup(f"umount {MOUNTPOINT}\n{unload('nfsv4', 'rpcrdma')}", "unmounting NFS")
