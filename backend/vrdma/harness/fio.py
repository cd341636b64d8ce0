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
    argv = ["fio", "--name=vrdma", f"--filename={device}", "--direct=1", "--ioengine=libaio", "--group_reporting",
            "--output-format=json", *args]
    result = vm.run(argv, timeout=timeout)
    try:
        job: dict[str, Any] = json.loads(result.stdout[result.stdout.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        job = {"error": "no JSON results"}
    if result.exit_status != 0 or job.get("error"):
        raise AgentError(f"{' '.join(argv)} in {vm.name} failed (exit {result.exit_status}, error "
                         f"{job.get('error')}):\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    return job
