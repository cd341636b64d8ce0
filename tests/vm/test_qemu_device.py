"""The project's QEMU patch: a generic vhost-user device with virtio ID 42 can be created from the command line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from vhost_user_stub import VhostUserStub

from vrdma.harness.vm import Products

pytestmark = pytest.mark.qemu


def _qemu_base(products: Products) -> list[str]:
    return [products.qemu["binary_path"], *(a for d in products.qemu["firmware_dirs"] for a in ("-L", d)),
            "-nodefaults", "-no-user-config", "-display", "none"]


def test_vhost_user_device_pci_is_user_creatable_with_virtio_id(products: Products) -> None:
    out = subprocess.run([*_qemu_base(products), "-device", "vhost-user-device-pci,help"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "virtio-id=<uint16>" in out.stdout
    assert "num_vqs=<uint32>" in out.stdout


class Qmp:
    """QMP over QEMU's stdio: enough for a few synchronous queries."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        assert proc.stdout is not None
        self.lines: list[str] = []
        greeting = self._line()
        assert "QMP" in greeting, greeting
        self.execute("qmp_capabilities")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("QEMU exited:\n" + "".join(self.lines))
        self.lines.append(line)
        return line

    def execute(self, command: str, **arguments: object) -> object:
        assert self.proc.stdin is not None
        message = {"execute": command, **({"arguments": arguments} if arguments else {})}
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self._line()
            if line.startswith("{"):
                reply = json.loads(line)
                if "return" in reply:
                    return reply["return"]
                if "error" in reply:
                    raise AssertionError(f"{command}: {reply['error']}")


def test_virtio_id_42_device_is_created_and_queryable(products: Products, tmp_path: Path) -> None:
    socket_path = tmp_path / "vhost-user.sock"
    with VhostUserStub(socket_path) as stub:
        proc = subprocess.Popen(
            [*_qemu_base(products), "-S", "-machine", "q35,accel=tcg,memory-backend=mem", "-m", "256M",
             "-object", "memory-backend-memfd,id=mem,size=256M,share=on",
             "-chardev", f"socket,id=vu,path={socket_path}",
             "-device", "vhost-user-device-pci,id=vrdma0,virtio-id=42,chardev=vu,num_vqs=2",
             "-qmp", "stdio"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            qmp = Qmp(proc)
            devices = qmp.execute("query-pci")
            assert isinstance(devices, list)
            ids = {(d["id"]["vendor"], d["id"]["device"]): d for d in devices[0]["devices"]}
            assert (0x1AF4, 0x106A) in ids, ids.keys()  # modern virtio-pci: 0x1040 + 42
            assert ids[(0x1AF4, 0x106A)]["qdev_id"] == "vrdma0"
            # Without a name for ID 42 (and a case in virtio-qmp.c) these queries abort QEMU.
            assert qmp.execute("x-query-virtio") == [
                {"name": "virtio-rdma", "path": "/machine/peripheral/vrdma0/virtio-backend"}]
            status = qmp.execute("x-query-virtio-status", path="/machine/peripheral/vrdma0/virtio-backend")
            assert isinstance(status, dict)
            assert status["device-id"] == 42 and status["num-vqs"] == 2
            qmp.execute("quit")
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert stub.requests[:2] == [1, 15]  # GET_FEATURES then GET_PROTOCOL_FEATURES: QEMU spoke vhost-user
