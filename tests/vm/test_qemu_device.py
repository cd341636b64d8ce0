"""The project's QEMU patch: a generic vhost-user device with virtio ID 42 can be created from the command line."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def qemu_with_qmp(argv: list[str]) -> Iterator[Qmp]:
    """QEMU with QMP on its stdio; it is told to quit (and must exit 0) when the block ends, killed if it fails."""
    proc = subprocess.Popen([*argv, "-qmp", "stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        qmp = Qmp(proc)
        yield qmp
        qmp.execute("quit")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_virtio_id_42_device_is_created_and_queryable(products: Products, tmp_path: Path) -> None:
    socket_path = tmp_path / "vhost-user.sock"
    argv = [*_qemu_base(products), "-S", "-machine", "q35,accel=tcg,memory-backend=mem", "-m", "256M",
            "-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-chardev", f"socket,id=vu,path={socket_path}",
            "-device", "vhost-user-device-pci,id=vrdma0,virtio-id=42,chardev=vu,num_vqs=2"]
    with VhostUserStub(socket_path) as stub, qemu_with_qmp(argv) as qmp:
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
    assert stub.requests[:2] == [1, 15]  # GET_FEATURES then GET_PROTOCOL_FEATURES: QEMU spoke vhost-user


def test_vhost_user_rdma_pci_is_one_named_device(products: Products) -> None:
    out = subprocess.run([*_qemu_base(products), "-device", "vhost-user-rdma-pci,help"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "chardev=<str>" in out.stdout and "doorbell-size=<size>" in out.stdout, out.stdout
    assert "virtio-id" not in out.stdout and "num_vqs" not in out.stdout, "the device's own identity is fixed"


def test_vhost_user_rdma_pci_maps_the_backends_doorbell_region_as_bar2(products: Products, tmp_path: Path) -> None:
    """One -device line against the real backend: virtio ID 42 with four MSI-X vectors (three queues and the
    configuration), BAR 2 of 4 MiB (64-bit, prefetchable), and the backend's doorbell region mapped into it over
    vhost-user (VHOST_USER_BACKEND_SHMEM_MAP) as soon as QEMU connects."""
    from backend_process import BackendProcess

    backend = BackendProcess(tmp_path, names=("vm0",))
    try:
        with qemu_with_qmp([*_qemu_base(products), "-machine", "q35,accel=tcg,memory-backend=mem", "-m", "256M",
                            "-object", "memory-backend-memfd,id=mem,size=256M,share=on",
                            "-chardev", f"socket,id=vrdma,path={backend.sockets['vm0']}",
                            "-device", "vhost-user-rdma-pci,id=vrdma0,chardev=vrdma"]) as qmp:
            devices = qmp.execute("query-pci")
            assert isinstance(devices, list)
            device = next(d for d in devices[0]["devices"] if d.get("qdev_id") == "vrdma0")
            assert (device["id"]["vendor"], device["id"]["device"]) == (0x1AF4, 0x106A)
            bar2 = next(r for r in device["regions"] if r["bar"] == 2)
            assert bar2["size"] == 4 << 20 and bar2["prefetch"] and bar2["mem_type_64"], bar2
            status = qmp.execute("x-query-virtio-status", path="/machine/peripheral/vrdma0/virtio-backend")
            assert isinstance(status, dict) and status["device-id"] == 42 and status["num-vqs"] == 3
            connection = backend.wait_for_counters(
                "vm0", lambda c: c["connection"]["shared_memory_maps"] == 1, "the doorbell region mapped")["connection"]
            assert connection["state"] == "connected"
            # The firmware places the BARs; then the mapping shows in the guest's memory map.
            deadline = time.monotonic() + 60
            while "virtio-shmem-0-map" not in (mtree := str(qmp.execute("human-monitor-command",
                                                                       **{"command-line": "info mtree"}))):
                assert time.monotonic() < deadline, mtree[-3000:]
                time.sleep(0.2)  # polling QEMU's memory map while the firmware runs
    finally:
        assert backend.stop() == 0, backend.log_text()


def test_a_doorbell_size_that_is_not_a_power_of_two_is_refused(products: Products, tmp_path: Path) -> None:
    out = subprocess.run([*_qemu_base(products), "-machine", "q35,accel=tcg", "-chardev", "null,id=c",
                          "-device", "vhost-user-rdma-pci,chardev=c,doorbell-size=3M"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0
    assert "doorbell-size must be a power of two of at least two pages, not 3145728" in out.stderr, out.stderr
