"""A full Debian guest as a user has one (buildchain.debian_guest: trixie with systemd, apt, Debian's kernel and its
headers), with the project's packages (`make packages`) installed by apt: DKMS builds vrdma.ko against the guest's
own headers, and after a reboot (udev loads the module for the device) the first programs a user runs pass between
two such guests (tests/guest_smoke.py). In one of them the backend's package runs as a systemd service: started by
systemd on install (Type=notify, its own user, sandboxed), with a VM added and removed through its admin socket and
a simulated frontend (the package's vrdma.testing.frontend) served.

The slow tier: booting systemd and compiling vrdma.ko under TCG take minutes, so `make test` leaves this module to
`make test-debian-guest`, which CI runs after it (docs/packaging.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import guest_smoke
import pytest
from polling import wait_until

from vrdma.buildchain.cache import product
from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Products, Vm

pytestmark = [pytest.mark.vm, pytest.mark.debian_guest]

PACKAGES = ("vrdma-dkms", "libvrdma", "vrdma-backend")
INSTALL_TIMEOUT = 1500.0  # apt, then DKMS compiling vrdma.ko under TCG
TEST_VM = "t0"  # the VM the service inside the guest is given
FRONTEND = """
import sys
from vrdma.device import abi
from vrdma.testing.frontend import Frontend
with Frontend(sys.argv[1]) as fe:
    fe.start()
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device",
                                   hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE"), "seq": 1}))
    response = abi.from_bytes("vrdma_resp_query_device", fe.command(request, abi.sizeof("vrdma_resp_query_device")))
    print("max_qp", response.max_qp)
"""


@pytest.fixture(scope="module")
def debs() -> dict[str, Path]:
    """The trixie packages `make packages` made, by package name."""
    built = product("packages/trixie")
    found = {name.split("_")[0]: Path(built["packages_dir"]) / name for name in built["debs"]}
    assert set(PACKAGES) <= set(found), found
    return {name: found[name] for name in PACKAGES}


def _install(vm: Vm, debs: dict[str, Path]) -> int:
    """Copy the packages into the guest and start `apt-get install` of them; return its guest PID."""
    vm.run(["mkdir", "-p", "/root/vrdma"]).check("mkdir")
    for deb in debs.values():
        vm.agent.run(["sh", "-c", f"cat > /root/vrdma/{deb.name}"], stdin=deb.read_bytes()).check(f"copy {deb.name}")
    script = ("DEBIAN_FRONTEND=noninteractive apt-get install -y "
              + " ".join(f"/root/vrdma/{deb.name}" for deb in debs.values()))
    return vm.agent.spawn(["sh", "-c", script])


@pytest.fixture(scope="module")
def debian_guests(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two full Debian guests with the packages installed (both at once: each compiles vrdma.ko on its vCPU),
    then rebooted."""
    with Cluster(2, tmp_path_factory.mktemp("debian-guests"), products=Products.debian_guest(),
                 boot_timeout=600.0) as cluster:
        installs = {vm.name: _install(vm, debs) for vm in cluster}
        for vm in cluster:
            result = vm.agent.wait(installs[vm.name], ["apt-get", "install"], INSTALL_TIMEOUT)
            result.check(f"apt-get install in {vm.name}")
            (vm.directory / "apt-install.log").write_text(result.stdout + result.stderr)
        for vm in cluster:
            vm.reboot()
        yield cluster


def test_dkms_built_the_module_against_the_guests_own_headers(debian_guests: Cluster) -> None:
    for vm in debian_guests:
        release = vm.run(["uname", "-r"]).check("uname").stdout.strip()
        status = vm.run(["dkms", "status", "vrdma"]).check("dkms status").stdout
        assert re.search(rf"vrdma/0\.1\.0, {re.escape(release)}, x86_64: installed", status), status
        where = vm.run(["modinfo", "-F", "filename", "vrdma"]).check("modinfo").stdout.strip()
        assert where.startswith(f"/lib/modules/{release}/updates/dkms/vrdma.ko"), where
        # udev loaded it at boot for the device (its alias virtio:d0000002Av*), before anyone asked.
        assert re.search(r"^vrdma ", vm.run(["lsmod"]).check("lsmod").stdout, flags=re.M)
        devices = vm.run(["ibv_devices"]).check("ibv_devices").stdout
        assert guest_smoke.DEVICE in devices, devices


def test_the_port_is_active(debian_guests: Cluster) -> None:
    release = debian_guests[0].run(["uname", "-r"]).check("uname").stdout.strip()
    guest_smoke.check_port_active(debian_guests, release)


def test_rc_pingpong_checks_its_data(debian_guests: Cluster) -> None:
    guest_smoke.check_rc_pingpong(debian_guests)


def test_rping_verifies_every_ping(debian_guests: Cluster) -> None:
    guest_smoke.check_rping(debian_guests)


def test_nvmeof_writes_and_reads_back(debian_guests: Cluster) -> None:
    guest_smoke.check_nvmeof(debian_guests)


NODE_EXPORTER = "http://127.0.0.1:9100/metrics"  # Debian's prometheus-node-exporter, as installed and started
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=60).read().decode())"
# node_exporter's infiniband collector: its metric for each PMA data counter, and the driver's counter behind it.
EXPORTED = {"port_data_transmitted_bytes_total": "tx_bytes", "port_data_received_bytes_total": "rx_bytes",
            "port_packets_transmitted_total": "tx_packets", "port_packets_received_total": "rx_packets"}


def _exported(vm: Vm) -> dict[str, int]:
    """node_exporter's infiniband metrics for vrdma0's port 1, by name (without the node_infiniband_ prefix)."""
    page = vm.run(["python3", "-c", FETCH, NODE_EXPORTER]).check("node_exporter's metrics").stdout
    assert "node_scrape_collector_success{collector=\"infiniband\"} 1" in page, \
        [line for line in page.splitlines() if "infiniband" in line and "scrape" in line]
    found = re.findall(r'^node_infiniband_(\w+)\{device="vrdma0",port="1"\} (\S+)$', page, flags=re.M)
    return {name: int(float(value)) for name, value in found}


def _rdma_statistic(vm: Vm) -> dict[str, int]:
    shown = vm.run(["rdma", "-j", "statistic", "show", "link", f"{guest_smoke.DEVICE}/1"]).check("rdma statistic")
    return {name: value for name, value in json.loads(shown.stdout)[0].items() if isinstance(value, int)}


def _quiet_scrape(vm: Vm) -> tuple[dict[str, int], dict[str, int]]:
    """rdma statistic and node_exporter's scrape, taken while nothing moved: rdma statistic alike before and after."""
    samples: list[tuple[dict[str, int], dict[str, int], dict[str, int]]] = []
    wait_until(f"{vm.name}'s counters to hold still for one scrape",
               lambda: samples.append((_rdma_statistic(vm), _exported(vm), _rdma_statistic(vm)))
               or samples[-1][0] == samples[-1][2], 60, interval=1)
    return samples[-1][0], samples[-1][1]


def test_node_exporter_reads_vrdma0s_data_as_rdma_statistic_shows_it(debian_guests: Cluster) -> None:
    guest_smoke.check_rc_pingpong(debian_guests)  # traffic of this test's own, in both guests
    for vm in debian_guests:
        wait_until(f"prometheus-node-exporter active in {vm.name}",
                   lambda vm=vm: vm.run(["systemctl", "is-active", "prometheus-node-exporter"]).stdout.strip()
                   == "active", 120)
        statistic, exported = _quiet_scrape(vm)
        assert statistic["tx_bytes"] > 0 and statistic["rx_bytes"] > 0, statistic
        for metric, counter in EXPORTED.items():
            # The PMA counts data in four-byte words (node_exporter multiplies by 4 back).
            expected = statistic[counter] // 4 * 4 if metric.startswith("port_data") else statistic[counter]
            assert exported[metric] == expected, (vm.name, metric, exported, statistic)
        assert exported["port_errors_received_total"] == exported["link_downed_total"] == 0, exported


def _admin(vm: Vm, *args: str) -> str:
    return vm.run(["vrdma", "admin", *args]).check("vrdma admin " + " ".join(args)).stdout


def test_the_backend_service_runs_under_systemd_and_serves_a_vm_added_at_run_time(debian_guests: Cluster) -> None:
    vm = debian_guests[0]
    # Started by its package's postinst, then at boot: active once it has sent READY=1 (Type=notify).
    wait_until("systemd to report the backend active",
               lambda: vm.run(["systemctl", "is-active", "vrdma-backend"]).stdout.strip() in ("active", "failed"),
               120)
    assert vm.run(["systemctl", "is-active", "vrdma-backend"]).stdout.strip() == "active"
    shown = vm.run(["systemctl", "show", "vrdma-backend", "-p", "Type,User,NRestarts,WatchdogUSec,StatusText"])
    properties = dict(line.split("=", 1) for line in shown.check("systemctl show").stdout.splitlines() if "=" in line)
    assert properties["Type"] == "notify" and properties["User"] == "vrdma", properties
    assert properties["NRestarts"] == "0" and properties["WatchdogUSec"] == "30s", properties
    assert "serving 0" in properties["StatusText"], properties  # sd_notify STATUS
    pid = vm.run(["systemctl", "show", "vrdma-backend", "-p", "MainPID", "--value"]).check("MainPID").stdout.strip()
    process = vm.run(["sh", "-c", f"stat -c %U /proc/{pid}; tr '\\0' ' ' < /proc/{pid}/cmdline"]).check("/proc")
    owner, command = process.stdout.splitlines()
    assert owner == "vrdma" and "vrdma-backend --config /etc/vrdma/backend.toml" in command, process.stdout

    _admin(vm, "vm", "add", TEST_VM, "--socket-path", f"/run/vrdma/{TEST_VM}.sock", "--mac", "52:54:00:00:00:01")
    listed = json.loads(_admin(vm, "vm", "--json", "list"))
    assert [entry["name"] for entry in listed] == [TEST_VM], listed
    served = vm.run(["python3", "-c", FRONTEND, f"/run/vrdma/{TEST_VM}.sock"]).check("the simulated frontend")
    assert re.search(r"^max_qp [1-9]\d*$", served.stdout, flags=re.M), served.stdout
    counters = json.loads(_admin(vm, "counters"))["vms"]
    assert counters[TEST_VM]["commands"] >= 1 and counters[TEST_VM]["command_errors"] == 0, counters
    # `systemctl reload` (ExecReload: vrdma admin upgrade): a new backend process takes the VM over and becomes the
    # service's main process; the old one is gone, nothing restarted, and the VM is served by the new one.
    vm.run(["systemctl", "reload", "vrdma-backend"]).check("systemctl reload vrdma-backend")
    new_pid = vm.run(["systemctl", "show", "vrdma-backend", "-p", "MainPID", "--value"]).check("MainPID").stdout.strip()
    assert new_pid != pid and vm.run(["systemctl", "is-active", "vrdma-backend"]).stdout.strip() == "active"
    assert vm.run(["test", "-e", f"/proc/{pid}"]).exit_status != 0, "the old backend did not exit"
    status = json.loads(_admin(vm, "status"))
    assert str(status["pid"]) == new_pid and status["upgrade"]["from_pid"] == int(pid), status
    assert [entry["name"] for entry in json.loads(_admin(vm, "vm", "--json", "list"))] == [TEST_VM]
    served = vm.run(["python3", "-c", FRONTEND, f"/run/vrdma/{TEST_VM}.sock"]).check("the frontend after the reload")
    assert re.search(r"^max_qp [1-9]\d*$", served.stdout, flags=re.M), served.stdout
    _admin(vm, "vm", "remove", TEST_VM)
    assert json.loads(_admin(vm, "vm", "--json", "list")) == []
    # Still the same process: nothing restarted it; its journal has what it said.
    assert vm.run(["systemctl", "show", "vrdma-backend", "-p", "NRestarts"]).stdout.strip() == "NRestarts=0"
    journal = vm.run(["journalctl", "-u", "vrdma-backend", "--no-pager"]).check("journalctl").stdout
    assert f"vm {TEST_VM}" in journal or TEST_VM in journal, journal[-3000:]
