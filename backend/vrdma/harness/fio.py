"""fio, the storage tests' I/O tool, on a block device in a guest (a remote namespace, LUN or disk): one job with
direct I/O through libaio, its results as fio's JSON reports them, and a failure that says why (a verification
error among them)."""

from __future__ import annotations

import json
from typing import Any

from vrdma.harness.errors import AgentError
from vrdma.harness.vm import Vm


def job(vm: Vm, device: str, *args: str, timeout: float = 600.0) -> dict[str, Any]:
    """fio on ``device`` (direct I/O, libaio): its one job's JSON results (read/write: io_bytes, iops, bw_bytes, ...);
    raises with fio's output when it fails or reports an error (a verification error among them)."""
    return wait(vm, *spawn(vm, device, *args), timeout=timeout)


def spawn(vm: Vm, device: str, *args: str) -> tuple[int, list[str]]:
    """The same job started in the background: its pid and command line, for wait() (in the same guest, or in the
    QEMU it was live-migrated to)."""
    argv = ["fio", "--name=vrdma", f"--filename={device}", "--direct=1", "--ioengine=libaio", "--group_reporting",
            "--output-format=json", *args]
    return vm.agent.spawn(argv), argv


def wait(vm: Vm, pid: int, argv: list[str], timeout: float = 600.0) -> dict[str, Any]:
    """A spawned job's results, as job() gives them."""
    result = vm.agent.wait(pid, argv, timeout=timeout)
    try:
        results: dict[str, Any] = json.loads(result.stdout[result.stdout.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        results = {"error": "no JSON results"}
    if result.exit_status != 0 or results.get("error"):
        raise AgentError(f"{' '.join(argv)} in {vm.name} failed (exit {result.exit_status}, error "
                         f"{results.get('error')}):\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    return results
