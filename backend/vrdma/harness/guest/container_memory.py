"""Run in a container (tests/vm/test_vm_containers.py): the memory an unmodified program registers becomes the
device's without the program's help (libvrdma remaps it onto a memfd shared with the backend: docs/containers.md).

  container_memory.py DEVICE

With pyverbs as any program would use it: a heap buffer (malloc's, through ctypes), an anonymous mmap, and a page
of the main thread's stack ([stack], its top page: the environment's strings) are registered; an RC QP connected to
itself WRITEs the heap buffer and the stack page into the mmap, which must then hold them; a shared file mapping
must be refused. After deregistration every buffer is the program's own private memory again, with its contents,
and writable. Prints JSON.
"""

import ctypes
import json
import mmap
import os
import sys
import tempfile

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

SIZE = 64 << 10
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


def mapping_of(address):
    """The /proc/self/maps line holding ``address``."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span = line.split()[0].split("-")
            if int(span[0], 16) <= address < int(span[1], 16):
                return line.strip()
    return ""


def stack_page():
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith("[stack]"):
                return int(line.split()[0].split("-")[1], 16) - mmap.PAGESIZE
    raise SystemExit("no [stack] mapping")


def loopback_qp(ctx, pd, cq):
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=4, max_recv_wr=4)))
    gid = ctx.query_gid(1, 0)
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
    attr.qp_access_flags = ACCESS
    attr.port_num = 1
    qp.to_init(attr)
    attr.dest_qp_num = qp.qp_num
    attr.path_mtu = e.IBV_MTU_1024
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 1
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1, port_num=1)
    qp.to_rtr(attr)
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 1
    qp.to_rts(attr)
    return qp


def write(qp, cq, src, src_mr, dst, dst_mr, length):
    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(src, length, src_mr.lkey)])
    wr.set_wr_rdma(dst_mr.rkey, dst)
    qp.post_send(wr)
    for _ in range(10_000_000):
        polled, wcs = cq.poll()
        if polled:
            if wcs[0].status != e.IBV_WC_SUCCESS:
                raise SystemExit(f"WRITE completed with status {wcs[0].status}")
            return
    raise SystemExit("no completion")


def main(device):
    ctx = Context(name=device)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    qp = loopback_qp(ctx, pd, cq)
    report = {}

    heap = ctypes.create_string_buffer(os.urandom(SIZE), SIZE)
    heap_addr = ctypes.addressof(heap)
    anon = mmap.mmap(-1, 4 * SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    anon_addr = ctypes.addressof(ctypes.c_char.from_buffer(anon))
    stack = stack_page()
    stack_before = ctypes.string_at(stack, mmap.PAGESIZE)
    report["before"] = {"heap": mapping_of(heap_addr), "anon": mapping_of(anon_addr), "stack": mapping_of(stack)}

    heap_mr = MR(pd, SIZE, ACCESS, address=heap_addr)
    anon_mr = MR(pd, 4 * SIZE, ACCESS, address=anon_addr)
    stack_mr = MR(pd, mmap.PAGESIZE, ACCESS, address=stack)
    report["registered"] = {"heap": mapping_of(heap_addr), "anon": mapping_of(anon_addr), "stack": mapping_of(stack)}
    write(qp, cq, heap_addr, heap_mr, anon_addr, anon_mr, SIZE)
    write(qp, cq, stack, stack_mr, anon_addr + SIZE, anon_mr, mmap.PAGESIZE)
    report["heap_written"] = anon[:SIZE] == heap.raw
    report["stack_written"] = anon[SIZE:SIZE + mmap.PAGESIZE] == stack_before

    with tempfile.TemporaryFile() as backing:
        backing.truncate(SIZE)
        shared = mmap.mmap(backing.fileno(), SIZE, flags=mmap.MAP_SHARED)
        try:
            MR(pd, SIZE, ACCESS, address=ctypes.addressof(ctypes.c_char.from_buffer(shared))).close()
            report["file_mapping"] = "registered"
        except PyverbsRDMAError as err:
            report["file_mapping"] = f"refused: {err}"

    heap_mr.close()
    anon_mr.close()
    stack_mr.close()
    report["after"] = {"heap": mapping_of(heap_addr), "anon": mapping_of(anon_addr), "stack": mapping_of(stack)}
    anon[0:5] = b"still"
    report["contents_kept"] = (anon[5:SIZE] == heap.raw[5:] and ctypes.string_at(stack, mmap.PAGESIZE) == stack_before
                               and anon[:5] == b"still")
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
