"""The libvirt QEMU hook (vrdma libvirt-hook) against a running backend, with packaging/libvirt/vrdma-guest.xml as
the domain: `prepare begin` adds the VM with the definition's socket and MAC, `release end` removes it; a domain
without a vrdma device is left alone; a refusal stops the start with the backend's reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from backend_process import BackendProcess

pytestmark = pytest.mark.backend

DOMAIN = (Path(__file__).resolve().parents[2] / "packaging" / "libvirt" / "vrdma-guest.xml").read_text()


def hook(backend: BackendProcess, *argv: str, domain: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vrdma.cli", "libvirt-hook", "--admin-socket", str(backend.admin),
                           *argv], input=domain, capture_output=True, text=True, timeout=60, check=False)


def test_the_hook_adds_and_removes_the_domains_vm(backend: BackendProcess) -> None:
    socket_path = backend.directory / "web1.sock"
    domain = DOMAIN.replace("/run/vrdma/web1.sock", str(socket_path))
    started = hook(backend, "web1", "prepare", "begin", "-", domain=domain)
    assert started.returncode == 0, started
    listed = {vm["name"]: vm for vm in backend.admin_ask("vm-list")["vms"]}
    assert listed["web1"]["socket-path"] == str(socket_path) and listed["web1"]["mac"] == "52:54:00:12:34:56"
    assert socket_path.is_socket()
    assert hook(backend, "web1", "started", "begin", "-", domain=domain).returncode == 0  # other moments: nothing
    assert "web1" in {vm["name"] for vm in backend.admin_ask("vm-list")["vms"]}
    stopped = hook(backend, "web1", "release", "end", "-", domain=domain)
    assert stopped.returncode == 0, stopped
    assert "web1" not in {vm["name"] for vm in backend.admin_ask("vm-list")["vms"]}
    again = hook(backend, "web1", "release", "end", "-", domain=domain)
    assert again.returncode == 0, "a VM the backend no longer serves is no error at release"


def test_a_domain_without_vrdma_is_left_alone(backend: BackendProcess) -> None:
    plain = DOMAIN.split("<qemu:commandline>")[0] + "</domain>\n"
    result = hook(backend, "web1", "prepare", "begin", "-", domain=plain)
    assert result.returncode == 0, result
    assert [vm["name"] for vm in backend.admin_ask("vm-list")["vms"]] == ["vm0", "vm1"]


def test_a_refusal_stops_the_start_with_the_reason(backend: BackendProcess) -> None:
    taken = DOMAIN.replace("/run/vrdma/web1.sock", str(backend.sockets["vm1"]))
    result = hook(backend, "web1", "prepare", "begin", "-", domain=taken)
    assert result.returncode == 1
    assert "the vrdma backend refused to serve web1: web1: socket" in result.stderr and "is VM vm1's" in \
        result.stderr, result.stderr
    broken = hook(backend, "web1", "prepare", "begin", "-", domain="<domain")
    assert broken.returncode == 1 and "the domain XML libvirt gave is not XML" in broken.stderr, broken.stderr
