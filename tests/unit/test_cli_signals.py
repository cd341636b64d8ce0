"""The CLI's SIGTERM (vrdma.cli.unwind_on_sigterm): the process that installed it unwinds, running its clean-up;
a fork of it that has not exec'd dies as SIGTERM's default would, without running its parent's clean-up on the
copy of its parent's stack (pyroute2's namespace helpers are such forks: docs/harness.md)."""

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
        time.sleep(60)  # a helper that has answered and is not yet at its os._exit()
        os._exit(0)
    os.read(read_end, 1)
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
    return subprocess.run([sys.executable, "-c", script, str(marker)], capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_fork_dies_of_sigterm_without_its_parents_clean_up(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = run(FORK_AND_TERMINATE, marker)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(-signal.SIGTERM)], result.stdout
    assert not marker.exists(), marker.read_text()


def test_the_process_itself_unwinds_through_its_clean_up(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = run(TERMINATE_SELF, marker)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert marker.read_text() == "cleaned up"
