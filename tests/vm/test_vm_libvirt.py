"""libvirt: libvirtd on the host (vrdma.harness.libvirt: the host's libvirt-daemon, in a mount namespace of its own)
boots a domain with a vrdma device, defined as packaging/libvirt/vrdma-guest.xml defines one (shared memfd memory,
the project's QEMU as emulator, the named device through qemu:commandline, a virtio NIC whose MAC the device pairs
with), the test image booted directly instead of a disk. The QEMU hook (packaging/libvirt/qemu-hook: `vrdma
libvirt-hook`) adds the domain's device to the running backend before QEMU starts and removes it when the domain
is gone; in between the guest's vrdma0 is up and the backend serves it."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
from backend_process import BackendProcess
from polling import wait_until

from vrdma import paths
from vrdma.harness import qemu_cmdline
from vrdma.harness.libvirt import Libvirtd
from vrdma.harness.vm import Products

pytestmark = pytest.mark.vm

DOMAIN = "web1"
MAC = "52:54:00:76:72:00"
IDENTITY = qemu_cmdline.GuestIdentity(0)


def domain_xml(products: Products, directory: Path) -> str:
    """packaging/libvirt/vrdma-guest.xml's shape: TCG, the test image's kernel and initramfs instead of a disk."""
    firmware = list(products.qemu["firmware_dirs"])
    append = qemu_cmdline.kernel_append(IDENTITY)
    socket = directory / f"{DOMAIN}.sock"
    args = ["-L", firmware[0], "-L", firmware[1], "-chardev", f"socket,id=vrdma,path={socket},reconnect-ms=1000",
            "-device", "vhost-user-rdma-pci,chardev=vrdma,bus=pcie.0,addr=0x10"]
    return f"""<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{DOMAIN}</name>
  <memory unit='MiB'>1024</memory>
  <vcpu>1</vcpu>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{products.kernel["vmlinuz_path"]}</kernel>
    <initrd>{products.image["initrd_path"]}</initrd>
    <cmdline>{append}</cmdline>
  </os>
  <features><acpi/></features>  <!-- without it libvirt 9.0 passes -no-acpi, which QEMU 10 no longer has -->
  <on_reboot>destroy</on_reboot>
  <devices>
    <emulator>{products.qemu["binary_path"]}</emulator>
    <!-- no option ROM (the harness's guests boot without iPXE, which the host may not have: ipxe-qemu) -->
    <interface type='ethernet'><mac address='{MAC}'/><model type='virtio'/><rom enabled='no'/></interface>
    <serial type='file'><source path='{directory / "console.log"}'/><target port='0'/></serial>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
  </devices>
  <qemu:commandline>
{chr(10).join(f"    <qemu:arg value={quoteattr(str(a))}/>" for a in args)}
  </qemu:commandline>
</domain>
"""


@pytest.fixture()
def backend_only(tmp_path: Path) -> Iterator[BackendProcess]:
    """A backend serving no VM at start: the hook adds the domain's."""
    process = BackendProcess(tmp_path / "backend", names=())
    yield process
    if process.proc.poll() is None:
        assert process.stop() == 0, process.log_text()


def guest_run(libvirtd: Libvirtd, argv: list[str], timeout: float = 120.0) -> str:
    """A command in the guest through libvirt's own agent channel (guest-exec, then guest-exec-status)."""
    pid = libvirtd.agent(DOMAIN, "guest-exec", {"path": argv[0], "arg": argv[1:], "capture-output": True})["pid"]
    deadline = time.monotonic() + timeout
    while True:
        status = libvirtd.agent(DOMAIN, "guest-exec-status", {"pid": pid})
        if status["exited"]:
            out = base64.b64decode(status.get("out-data", "")).decode()
            assert status["exitcode"] == 0, (argv, out, base64.b64decode(status.get("err-data", "")).decode())
            return out
        assert time.monotonic() < deadline, f"{argv} did not finish within {timeout:g} s"
        time.sleep(0.5)  # the agent has no completion event: poll


def test_libvirtd_boots_a_domain_with_vrdma_and_its_hook_adds_and_removes_the_vm(
        products: Products, backend_only: BackendProcess, tmp_path: Path) -> None:
    directory = tmp_path / "domain"
    directory.mkdir()
    venv_vrdma = paths.project_root() / ".venv" / "bin" / "vrdma"
    hook = (paths.project_root() / "packaging" / "libvirt" / "qemu-hook").read_text().replace(
        'exec vrdma libvirt-hook "$@"', f'exec {venv_vrdma} libvirt-hook --admin-socket {backend_only.admin} "$@"')
    assert str(venv_vrdma) in hook
    with Libvirtd(tmp_path / "libvirt", hook=hook) as libvirtd:
        (directory / "domain.xml").write_text(domain_xml(products, directory))
        libvirtd.virsh("define", str(directory / "domain.xml"))
        libvirtd.virsh("start", DOMAIN)
        # The hook ran before QEMU: the backend has the VM, with the socket and MAC of the domain's definition.
        (listed,) = backend_only.admin_ask("vm-list")["vms"]
        assert listed["name"] == DOMAIN and listed["mac"] == MAC, listed
        assert listed["socket-path"] == str(directory / f"{DOMAIN}.sock"), listed
        wait_until("the guest's start-up line on its serial console",
                   lambda: "vrdma-guest-ready" in (directory / "console.log").read_text(errors="replace"), 180)
        wait_until("the guest agent through libvirt", lambda: libvirtd.virsh(
            "qemu-agent-command", DOMAIN, '{"execute":"guest-ping"}', check=False).returncode == 0, 120)
        info = guest_run(libvirtd, ["ibv_devinfo", "-d", "vrdma0"])
        assert re.search(r"state:\s+PORT_ACTIVE", info), info
        assert backend_only.admin_ask("vm-list")["vms"][0]["state"] == "connected"
        # libvirt marks the domain tainted for qemu:commandline, and says so in the domain's log.
        assert "custom-argv" in (tmp_path / "libvirt" / "log" / "qemu" / f"{DOMAIN}.log").read_text()
        libvirtd.virsh("destroy", DOMAIN)
        wait_until("the hook to remove the VM", lambda: backend_only.admin_ask("vm-list")["vms"] == [], 60)
        assert backend_only.proc.poll() is None, backend_only.log_text()  # the backend serves on
