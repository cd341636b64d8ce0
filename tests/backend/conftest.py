"""The bystander every backend test tier can ask for: vm1, served by the same backend as the VM under test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backend_process import BackendProcess, Bystander, connected_vm


@pytest.fixture
def bystander(backend: BackendProcess) -> Iterator[Bystander]:
    """vm1 as a Bystander (backend_process): checked after the test (its device answers, keeps exactly its objects,
    counters and connection, its memory holds its pattern, a SEND to itself arrives)."""
    for vm in connected_vm(backend, "vm1"):
        side = Bystander.beside(backend, vm.fe, "vm1")
        yield side
        side.check()
