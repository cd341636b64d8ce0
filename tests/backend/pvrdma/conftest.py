"""The lessons of QEMU's removed pvrdma device (hw/rdma/vmw), one failure class at a time, against the real backend.

ARCHITECTURE.md §5 lists the classes of pvrdma's CVEs; each test attacks the backend the way a hostile guest
would (through the simulated frontend and driver, over a real socket, with memfd guest memory) and names the CVE it
mirrors. The CVE descriptions were checked against the oss-security announcements and the upstream fixes posted to
qemu-devel (see each docstring):

| class (ARCHITECTURE.md §5)          | pvrdma CVEs mirrored                          | file                      |
| ----------------------------------- | --------------------------------------------- | ------------------------- |
| unchecked SGE counts                | CVE-2018-20124                                | test_sges.py             |
| ring page counts and sizes          | CVE-2018-20125, CVE-2021-3607, CVE-2023-1544  | test_rings.py             |
| integer overflow in addr/length     | CVE-2021-3582                                 | test_overflow.py          |
| loops that trust ring indices       | CVE-2018-20216, CVE-2023-1544                 | test_ring_indices.py      |
| commands before their buffers exist | CVE-2022-1050, CVE-2018-20191                 | test_command_order.py     |
| leaks, half-made objects on errors  | CVE-2018-20123, CVE-2018-20126, CVE-2021-3608 | test_error_paths.py       |

Every buffer the device could write holds a sentinel first, so "never written" cannot pass as success.

This conftest.py holds their fixtures (a connected pair of VMs; vm0 on a backend a module shares);
pvrdma_helpers.py what they share; each test_*.py here is one class.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backend_process import BackendProcess, backend_for_module, two_vms
from pvrdma_helpers import (
    GID,
    Side,
    Vm,
    make_side,
)

from vrdma.testing.simulated_guest import SimVerbs


@pytest.fixture
def pair(backend: BackendProcess) -> Iterator[tuple[Side, Side]]:
    """(vm0, vm1) with their QPs connected to each other in RTS; each MR holds its sentinel pattern."""
    with two_vms(backend, make_side, GID) as sides:
        yield sides


@pytest.fixture(scope="module")
def shared_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    yield from backend_for_module(tmp_path_factory.mktemp("backend"))


@pytest.fixture
def vm0(shared_backend: BackendProcess) -> Iterator[Vm]:
    """A fresh vm0 connection: the device forgets everything of the last one when it closes, and the next test
    connects only once it has (the backend refuses a second connection while one is open)."""
    closed = shared_backend.connection("vm0")["closed"]
    with shared_backend.frontend("vm0") as fe:
        fe.start()
        yield Vm(shared_backend, fe, SimVerbs(fe, shared_backend.directory / "vm0.doorbell"))
    shared_backend.wait_for_closed("vm0", closed + 1)
