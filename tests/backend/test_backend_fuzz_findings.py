"""What the fuzzers found in the data engine (fuzz/crashes/engine/), replayed against the real `vrdma backend`.

Each test plays an attacker VM (vm0) beside a victim (vm1): afterwards the process must be alive and the victim
must still complete a command. The same findings are replayed in process by tests/backend/test_fuzz_regressions.py.
"""

from __future__ import annotations

import os

import pytest
from backend_process import BackendProcess, expect_closed, query_device

from vrdma.device import abi
from vrdma.testing.frontend import USER_BASE
from vrdma.testing.simulated_guest import SimVerbs
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend

OK = abi.const("VRDMA_STATUS_OK")
GID = bytes.fromhex("00000000000000000000ffffa9fe6401")


def mem_table(*regions: tuple[int, int, int]) -> bytes:
    """(guest-physical start, size, file offset) regions of one memfd, at QEMU's address USER_BASE + gpa."""
    return protocol.MEMORY_HEADER.pack(len(regions), 0) + b"".join(
        protocol.MEMORY_REGION.pack(gpa, size, USER_BASE + gpa, offset) for gpa, size, offset in regions)


def test_qp_reset_after_its_ring_left_the_memory_table(backend: BackendProcess) -> None:
    """engine_fuzz: vre_qp_modify to RESET wrote the ring header through the translation of a page that a new
    memory table had taken away (a NULL page pointer): one VM's QEMU could kill the process, every VM's device
    with it. fuzz/crashes/engine/qp-reset-after-its-ring-left-the-memory-table."""
    with backend.frontend("vm1") as victim, backend.frontend("vm0") as attacker:
        victim.start()
        attacker.start()
        verbs = SimVerbs(attacker, backend.directory / "vm0.doorbell")
        _, _, qp = verbs.loopback_qp(GID)
        # A table with a hole where the QP's rings are: the virtqueues (below) and the buffers of later commands
        # (above) stay in guest memory.
        hole, end = qp.buf.gpa, qp.buf.gpa + qp.buf.size
        size = attacker.memory.size
        attacker.acked(Request.SET_MEM_TABLE, mem_table((0, hole, 0), (end, size - end, end)),
                       fds=[attacker.memory.fd, attacker.memory.fd])
        reset = abi.const("VRDMA_QP_STATE")
        verbs.modify_qp(qp, reset, qp_state=abi.const("VRDMA_QPS_RESET"))
        verbs.doorbells.close()
        assert backend.proc.poll() is None, backend.log_text()
        assert query_device(victim).hdr.status == OK
        assert query_device(attacker).hdr.status == OK  # the attacker's device carries on too


HUGE = 2 << 20


def hugetlb_memfd(size: int) -> int | None:
    """A memfd of huge pages (the memory a hugetlbfs-backed QEMU shares), or None where the host has none free."""
    try:
        fd = os.memfd_create("vrdma-test-huge", os.MFD_CLOEXEC | os.MFD_HUGETLB)
    except OSError:
        return None
    try:
        os.ftruncate(fd, size)
        with open("/proc/meminfo") as meminfo:
            free = next(int(line.split()[1]) for line in meminfo if line.startswith("HugePages_Free:"))
        if free * HUGE < size:
            raise OSError("not enough free huge pages")
    except (OSError, StopIteration):
        os.close(fd)
        return None
    return fd


def test_guest_memory_that_is_not_page_aligned_is_refused(backend: BackendProcess) -> None:
    """engine_fuzz: a region whose mmap offset is not a multiple of the page size put every guest page at a
    misaligned host address: ring headers, CQEs and atomic targets became misaligned accesses, and an aligned
    8-byte atomic target could run past its page. libvhost-user maps a plain memfd at the offset the frontend
    gives (mmap refuses an unaligned one), but a hugetlbfs file from its huge page boundary, keeping the rest of
    the offset (any number) in the address it computes. The engine refuses such a table now; only that VM's
    connection ends. fuzz/crashes/engine/guest-memory-not-page-aligned replays it in process everywhere; this
    test needs two free huge pages on the host."""
    fd = hugetlb_memfd(2 * HUGE)
    if fd is None:
        pytest.skip("no free huge pages on this host (HugePages_Free < 2)")
    try:
        with backend.frontend("vm1") as victim, backend.frontend("vm0") as attacker:
            victim.start()
            attacker.send_raw(Request.SET_PROTOCOL_FEATURES,
                              protocol.U64.pack(attacker.get_u64(Request.GET_PROTOCOL_FEATURES)))
            attacker.acked(Request.SET_OWNER)
            attacker.send_raw(Request.SET_MEM_TABLE, mem_table((0, HUGE, 7)),
                              flags=protocol.VERSION | protocol.FLAG_NEED_REPLY, fds=[fd])
            expect_closed(attacker, replies_first=True)
            assert backend.proc.poll() is None, backend.log_text()
            assert query_device(victim).hdr.status == OK
    finally:
        os.close(fd)
    connection = backend.wait_for_closed("vm0", 1)
    assert "page-aligned" in connection["last_close_reason"], connection
