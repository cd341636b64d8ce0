"""Waiting in tests for something another process does (the backend's engine, a guest): poll a check until it
holds, failing with what was awaited once the time is up."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(what: str, check: Callable[[], object], timeout: float, interval: float = 0.2) -> float:
    """Poll ``check()`` every ``interval`` seconds until it is true; return the seconds it took."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout:g} s"
        time.sleep(interval)
    return time.monotonic() - start
