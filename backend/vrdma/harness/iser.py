"""iSCSI Extensions for RDMA (iSER) between guests: the kernel's SCSI target (LIO, configured with targetcli from
targetcli-fb) in one guest exporting a RAM disk through an iSCSI portal with iSER enabled (ib_isert), open-iscsi's
initiator (iscsid and iscsiadm, with the ib_iser transport) in another discovering it and logging in to it over
iser: nothing goes over iSCSI/TCP, everything over RDMA on whichever RDMA device holds the target's address
(vrdma0). Each side is a context manager that undoes what it did, modules included, and says what failed with the
kernel's log."""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass

from vrdma.harness.errors import AgentError
from vrdma.harness.vm import Vm, unload

log = logging.getLogger(__name__)

IQN = "iqn.2026-11.org.vrdma:target"
INITIATOR_IQN = "iqn.2026-11.org.vrdma:initiator"
PORT = 3260  # iSCSI (IANA), in the RDMA CM's port space for iSER
# targetcli asks the system bus whether tcmu-runner offers backstores and gives up without a bus: a bus of its own
# (dbus-daemon with the session policy: one user, root) where it looks for the system's.
SYSTEM_BUS = "/run/dbus/system_bus_socket"
DBUS_PID = "/run/dbus/vrdma-target.pid"


@dataclass(frozen=True)
class Target:
    vm: Vm
    iqn: str
    size_mib: int


@contextlib.contextmanager
def target(vm: Vm, size_mib: int = 64, iqn: str = IQN) -> Iterator[Target]:
    """LIO in ``vm`` exporting one RAM disk of ``size_mib`` MiB as LUN 0 of ``iqn`` on ``vm``'s address, port 3260,
    iSER enabled, to any initiator without authentication; cleared and unloaded after."""
    tpg, portal = f"/iscsi/{iqn}/tpg1", f"{vm.address}:{PORT}"
    q = shlex.quote
    vm.setup(f"""
modprobe ib_isert
grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs none /sys/kernel/config
mkdir -p /run/dbus /etc/target
dbus-daemon --session --address=unix:path={SYSTEM_BUS} --fork --print-pid > {DBUS_PID}
targetcli set global auto_save_on_exit=false
targetcli /backstores/ramdisk create name=rd0 size={size_mib}M
targetcli /iscsi create {q(iqn)}
targetcli {q(tpg)}/luns create /backstores/ramdisk/rd0
targetcli {q(tpg)}/portals delete 0.0.0.0 {PORT}
targetcli {q(tpg)}/portals create {vm.address} {PORT}
targetcli {q(tpg)}/portals/{portal} enable_iser boolean=true
targetcli {q(tpg)} set attribute authentication=0 generate_node_acls=1 demo_mode_write_protect=0
""", "setting up the iSER target")
    log.info("%s: LIO exports %s (a %d MiB RAM disk) on iser %s", vm.name, iqn, size_mib, portal)
    try:
        yield Target(vm, iqn, size_mib)
    finally:
        vm.setup(f"""
targetcli clearconfig confirm=True
kill $(cat {DBUS_PID}) && rm -f {DBUS_PID} {SYSTEM_BUS}
rmdir /sys/kernel/config/target/iscsi  # (the fabric's directory holds its module)
{unload("ib_isert", "iscsi_target_mod", "target_core_mod")}
""", "tearing down the iSER target")


@contextlib.contextmanager
def initiator(vm: Vm, target: Target, timeout: float = 60.0) -> Iterator[str]:
    """iscsid in ``vm``, discovery of the target and a login, both over iser; yields the LUN's block device; logs
    out, stops iscsid and unloads ib_iser."""
    portal = f"{target.vm.address}:{PORT}"
    node = f"-m node -T {shlex.quote(target.iqn)} -p {portal}"
    vm.setup(f"""
modprobe ib_iser
modprobe sd_mod  # (no udev here to load it for the LUN)
mkdir -p /etc/iscsi /run/lock/iscsi /var/lib/iscsi
echo InitiatorName={INITIATOR_IQN} > /etc/iscsi/initiatorname.iscsi
iscsid
iscsiadm -m discovery -t sendtargets -p {portal} -I iser
iscsiadm {node} --login
""", "logging in to the iSER target", timeout=timeout, peers=[target.vm])
    try:
        device = _disk(vm, target.iqn, timeout)
        log.info("%s: %s is LUN 0 of %s on %s over iser", vm.name, device, target.iqn, target.vm.name)
        yield device
    finally:
        vm.setup(f"""
iscsiadm {node} --logout
iscsiadm {node} -o delete
iscsiadm -k 0  # iscsid stops
{unload("ib_iser")}
""", "logging out of the iSER target")


def session_transport(vm: Vm) -> str:
    """The transport of ``vm``'s one iSCSI session, as iscsiadm names it ("iser", "tcp")."""
    out = vm.run(["iscsiadm", "-m", "session"]).check("iscsiadm -m session").stdout
    match = re.match(r"(\w+): \[\d+\]", out)
    if match is None:
        raise AgentError(f"no iSCSI session in {vm.name}: {out!r}")
    return match.group(1)


def _disk(vm: Vm, iqn: str, timeout: float) -> str:
    """The SCSI disk the session to ``iqn`` attached, once its block device exists."""
    deadline = time.monotonic() + timeout
    while True:
        out = vm.run(["iscsiadm", "-m", "session", "-P", "3"]).stdout
        if iqn in out:
            disks = re.findall(r"Attached scsi disk (\w+)\s+State: running", out)
            if disks and vm.run(["test", "-b", f"/dev/{disks[0]}"]).exit_status == 0:
                return f"/dev/{disks[0]}"
        if time.monotonic() > deadline:
            raise AgentError(f"no disk of {iqn} appeared in {vm.name} within {timeout:g} s:\n{out}")
        time.sleep(0.2)
