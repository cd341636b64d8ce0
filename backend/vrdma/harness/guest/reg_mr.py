"""Run inside a guest (by `vrdma bench`): time ibv_reg_mr of one buffer on a device. Prints JSON.

  reg_mr.py DEVICE BYTES REPEAT

The buffer is allocated and touched first, so the timing is the registration (pinning and describing the
pages to the device), not the page faults of a fresh allocation. Each registration is deregistered before the
next; the best and the median of REPEAT are printed, in milliseconds.
"""

import ctypes
import json
import mmap
import statistics
import sys
import time

import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD


def main(device, size, repeat):
    ctx = Context(name=device)
    pd = PD(ctx)
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, size, mmap.PAGESIZE):
        buf[offset] = 1
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        mr = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE, address=address)
        times.append((time.perf_counter() - start) * 1000)
        mr.close()
    print(json.dumps({"device": device, "bytes": size, "best_ms": min(times), "median_ms": statistics.median(times)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
