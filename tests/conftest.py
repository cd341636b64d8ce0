"""Shared fixtures: build products, booted guests, and the no-orphan-QEMU check every test session ends with."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from backend_process import SANITIZE, BackendProcess

from vrdma.harness.cluster import Cluster
from vrdma.harness.vm import Products

log = logging.getLogger(__name__)


def _qemu_descendants() -> list[psutil.Process]:
    me = psutil.Process(os.getpid())
    found = []
    for child in me.children(recursive=True):
        try:
            if "qemu-system" in child.name() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(scope="session", autouse=True)
def no_orphan_qemu() -> Iterator[None]:
    """Every QEMU a test started must be gone when the tests end, whether they passed or failed."""
    yield
    left = _qemu_descendants()
    for proc in left:
        proc.kill()
    assert not left, f"QEMU processes left running after the tests: {[p.pid for p in left]}"


@pytest.fixture(autouse=True)
def no_sanitizer_reports() -> Iterator[None]:
    """The sanitizer tier (VRDMA_SANITIZE=1): a report in any backend's log fails the test that was running, even
    when the backend outlives it (module-scoped backends) or the test never stops it."""
    yield
    if SANITIZE:
        for process in list(BackendProcess.started):
            process.check_sanitizer()


@pytest.fixture(scope="session")
def products() -> Products:
    """The build products (`make test` builds them first; a missing one fails with the make target to run)."""
    return Products.load()


@pytest.fixture(scope="module")
def two_guests(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """vm0 and vm1 on one private link, booted once for a test module."""
    with Cluster(2, tmp_path_factory.mktemp("guests"), products=products) as cluster:
        yield cluster


@pytest.fixture()
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private run directory for `vrdma vm` sessions."""
    directory = tmp_path / "run"
    monkeypatch.setenv("VRDMA_RUN_DIR", str(directory))
    return directory


@pytest.fixture()
def backend(tmp_path: Path) -> Iterator[BackendProcess]:
    """`vrdma backend` serving vm0 and vm1 (sockets, admin socket and log in the test's directory)."""
    process = BackendProcess(tmp_path)
    yield process
    if process.proc.poll() is None:
        assert process.stop() == 0, process.log_text()
