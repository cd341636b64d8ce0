"""The backend's Prometheus endpoint (--metrics): what it reports per VM is what `vrdma admin counters` says, read
with prometheus_client's own parser; a VM added or removed appears or goes."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from backend_process import BackendProcess, Bystander, connected_vm
from prometheus_client.parser import text_string_to_metric_families

from vrdma.daemon.metrics import CONNECTION_COUNTERS
from vrdma.engine.api import COUNTERS, ROCE_COUNTERS

pytestmark = pytest.mark.backend


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_match_the_admin_counters(tmp_path: Path) -> None:
    port = free_port()
    backend = BackendProcess(tmp_path, options=["--metrics", f"127.0.0.1:{port}"])
    try:
        for vm in connected_vm(backend, "vm1"):
            side = Bystander.beside(backend, vm.fe, "vm1")
            side.check()  # a SEND and a receive: the engine's counters move
            side.check()
            admin = backend.admin_ask("counters")["vms"]
            metrics = scrape(port)
            assert metrics[("vrdma_vms", ())] == 2 and metrics[("vrdma_vm_slots", ())] == 64
            assert metrics[("vrdma_vm_connected", (("vm", "vm1"),))] == 1
            assert metrics[("vrdma_vm_connected", (("vm", "vm0"),))] == 0
            for name, counters in admin.items():
                label = (("vm", name),)
                for counter in COUNTERS:
                    assert metrics[(f"vrdma_engine_{counter}_total", label)] == counters["engine"][counter], counter
                for counter in ROCE_COUNTERS:
                    assert metrics[(f"vrdma_roce_{counter}_total", label)] == counters["roce"][counter], counter
                for counter in CONNECTION_COUNTERS:
                    assert metrics[(f"vrdma_connection_{counter}_total", label)] == \
                        counters["connection"][counter], counter
                assert metrics[("vrdma_commands_total", label)] == counters["commands"]
                assert metrics[("vrdma_command_errors_total", label)] == counters["command_errors"]
                for kind, count in counters["objects"].items():
                    assert metrics[("vrdma_objects", (("kind", kind), ("vm", name)))] == count, kind
                for opcode, count in counters["by_opcode"].items():
                    assert metrics[("vrdma_commands_by_opcode_total", (("opcode", opcode), ("vm", name)))] == count
                qos = counters["qos"]
                assert metrics[("vrdma_qos_turns_total", label)] == qos["turns"]
                assert metrics[("vrdma_qos_deferred_bytes_total", label)] == qos["deferred_bytes"]
                assert metrics[("vrdma_qos_pieced_messages_total", label)] == qos["pieced_messages"]
                assert metrics[("vrdma_qos_throttled_seconds_total", label)] == qos["throttled_ns"] / 1e9
                assert metrics[("vrdma_qos_weight", label)] == qos["weight"] == 100
                assert metrics[("vrdma_qos_limit_bytes_per_s", label)] == qos["bytes-per-s"] == 0
            assert admin["vm1"]["engine"]["send_wqes"] >= 2 and admin["vm1"]["engine"]["bytes"] > 0
            assert admin["vm1"]["qos"]["turns"] > 0  # its SENDs were run in its turns
            assert metrics[("vrdma_engine_seconds_total", ())] > 0
            assert metrics[("vrdma_engine_thread_rx_packets_total", (("thread", "0"),))] == 0  # (no RoCE here)
            assert metrics[("process_open_fds", ())] > 0
        backend.add_vm("vm2")
        backend.remove_vm("vm0")
        metrics = scrape(port)
        assert {labels for name, labels in metrics if name == "vrdma_vm_connected"} == \
            {(("vm", "vm1"),), (("vm", "vm2"),)}
    finally:
        assert backend.stop() == 0, backend.log_text()


def test_a_metrics_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AssertionError, match=f"--metrics 127.0.0.1:{port}: .*Address already in use"):
            BackendProcess(tmp_path, options=["--metrics", f"127.0.0.1:{port}"])


def test_the_metrics_port_follows_a_backend_upgrade(tmp_path: Path) -> None:
    """`vrdma admin upgrade` of a backend with --metrics: the old process stops its endpoint before the VMs' pause
    and the new one starts it after, on the same port; its counters carry on from the old ones."""
    port = free_port()
    backend = BackendProcess(tmp_path, options=["--metrics", f"127.0.0.1:{port}"])
    try:
        for vm in connected_vm(backend, "vm1"):
            side = Bystander.beside(backend, vm.fe, "vm1")
            side.check()
            before = scrape(port)[("vrdma_engine_send_wqes_total", (("vm", "vm1"),))]
            assert before >= 1
            status = backend.upgrade()
            assert status["upgrade"]["state"] == "took over", status
            after = scrape(port)
            assert after[("vrdma_engine_send_wqes_total", (("vm", "vm1"),))] >= before
            assert after[("vrdma_vm_connected", (("vm", "vm1"),))] == 1
            side.check()  # the VM is served by the new process
            assert scrape(port)[("vrdma_engine_send_wqes_total", (("vm", "vm1"),))] > before
        assert "without metrics" not in backend.log_text()
    finally:
        assert backend.stop() == 0, backend.log_text()
