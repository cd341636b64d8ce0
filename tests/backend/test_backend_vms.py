"""VMs added and removed while the backend runs (the admin socket's vm-add, vm-list, vm-remove), and VMs declared in
its configuration file: a VM comes and goes without disturbing any other, and every refusal says why."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from backend_process import (
    GID,
    BackendProcess,
    Bystander,
    connect_sides,
    connected_vm,
    expect_closed,
    query_device,
    settled_fds,
    start_side,
    wait_cqes,
)

from vrdma.device import abi

pytestmark = pytest.mark.backend


def names(backend: BackendProcess) -> list[str]:
    reply = backend.admin_ask("vm-list")
    assert reply["ok"], reply
    return [vm["name"] for vm in reply["vms"]]


def test_a_vm_added_and_another_removed_leave_the_running_vm_untouched(backend: BackendProcess,
                                                                        bystander: Bystander) -> None:
    """vm1 (the bystander) runs a connected QP with a pattern in its MR; vm2 is added, used and vm0 removed while
    vm1's frontend stays connected: vm1 keeps its objects, counters, connection and memory, and its QP still works."""
    described = backend.add_vm("vm2", mac="52:54:00:76:72:02")
    assert described["state"] == "waiting" and described["mac"] == "52:54:00:76:72:02"
    assert Path(described["socket-path"]).is_socket()
    bystander.check()
    for vm in connected_vm(backend, "vm2"):
        added = Bystander.beside(backend, vm.fe, "vm2")  # the added VM does RDMA traffic of its own
        added.check()
        assert names(backend) == ["vm0", "vm1", "vm2"]
        bystander.check()
    backend.remove_vm("vm0")
    assert names(backend) == ["vm1", "vm2"]
    assert not (backend.directory / "vm0.sock").exists(), "a removed VM's socket stays behind"
    bystander.check()
    assert backend.counters("vm1")["connection"]["state"] == "connected"


def test_removing_a_connected_vm_closes_only_its_connection_and_frees_everything(
        backend: BackendProcess, bystander: Bystander) -> None:
    """A VM removed while its QEMU is connected: the frontend sees the backend close, its device's objects are
    gone with it (no fd, no doorbell mapping left), and adding it again gives a fresh device."""
    fds_before = settled_fds(backend.proc.pid)
    backend.add_vm("vm2")
    with backend.frontend("vm2") as fe:
        fe.start()
        Bystander.beside(backend, fe, "vm2")
        assert backend.counters("vm2")["objects"]["qp"] == 1
        backend.remove_vm("vm2")
        expect_closed(fe)
    assert "vm2" not in backend.admin_ask("counters")["vms"]
    assert settled_fds(backend.proc.pid, fds_before) == fds_before, "removing a VM left fds open"
    maps = {m.path for m in psutil.Process(backend.proc.pid).memory_maps()}
    assert str(backend.directory / "vm2.doorbell") not in maps, "the removed VM's doorbell region is still mapped"
    backend.add_vm("vm2")  # the same name again: a new device, nothing of the old one
    with backend.frontend("vm2") as fe:
        fe.start()
        assert query_device(fe).hdr.status == 0
        assert set(backend.counters("vm2")["objects"].values()) == {0}
    bystander.check()


REFUSALS = {
    "name taken": ({"name": "vm1", "socket-path": "/tmp/x.sock"}, "already served"),
    "socket taken": ({"name": "vmx", "socket-path": "{dir}/vm1.sock"}, "is VM vm1's"),
    "doorbell taken": ({"name": "vmx", "socket-path": "{dir}/vmx.sock", "doorbell": "{dir}/vm1.doorbell"},
                       "doorbell region {dir}/vm1.doorbell is VM vm1's"),
    "relative path": ({"name": "vmx", "socket-path": "vmx.sock"}, "must be an absolute path"),
    "bad name": ({"name": "../etc", "socket-path": "{dir}/vmx.sock"}, "VM name '../etc' must be"),
    "bad mac": ({"name": "vmx", "socket-path": "{dir}/vmx.sock", "mac": "52:54:00"}, "is not a MAC address"),
    "multicast mac": ({"name": "vmx", "socket-path": "{dir}/vmx.sock", "mac": "01:00:5e:00:00:01"}, "multicast"),
    "missing socket": ({"name": "vmx"}, "missing field(s) socket-path"),
    "unknown field": ({"name": "vmx", "socket-path": "{dir}/vmx.sock", "queues": 9}, "unknown field(s) queues"),
    "no directory": ({"name": "vmx", "socket-path": "/nonexistent/vmx.sock"}, "directory /nonexistent does not"),
    "long path": ({"name": "vmx", "socket-path": "/" + "d" * 120 + ".sock"}, "longer than a unix socket path"),
    "wrong type": ({"name": 7, "socket-path": "{dir}/vmx.sock"}, "VM name 7 must be"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refused_vm_add_says_why_and_changes_nothing(backend: BackendProcess, bystander: Bystander,
                                                       case: str) -> None:
    fields, reason = REFUSALS[case]
    directory = str(backend.directory)
    request = {key: value.format(dir=directory) if isinstance(value, str) else value for key, value in fields.items()}
    reply = backend.admin_ask("vm-add", **request)
    assert not reply["ok"] and reason.format(dir=directory) in reply["error"], reply
    assert names(backend) == ["vm0", "vm1"]
    assert not (backend.directory / "vmx.sock").exists()
    bystander.check()


def test_vm_remove_of_an_unknown_vm_names_those_served(backend: BackendProcess) -> None:
    reply = backend.admin_ask("vm-remove", name="vm9")
    assert not reply["ok"] and "no VM named 'vm9' is served (served: vm0, vm1)" in reply["error"], reply
    reply = backend.admin_ask("vm-remove")
    assert not reply["ok"] and "missing field(s) name" in reply["error"], reply


def test_no_more_vms_than_max_vms(tmp_path: Path) -> None:
    """The engine's slots are made once: the (max-vms + 1)th VM is refused, and a slot freed by a removal is
    taken by the next VM added."""
    backend = BackendProcess(tmp_path, names=("vm0",), options=["--max-vms", "2"])
    try:
        backend.add_vm("vm1")
        reply = backend.admin_ask("vm-add", name="vm2", **{"socket-path": str(tmp_path / "vm2.sock")})
        assert not reply["ok"] and "all 2 VM slots are in use (--max-vms)" in reply["error"], reply
        backend.remove_vm("vm0")
        backend.add_vm("vm2")
        for vm in connected_vm(backend, "vm2"):
            Bystander.beside(backend, vm.fe, "vm2").check()
        assert names(backend) == ["vm1", "vm2"]
    finally:
        assert backend.stop() == 0, backend.log_text()


def test_a_backend_with_no_vms_serves_those_added_later(tmp_path: Path) -> None:
    """A service starts with none: the admin socket alone is enough to start, and the VMs come later."""
    backend = BackendProcess(tmp_path, names=())
    try:
        assert names(backend) == []
        backend.add_vm("vm3")
        for vm in connected_vm(backend, "vm3"):
            Bystander.beside(backend, vm.fe, "vm3").check()
    finally:
        assert backend.stop() == 0, backend.log_text()


def test_the_configuration_file_declares_settings_and_vms(tmp_path: Path) -> None:
    """VMs in the file are served from the start, beside those the command line adds; paths relative to the
    file's directory; max-vms bounds those added later."""
    (tmp_path / "backend.toml").write_text(
        'max-vms = 3\n'
        'doorbell-dir = "doorbells"\n'
        '[vm.vm1]\n'
        'socket-path = "vm1.sock"\n'
        'mac = "52:54:00:76:72:01"\n')
    (tmp_path / "doorbells").mkdir()
    backend = BackendProcess(tmp_path, names=("vm0",), options=["--config", str(tmp_path / "backend.toml")])
    try:
        listed = {vm["name"]: vm for vm in backend.admin_ask("vm-list")["vms"]}
        assert listed["vm1"]["mac"] == "52:54:00:76:72:01"
        assert listed["vm1"]["socket-path"] == str(tmp_path / "vm1.sock")
        assert listed["vm1"]["doorbell"] == str(tmp_path / "doorbells" / "vm1.doorbell")
        backend.add_vm("vm2")
        assert "all 3 VM slots" in backend.admin_ask("vm-add", name="vm3", **{
            "socket-path": str(tmp_path / "vm3.sock")})["error"]
    finally:
        assert backend.stop() == 0, backend.log_text()


# (the checks of each key are unit tests: tests/unit/test_backend_config.py)
BAD_FILES = {
    "unknown key": ('max-vm = 3\n', "unknown key(s) 'max-vm'"),
    "duplicate with flag": ('[vm.vm0]\nsocket-path = "other.sock"\n',
                            "declared twice (in --config and the flags, or twice in the flags): vm0"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_configuration_file_stops_the_start_with_its_reason(tmp_path: Path, case: str) -> None:
    text, reason = BAD_FILES[case]
    config = tmp_path / "backend.toml"
    config.write_text(text)
    result = subprocess.run([sys.executable, "-m", "vrdma.cli", "backend", "--config", str(config),
                             "--admin-socket", str(tmp_path / "admin.sock"),
                             "--socket-path", f"vm0={tmp_path / 'vm0.sock'}"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result
    assert reason in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert not any(tmp_path.glob("*.sock")), list(tmp_path.iterdir())


def test_the_admin_command_line_adds_lists_and_removes(backend: BackendProcess, tmp_path: Path) -> None:
    """`vrdma admin vm add|list|remove` as a person types them (relative paths are the caller's)."""
    def admin(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vrdma.cli", "admin", "--admin-socket", str(backend.admin),
                               *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              check=False)

    added = admin("vm", "add", "vm5", "--socket-path", "vm5.sock", "--mac", "52:54:00:76:72:05")
    assert added.returncode == 0, added
    assert f"vm5: listening on {tmp_path / 'vm5.sock'}" in added.stdout
    with socket.socket(socket.AF_UNIX) as probe:
        probe.connect(str(tmp_path / "vm5.sock"))
    listed = admin("vm", "list")
    assert listed.returncode == 0 and "vm5" in listed.stdout and "52:54:00:76:72:05" in listed.stdout, listed
    as_json = json.loads(admin("vm", "--json", "list").stdout)
    assert [vm["name"] for vm in as_json] == ["vm0", "vm1", "vm5"]
    again = admin("vm", "add", "vm5", "--socket-path", "vm6.sock")
    assert again.returncode == 1 and "the backend refused: a VM named vm5 is already served" in again.stderr, again
    removed = admin("vm", "remove", "vm5")
    assert removed.returncode == 0 and "vm5: removed" in removed.stdout, removed
    assert names(backend) == ["vm0", "vm1"]


def test_a_vms_qos_is_set_when_added_and_changed_at_run_time(backend: BackendProcess, tmp_path: Path) -> None:
    """`vrdma admin vm add ... --weight`, then `vrdma admin vm qos` shows and changes it while the VM is served; a
    bad setting is refused with its reason and changes nothing; the counters carry it."""
    def admin(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vrdma.cli", "admin", "--admin-socket", str(backend.admin),
                               *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)

    added = admin("vm", "add", "vm5", "--socket-path", "vm5.sock", "--weight", "50", "--bytes-per-s", "1G")
    assert added.returncode == 0, added
    shown = admin("vm", "qos", "vm5")
    assert shown.returncode == 0 and "vm5: weight 50, latency normal, bytes-per-s 1000000000; throttled 0.000 s" \
        in shown.stdout, shown
    changed = admin("vm", "qos", "vm5", "--weight", "300", "--bytes-per-s", "0", "--wrs-per-s", "2Mi", "--latency",
                    "low")
    assert changed.returncode == 0 and "vm5: weight 300, latency low, wrs-per-s 2097152;" in changed.stdout, changed
    for argv, reason in ((("--weight", "0"), "weight must be 1 to 1000"),
                         (("--bytes-burst", "lots"), "bytes-burst must be a whole number or a quantity")):
        refused = admin("vm", "qos", "vm5", *argv)
        assert refused.returncode == 1 and reason in refused.stderr, refused
    assert backend.admin_ask("vm-qos", name="vm5", share=3)["error"].startswith("vm-qos: unknown field(s) share")
    assert "no VM named 'vm9'" in backend.admin_ask("vm-qos", name="vm9")["error"]
    qos = backend.admin_ask("counters")["vms"]["vm5"]["qos"]
    assert (qos["weight"], qos["bytes-per-s"], qos["wrs-per-s"], qos["latency"], qos["throttled_ns"]) == \
        (300, 0, 2097152, "low", 0)
    assert backend.admin_ask("vm-qos", name="vm5", latency="fast")["error"].endswith(
        "latency must be 'normal' or 'low', not 'fast'")
    assert {vm["name"]: vm["qos"]["weight"] for vm in backend.admin_ask("vm-list")["vms"]} == \
        {"vm0": 100, "vm1": 100, "vm5": 300}


def test_the_added_vm_reaches_the_others_by_gid(backend: BackendProcess) -> None:
    """An added VM joins the fabric's GID index: an RC QP of vm0 connects to one of the added VM and a SEND
    arrives (the route is the engine's, like for VMs served from the start)."""
    backend.add_vm("vm2")
    with backend.frontend("vm0") as fe0, backend.frontend("vm2") as fe2:
        a = start_side(fe0, backend, "vm0", GID["vm0"], 4096)
        b = start_side(fe2, backend, "vm2", GID["vm2"], 4096)
        connect_sides(a, GID["vm0"], b, GID["vm2"])
        a.verbs.memory.write(a.mr.addr, b"hello, added vm")
        b.verbs.post_recv(b.qp, [(b.mr.addr, 64, b.mr.lkey)], wr_id=1)
        a.verbs.post_send(a.qp, abi.const("VRDMA_WR_SEND"), [(a.mr.addr, 15, a.mr.lkey)])
        assert [c.status for c in wait_cqes(b.verbs, b.cq, 1)] == [abi.const("VRDMA_WC_SUCCESS")]
        assert b.verbs.memory.read(b.mr.addr, 15) == b"hello, added vm"
