"""Fixtures of the per-message tests: vm0 (the frontend under test, connected but not started) on a backend the
module shares, and, from tests/backend/conftest.py, vm1 (the bystander whose device must not notice).

Every file here takes one vhost-user message (or one family of them) three ways side by side: what QEMU sends
(good), what a broken or hostile frontend sends (malformed: the backend refuses it and drops only that
connection), and the bystander vm1 untouched afterwards. Attacks on the contents of the virtqueues (descriptor
chains, commands) are in test_virtqueues.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backend_process import BackendProcess, backend_for_module

from vrdma.testing.frontend import Frontend


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """One backend for a module's tests (each test connects its VMs afresh)."""
    yield from backend_for_module(tmp_path_factory.mktemp("backend"))


@pytest.fixture
def fe(backend: BackendProcess) -> Iterator[Frontend]:
    """vm0's frontend, connected, nothing sent yet; on the way out the backend has let go of the connection."""
    closed = backend.connection("vm0")["closed"]
    with backend.frontend("vm0") as frontend:
        yield frontend
    backend.wait_for_closed("vm0", closed + 1)
