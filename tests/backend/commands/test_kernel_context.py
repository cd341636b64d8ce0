"""The guest kernel's own objects (context 0): its queues ring doorbell page 1, its work requests may name guest RAM
with the local DMA lkey, and nothing of a user context mixes with them.

What vrdma.ko does for kernel consumers (the MAD layer, rdma_cm's kernel users, NVMe-oF, NFS/RDMA), played with
vrdma.testing.simulated_guest in kernel mode; the bystander vm1 is checked after each test.
"""

from __future__ import annotations

import pytest
from backend_process import BackendProcess, pattern, wait_cqes
from command_helpers import GID, Bystander, Vm, refused

from vrdma.device import abi
from vrdma.device.status import Status
from vrdma.testing.simulated_guest import SimVerbs

pytestmark = pytest.mark.backend

LOCAL_DMA_LKEY = abi.const("VRDMA_LOCAL_DMA_LKEY")
SEND = abi.const("VRDMA_WR_SEND")
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "LOC_PROT_ERR")}
SIZE = 3 * 4096 + 100  # spans pages: the local DMA lkey is not limited to one


def kernel_verbs(backend: BackendProcess, vm: Vm) -> SimVerbs:
    return SimVerbs(vm.fe, backend.directory / f"{vm.name}.doorbell", kernel=True)


def test_kernel_queues_move_guest_ram_named_by_the_local_dma_lkey(backend: BackendProcess, vm0: Vm,
                                                                  bystander: Bystander) -> None:
    kernel = kernel_verbs(backend, vm0)
    _, cq, qp = kernel.loopback_qp(GID["vm0"])
    src, dst = kernel.alloc(SIZE), kernel.alloc(SIZE)
    kernel.memory.write(src.gpa, pattern(SIZE))
    kernel.memory.write(dst.gpa, b"\xa5" * SIZE)
    kernel.post_recv(qp, [(dst.gpa, SIZE, LOCAL_DMA_LKEY)], wr_id=2)
    kernel.post_send(qp, SEND, [(src.gpa, SIZE, LOCAL_DMA_LKEY)], wr_id=1)
    cqes = wait_cqes(kernel, cq, 2)
    assert sorted((int(c.wr_id), int(c.status)) for c in cqes) == [(1, WC["SUCCESS"]), (2, WC["SUCCESS"])]
    assert kernel.memory.read(dst.gpa, SIZE) == pattern(SIZE)
    # The kernel's queues took their doorbell slots from page 1, not from the user context's page.
    assert backend.counters("vm0")["doorbell_pages"] == [vm0.verbs.doorbell_page]
    assert qp.sq.db and kernel.doorbell_page == abi.const("VRDMA_KERNEL_DOORBELL_PAGE")


def test_a_user_queue_cannot_use_the_local_dma_lkey(backend: BackendProcess, vm0: Vm, bystander: Bystander) -> None:
    user = vm0.verbs
    _, cq, qp = user.loopback_qp(GID["vm0"])
    buf = user.alloc(4096)
    user.post_send(qp, SEND, [(buf.gpa, 64, LOCAL_DMA_LKEY)], wr_id=7)
    (cqe,) = wait_cqes(user, cq, 1)
    assert (int(cqe.wr_id), int(cqe.status)) == (7, WC["LOC_PROT_ERR"])
    assert backend.counters("vm0")["engine"]["bytes"] == 0


@pytest.mark.parametrize("case", ["beyond guest RAM", "across the end of guest RAM", "wrapping 64 bits"])
def test_the_local_dma_lkey_reaches_only_guest_ram(backend: BackendProcess, vm0: Vm, bystander: Bystander,
                                                   case: str) -> None:
    kernel = kernel_verbs(backend, vm0)
    ram = kernel.memory.size
    addr, length = {"beyond guest RAM": (1 << 40, 64), "across the end of guest RAM": (ram - 64, 128),
                    "wrapping 64 bits": ((1 << 64) - 64, 128)}[case]
    _, cq, qp = kernel.loopback_qp(GID["vm0"])
    kernel.post_send(qp, SEND, [(addr, length, LOCAL_DMA_LKEY)], wr_id=9)
    (cqe,) = wait_cqes(kernel, cq, 1)
    assert (int(cqe.wr_id), int(cqe.status)) == (9, WC["LOC_PROT_ERR"])


@pytest.mark.parametrize("case", ["user QP on the kernel's PD", "kernel QP on a user CQ",
                                  "user QP on the kernel's SRQ", "user SRQ on the kernel's PD"])
def test_kernel_and_user_objects_do_not_mix(backend: BackendProcess, vm0: Vm, bystander: Bystander,
                                            case: str) -> None:
    kernel, user = kernel_verbs(backend, vm0), vm0.verbs
    kpd, upd = kernel.alloc_pd(), user.alloc_pd()
    kcq, ucq = kernel.create_cq(16), user.create_cq(16)
    create = {
        "user QP on the kernel's PD": lambda: user.create_qp(kpd, ucq, ucq),
        "kernel QP on a user CQ": lambda: kernel.create_qp(kpd, ucq, kcq),
        "user QP on the kernel's SRQ": lambda: user.create_qp(upd, ucq, ucq, srq=kernel.create_srq(kpd, 16)),
        "user SRQ on the kernel's PD": lambda: user.create_srq(kpd, 16),
    }[case]
    because = {"user QP on the kernel's PD": r"CREATE_QP: PD .* belongs to another context",
               "kernel QP on a user CQ": r"CREATE_QP: CQ .* belongs to another context",
               "user QP on the kernel's SRQ": r"CREATE_QP: SRQ .* belongs to another context",
               "user SRQ on the kernel's PD": r"CREATE_SRQ: PD .* belongs to another context"}[case]
    assert refused(create, vm0, because) == Status.INVALID
