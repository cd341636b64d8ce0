"""Run inside a guest: talk to vrdma.ko's verbs device through the raw uverbs write() ABI.

This checks the kernel's side on its own, below libibverbs and libvrdma (tests/vm/test_vm_provider.py goes through
them): it speaks to /dev/infiniband/uverbsN directly, sending what a provider's ibv_cmd_* calls send, and can
try what no provider would, such as mapping another context's offset. Modes:

  contexts PATTERN   two processes each open a user context, map their own doorbell page, write PATTERN plus
                     their doorbell page number into it, try to map an offset that is not theirs; prints JSON
  pds N              allocate N PDs in one context, free them all; prints JSON
"""

import ctypes
import json
import mmap
import os
import struct
import sys

CMD_GET_CONTEXT, CMD_ALLOC_PD, CMD_DEALLOC_PD = 0, 3, 4
PAGE = 4096


def uverbs_path(name="vrdma0"):
    base = "/sys/class/infiniband_verbs"
    for entry in os.listdir(base):
        ibdev = f"{base}/{entry}/ibdev"
        if os.path.exists(ibdev):
            with open(ibdev) as f:
                if f.read().strip() == name:
                    return f"/dev/infiniband/{entry}"
    sys.exit(f"no uverbs device for {name}")


def command(fd, cmd, body, resp_size):
    """Legacy write() command: header, core command (its first field points at the response buffer)."""
    resp = ctypes.create_string_buffer(resp_size)
    payload = struct.pack("<Q", ctypes.addressof(resp)) + body if resp_size else body
    header = struct.pack("<IHH", cmd, (8 + len(payload)) // 4, resp_size // 4)
    os.write(fd, header + payload)
    return resp.raw


def get_context(fd):
    raw = command(fd, CMD_GET_CONTEXT, b"", 8 + 24)  # core resp, then struct vrdma_alloc_ucontext_resp
    _async_fd, _vectors, page, page_size, offset, _pages, _ = struct.unpack("<IIIIQII", raw)
    return page, page_size, offset


def one_context(pattern):
    fd = os.open(uverbs_path(), os.O_RDWR)
    page, page_size, offset = get_context(fd)
    region = mmap.mmap(fd, page_size, offset=offset)
    region[:len(pattern) + 4] = pattern + struct.pack("<I", page)
    try:
        mmap.mmap(fd, page_size, offset=offset + page_size)  # nothing of this context lives there
        foreign = "mapped"
    except OSError as err:
        foreign = err.strerror
    return {"pid": os.getpid(), "doorbell_page": page, "offset": offset, "foreign_mmap": foreign}


def contexts(pattern):
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        os.write(write_end, json.dumps(one_context(pattern + b"-child")).encode())
        os._exit(0)
    os.close(write_end)
    mine = one_context(pattern + b"-parent")
    theirs = json.loads(os.read(read_end, 4096))
    os.waitpid(child, 0)
    print(json.dumps([mine, theirs]))


def pds(count):
    fd = os.open(uverbs_path(), os.O_RDWR)
    get_context(fd)
    handles = []
    for _ in range(count):
        raw = command(fd, CMD_ALLOC_PD, b"", 4 + 8)  # core resp (pd_handle), then struct vrdma_alloc_pd_resp
        handle, pdn, _ = struct.unpack("<III", raw)
        handles.append((handle, pdn))
    for handle, _ in handles:
        command(fd, CMD_DEALLOC_PD, struct.pack("<I", handle), 0)
    os.close(fd)
    print(json.dumps({"allocated": len(handles), "distinct_pdn": len({pdn for _, pdn in handles})}))


if sys.argv[1] == "contexts":
    contexts(sys.argv[2].encode())
elif sys.argv[1] == "pds":
    pds(int(sys.argv[2]))
