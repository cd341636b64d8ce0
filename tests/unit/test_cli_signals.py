"""The CLI's SIGTERM (vrdma.cli.unwind_on_sigterm): the process that installed it unwinds, running its clean-up;
a fork of it that has not exec'd dies as SIGTERM's default would, without running its parent's clean-up on the
copy of its parent's stack (pyroute2's namespace helpers are such forks: docs/harness.md). The fork has the
kernel's default from its first instruction: a handler in Python would leave a window (after the interpreter's
last check for signals, before a blocking call) in which a SIGTERM waits for the call to return."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

FORK_AND_TERMINATE = """
import os, signal, sys, time
from pathlib import Path
from vrdma import cli
cli.unwind_on_sigterm()
parent = os.getpid()
read_end, write_end = os.pipe()
try:
    child = os.fork()
    if child == 0:
        os.write(write_end, b"x")
        time.sleep(30)  # a helper that has answered and is not yet at its os._exit()
        os._exit(0)
    os.read(read_end, 1)
    status_lines = Path(f"/proc/{child}/status").read_text().splitlines()
    caught = int(next(line.split()[1] for line in status_lines if line.startswith("SigCgt:")), 16)
    print("caught" if caught & 1 << (signal.SIGTERM - 1) else "default")
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status))
finally:
    if os.getpid() != parent:
        Path(sys.argv[1]).write_text("the child ran its parent's clean-up")
"""

TERMINATE_SELF = """
import os, signal, sys
from pathlib import Path
from vrdma import cli
cli.unwind_on_sigterm()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
finally:
    Path(sys.argv[1]).write_text("cleaned up")
"""


def run(script: str, marker: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, str(marker)], capture_output=True, text=True, timeout=120,
                          check=False)


def test_a_fork_dies_of_sigterm_without_its_parents_clean_up(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = run(FORK_AND_TERMINATE, marker)
    assert result.returncode == 0, result.stderr
    # SIGTERM's disposition in the fork as the kernel holds it, then how the fork ended (0: it slept 30 s through).
    assert result.stdout.split() == ["default", str(-signal.SIGTERM)], result.stdout
    assert not marker.exists(), marker.read_text()


def test_the_process_itself_unwinds_through_its_clean_up(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = run(TERMINATE_SELF, marker)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert marker.read_text() == "cleaned up"
