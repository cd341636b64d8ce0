"""The `vrdma backend` process as the backend tests run it, and the command every test ends with."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vrdma.device import abi
from vrdma.testing.frontend import Frontend


class BackendProcess:
    """`vrdma backend` serving vm0 and vm1, started and stopped by a test."""

    def __init__(self, directory: Path, names: tuple[str, ...] = ("vm0", "vm1"), test_hooks: bool = False) -> None:
        self.directory = directory
        self.sockets = {name: directory / f"{name}.sock" for name in names}
        self.log = directory / "backend.log"
        self.admin = directory / "admin.sock"
        read_end, write_end = os.pipe()
        args = [a for name, path in self.sockets.items() for a in ("--socket-path", f"{name}={path}")]
        args += ["--admin-socket", str(self.admin), *(["--test-hooks"] if test_hooks else [])]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vrdma.cli", "-v", "backend", *args, "--mac", "vm0=52:54:00:76:72:00",
                 "--ready-fd", str(write_end)], pass_fds=[write_end], stdout=log, stderr=subprocess.STDOUT)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as ready:
            line = ready.read()  # EOF without READY: the backend failed to start
        if line != b"READY\n":
            self.proc.kill()
            raise AssertionError(f"backend did not start:\n{self.log.read_text()}")

    def frontend(self, name: str) -> Frontend:
        return Frontend(str(self.sockets[name]))

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(10)

    def log_text(self) -> str:
        return self.log.read_text()

    def counters(self, vm: str = "vm0") -> dict[str, Any]:
        from vrdma.backend.admin import ask

        return ask(self.admin, {"command": "counters"})["vms"][vm]  # type: ignore[no-any-return]

    def wait_for_log(self, text: str, timeout: float = 10.0) -> None:
        self.wait_for_log_count(text, 1, timeout)

    def wait_for_log_count(self, text: str, count: int, timeout: float = 10.0) -> None:
        """The backend logs to a file as it goes: poll it until ``text`` appears ``count`` times."""
        deadline = time.monotonic() + timeout
        while self.log_text().count(text) < count:
            assert time.monotonic() < deadline, f"{text!r} not logged {count} times:\n{self.log_text()}"
            time.sleep(0.01)


def query_device(fe: Frontend, seq: int = 1) -> object:
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE"),
                                                                  "seq": seq}))
    response = fe.command(request, abi.sizeof("vrdma_resp_query_device"))
    return abi.from_bytes("vrdma_resp_query_device", response)
