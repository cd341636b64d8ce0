"""The backend process driven through the simulated frontend: the vrdma device over real vhost-user."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from backend_process import BackendProcess, query_device

from vrdma.device import abi
from vrdma.testing.frontend import FrontendError

pytestmark = pytest.mark.backend


def test_print_capabilities_is_json() -> None:
    out = subprocess.run([sys.executable, "-m", "vrdma.cli", "backend", "--print-capabilities"],
                         capture_output=True, text=True, check=True).stdout
    caps = json.loads(out)
    assert caps["type"] == "rdma" and caps["virtio-id"] == 42 and caps["num-queues"] == 3


def test_config_space(backend: BackendProcess) -> None:
    with backend.frontend("vm0") as fe:
        fe.start()
        config = abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config")))
    assert config.abi_version == abi.const("VRDMA_ABI_VERSION")
    assert bytes(config.mac) == bytes.fromhex("525400767200")
    # Every page but the header and the kernel's goes to a user context.
    assert config.doorbell_page_size == 4096 and config.max_ucontext == config.doorbell_pages - 2
    doorbell = (backend.directory / "vm0.doorbell").read_bytes()
    header = abi.from_bytes("vrdma_doorbell_header", doorbell[:abi.sizeof("vrdma_doorbell_header")])
    assert header.magic == abi.const("VRDMA_DOORBELL_MAGIC") and header.pairing_id == config.pairing_id
    assert len(doorbell) == config.doorbell_pages * 4096


def test_query_device_round_trip(backend: BackendProcess) -> None:
    with backend.frontend("vm0") as fe:
        fe.start()
        response = query_device(fe, seq=42)
    assert response.hdr.status == abi.const("VRDMA_STATUS_OK") and response.hdr.seq == 42
    assert response.vendor_id == 0x1AF4 and response.max_qp > 0
    assert backend.connection("vm0")["features"] is not None


def test_unknown_command_is_not_supported(backend: BackendProcess) -> None:
    with backend.frontend("vm0") as fe:
        fe.start()
        raw = fe.command(abi.to_bytes(abi.new("vrdma_cmd_hdr", opcode=0x7777, seq=5)), 64)
    response = abi.from_bytes("vrdma_resp_hdr", raw[:8])
    assert (response.opcode, response.status, response.seq) == (0x7777, abi.const("VRDMA_STATUS_NOT_SUPPORTED"), 5)


def test_one_vm_breaking_the_protocol_leaves_the_other_served(backend: BackendProcess) -> None:
    with backend.frontend("vm1") as good, backend.frontend("vm0") as bad:
        good.start()
        bad.send_raw(0)  # VHOST_USER_NONE: libvhost-user alone would exit(0) the whole process
        with pytest.raises(FrontendError, match="closed the connection"):
            bad.reply(0)
        assert query_device(good).hdr.status == 0
    closed = backend.wait_for_closed("vm0", 1)
    assert closed["protocol_errors"] == 1 and "NONE is not supported" in closed["last_close_reason"]
    with backend.frontend("vm0") as again:  # the VM's socket accepts a new connection
        again.start()
        assert query_device(again).hdr.status == 0


def pairing_id(backend: BackendProcess, name: str) -> int:
    with backend.frontend(name) as fe:
        fe.start()
        return int(abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config"))).pairing_id)


def test_restarted_backend_keeps_the_doorbell_region_and_pairing(tmp_path: Path) -> None:
    first = BackendProcess(tmp_path)
    before = pairing_id(first, "vm0"), pairing_id(first, "vm1")
    inode = (tmp_path / "vm0.doorbell").stat().st_ino
    first.proc.kill()  # as a crash would
    first.proc.wait()
    second = BackendProcess(tmp_path)
    try:
        assert (pairing_id(second, "vm0"), pairing_id(second, "vm1")) == before
        assert before[0] != before[1]
        assert (tmp_path / "vm0.doorbell").stat().st_ino == inode  # QEMU's mapping stays valid
        assert second.counters("vm0")["doorbell_region"] == {"path": str(tmp_path / "vm0.doorbell"), "reused": True}
    finally:
        assert second.stop() == 0


def test_admin_socket_counters_and_test_hooks(tmp_path: Path) -> None:
    from vrdma.daemon.admin import ask

    backend = BackendProcess(tmp_path, names=("vm0",), test_hooks=True)
    admin = backend.admin
    try:
        with backend.frontend("vm0") as fe:
            fe.start()
            query_device(fe)
            counters = backend.counters()
            assert counters["commands"] == 1 and counters["by_opcode"] == {"QUERY_DEVICE": 1}
            assert ask(admin, {"command": "inject", "vm": "vm0", "fault": "wrong-opcode"}) == {"ok": True}
            spoiled = query_device(fe, seq=9)
            assert spoiled.hdr.opcode == abi.const("VRDMA_CMD_QUERY_DEVICE") + 1  # type: ignore[attr-defined]
            assert query_device(fe, seq=10).hdr.opcode == abi.const("VRDMA_CMD_QUERY_DEVICE")  # one-shot
            ask(admin, {"command": "inject", "vm": "vm0", "fault": "short-response"})
            short = fe.command(abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": 1})), 120)
            assert len(short) == 8
        assert ask(admin, {"command": "inject", "vm": "vm9", "fault": "wrong-seq"})["ok"] is False
        assert "unknown fault" in ask(admin, {"command": "inject", "vm": "vm0", "fault": "x"})["error"]
        assert ask(admin, {"command": "nope"})["ok"] is False
        out = subprocess.run([sys.executable, "-m", "vrdma.cli", "admin", "--socket", str(admin), "counters"],
                             capture_output=True, text=True, check=True).stdout
        printed = json.loads(out)
        assert printed["vms"]["vm0"]["commands"] == 4
        assert {"network", "engine_threads"} <= set(printed) and printed["engine_threads"][0]["passes"] > 0, printed
    finally:
        assert backend.stop() == 0


def test_backend_flags_and_paths_fail_in_one_line(tmp_path: Path) -> None:
    def backend(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vrdma.cli", "backend", *args], capture_output=True,
                              text=True, timeout=60, check=False)

    bad_flag = backend("--no-such-flag")
    assert bad_flag.returncode == 2 and "unrecognized arguments: --no-such-flag" in bad_flag.stderr
    for args, message in [
        (["--socket-path", str(tmp_path / "missing" / "vm0.sock")], "directory"),
        (["--socket-path", str(tmp_path / ("x" * 120) / "vm0.sock")], "longer than a unix socket path may be"),
        (["--socket-path", str(tmp_path)], "it exists and is not a socket"),
        (["--socket-path", f"vm0={tmp_path}/a.sock", "--mac", "vm0=nope"], "'nope' is not a MAC address"),
        (["--socket-path", f"vm0={tmp_path}/a.sock", "--mac", "vm9=52:54:00:00:00:01"], "unknown VM"),
        (["--socket-path", f"vm0={tmp_path}/a.sock", "--socket-path", f"vm0={tmp_path}/b.sock"],
         "declared twice"),
        (["--fd", "999"], "not a socket"),
        ([], "nothing to serve"),
    ]:
        result = backend(*args)
        assert result.returncode == 1, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
