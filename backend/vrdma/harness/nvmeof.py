"""NVMe over Fabrics between guests: the kernel's target (nvmet, configured through configfs, exporting a RAM-backed
namespace) in one guest, the kernel's host (nvme-cli's `nvme connect`) in another, over RDMA (nvme-rdma and
nvmet-rdma, on whichever RDMA device holds the target's address: vrdma0, or rxe0 where vrdma is not loaded) or TCP
(NVMe/TCP over the guests' virtio-net, what a user without RDMA picks). Each side is a context manager that undoes
what it did, modules included, and says what failed with the kernel's log."""

from __future__ import annotations

import contextlib
import logging
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from vrdma.harness.errors import AgentError
from vrdma.harness.vm import Vm, unload

log = logging.getLogger(__name__)

NQN = "nqn.2026-11.org.vrdma:test"
PORT = 4420  # the NVMe over Fabrics port (IANA), for RDMA and TCP alike
NAMESPACE_FILE = "/tmp/nvmet-ns1.img"  # in the guest's RAM (its root file system is an initramfs)
CONFIGFS = "/sys/kernel/config"
TRANSPORTS = ("rdma", "tcp")


@dataclass(frozen=True)
class Target:
    vm: Vm
    transport: str
    nqn: str
    size_mib: int


# A guest, or how to find it when it is needed: a guest live-migrated meanwhile is a new Vm (Cluster.migrate).
Guest = Vm | Callable[[], Vm]


def _now(guest: Guest) -> Vm:
    return guest if isinstance(guest, Vm) else guest()


@contextlib.contextmanager
def target(guest: Guest, transport: str = "rdma", size_mib: int = 64, nqn: str = NQN) -> Iterator[Target]:
    """nvmet in ``guest`` exporting one namespace of ``size_mib`` MiB (a file in the guest's RAM, buffered: the
    initramfs has no O_DIRECT) on the guest's address, port 4420, to any host; torn down and unloaded after."""
    vm = _now(guest)
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r} (one of {', '.join(TRANSPORTS)})")
    subsystem, port = f"{CONFIGFS}/nvmet/subsystems/{nqn}", f"{CONFIGFS}/nvmet/ports/1"
    q = shlex.quote
    vm.setup(f"""
modprobe nvmet_{transport}
grep -q ' {CONFIGFS} ' /proc/mounts || mount -t configfs none {CONFIGFS}
truncate -s {size_mib}M {NAMESPACE_FILE}
mkdir {q(subsystem)}
echo 1 > {q(subsystem)}/attr_allow_any_host
mkdir {q(subsystem)}/namespaces/1
echo -n {NAMESPACE_FILE} > {q(subsystem)}/namespaces/1/device_path
echo 1 > {q(subsystem)}/namespaces/1/buffered_io
echo 1 > {q(subsystem)}/namespaces/1/enable
mkdir {port}
echo {vm.address} > {port}/addr_traddr
echo {transport} > {port}/addr_trtype
echo {PORT} > {port}/addr_trsvcid
echo ipv4 > {port}/addr_adrfam
ln -s {q(subsystem)} {port}/subsystems/{q(nqn)}
""", f"setting up the NVMe-oF target ({transport})")
    log.info("%s: nvmet exports %s (%d MiB in RAM) on %s %s:%d", vm.name, nqn, size_mib, transport, vm.address,
             PORT)
    try:
        yield Target(vm, transport, nqn, size_mib)
    finally:
        _now(guest).setup(f"""
rm -f {port}/subsystems/{q(nqn)}
rmdir {port}
echo 0 > {q(subsystem)}/namespaces/1/enable
rmdir {q(subsystem)}/namespaces/1
rmdir {q(subsystem)}
rm -f {NAMESPACE_FILE}
{unload(f"nvmet_{transport}", "nvmet")}
""", "tearing down the NVMe-oF target")


@contextlib.contextmanager
def host(guest: Guest, target: Target, timeout: float = 60.0) -> Iterator[str]:
    """``nvme connect`` from ``guest`` to the target; yields the namespace's block device; disconnects and unloads."""
    vm = _now(guest)
    vm.setup(f"modprobe nvme_{target.transport}\nnvme connect -t {target.transport} -a {target.vm.address} "
             f"-s {PORT} -n {shlex.quote(target.nqn)}", f"nvme connect ({target.transport})", timeout=timeout,
             peers=[target.vm])
    try:
        device = _namespace(vm, target.nqn, timeout)
        log.info("%s: %s is %s of %s over %s", vm.name, device, target.nqn, target.vm.name, target.transport)
        yield device
    finally:
        _now(guest).setup(f"nvme disconnect -n {shlex.quote(target.nqn)}\n"
                 f"{unload(f'nvme_{target.transport}', 'nvme_fabrics', 'nvme_core')}",
                 "nvme disconnect")


def _namespace(vm: Vm, nqn: str, timeout: float) -> str:
    """The block device of the first namespace of subsystem ``nqn``, once it exists: under the subsystem with
    native multipath (Debian's default), under the controller without it."""
    deadline = time.monotonic() + timeout
    script = (f"for d in /sys/class/nvme-subsystem/* /sys/class/nvme/*; do "
              f"[ \"$(cat $d/subsysnqn 2>/dev/null)\" = {shlex.quote(nqn)} ] && ls -d $d/nvme*n1 2>/dev/null; "
              "done; true")
    while True:
        for path in vm.run(["sh", "-c", script]).check("finding the namespace").stdout.split():
            device = f"/dev/{path.rsplit('/', 1)[-1]}"
            if vm.run(["test", "-b", device]).exit_status == 0:
                return device
        if time.monotonic() > deadline:
            raise AgentError(f"no namespace of {nqn} appeared in {vm.name} within {timeout:g} s")
        time.sleep(0.2)
