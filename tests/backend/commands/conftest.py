"""Fixtures of the per-command tests: vm0 (the VM under test) and, from tests/backend/conftest.py, vm1 (a bystander
whose device must not notice).

Every command file here tests its commands three ways side by side: what a driver does (good), what a broken or
hostile driver sends (malformed: each case gets its own status), and that vm1, served by the same backend with
objects of its own and a sentinel pattern in its MR, is untouched afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backend_process import BackendProcess, Vm, backend_for_module, connected_vm


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """One backend for a module's tests (each test connects its VMs afresh)."""
    yield from backend_for_module(tmp_path_factory.mktemp("backend"))


@pytest.fixture
def vm0(backend: BackendProcess) -> Iterator[Vm]:
    """vm0 connected and started, with one user context."""
    yield from connected_vm(backend, "vm0")
