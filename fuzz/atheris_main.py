"""What the atheris fuzzers share: running one under libFuzzer's command line, and counting open descriptors.

A fuzzer module defines ``test_one_input(data)`` and calls ``main(test_one_input)``; every libFuzzer option works
(``-runs=``, ``-max_total_time=``, corpus directories, ``-artifact_prefix=``, a crash file to replay). Findings
are exceptions: atheris prints the traceback and saves the input.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import atheris


class FdLeak(AssertionError):
    """An input left file descriptors open (the leak check of the Python fuzzers)."""


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def check_no_new_fds(before: set[int], what: str) -> None:
    """Raise FdLeak naming the descriptors opened since ``before`` and still open."""
    after = open_fds()
    leaked = sorted(after - before)
    # listdir's own directory descriptor is closed again by the time it returns: what is left is real.
    if leaked:
        details = ", ".join(f"{fd} -> {_target(fd)}" for fd in leaked)
        raise FdLeak(f"{what}: {len(leaked)} file descriptor(s) left open: {details}")


def _target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


class Stats:
    """An interface's counts for fuzz.run: fuzzer executions and the inputs they held (commands, messages).

    libFuzzer reports executions only, and a fuzzer that runs under it never returns to Python to report anything
    else: so the counts are written after every execution into the file named by VRDMA_FUZZ_STATS (one line of
    two fixed-width numbers, rewritten in place) for the runner to read when the fuzzer has exited.
    """

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.inputs = 0
        self.execs = 0
        path = os.environ.get("VRDMA_FUZZ_STATS")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644) if path else -1

    def done(self) -> None:
        """One execution finished."""
        self.execs += 1
        if self._fd >= 0:
            os.pwrite(self._fd, f"{self.execs:020d} {self.inputs:020d} {self.unit}\n".encode(), 0)


def read_stats(path: str) -> tuple[int, int, str] | None:
    """(executions, inputs, unit) as a fuzzer last wrote them, or None."""
    try:
        with open(path) as stats:
            execs, inputs, unit = stats.read().split()
    except (OSError, ValueError):
        return None
    return int(execs), int(inputs), unit


def main(test_one_input: Callable[[bytes], None], argv: list[str] | None = None,
         custom_mutator: Callable[[bytes, int, int], bytes] | None = None) -> None:
    if custom_mutator is None:
        atheris.Setup(list(sys.argv if argv is None else argv), test_one_input)
    else:
        atheris.Setup(list(sys.argv if argv is None else argv), test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


def main_or_seeds(test_one_input: Callable[[bytes], None], seeds: Callable[[], dict[str, bytes]],
                  custom_mutator: Callable[[bytes, int, int], bytes] | None = None) -> None:
    """A fuzzer module's entry point: ``--write-seeds DIR`` writes its seed inputs (``seeds()``: name -> bytes) into
    DIR as seed-<name>; anything else runs it under libFuzzer's command line."""
    if sys.argv[1:2] == ["--write-seeds"]:
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        written = seeds()
        for name, data in written.items():
            (out / f"seed-{name}").write_bytes(data)
        print(f"wrote {len(written)} seeds to {out}")
    else:
        main(test_one_input, custom_mutator=custom_mutator)
    sys.exit(0)
