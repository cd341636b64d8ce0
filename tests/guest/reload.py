"""Run inside a guest: `rmmod vrdma; modprobe vrdma` while a process holds verbs objects, CYCLES times.

  reload CYCLES TIMEOUT

Each cycle: open vrdma0 and create a PD, a CQ, an RC QP in INIT with a posted receive, and an MR; unload the module
with all of them open (the driver disassociates the context: rmmod must not wait for the process); check the
process is told (IBV_EVENT_DEVICE_FATAL), that posting now fails instead of vanishing, and that every object still
closes; load the module again and wait until vrdma0's port is ACTIVE with a RoCE v2 IPv4 GID. TIMEOUT bounds each
wait in a cycle. Prints one JSON object: cycles done, the seconds of each phase (median and max), and the guest's
Slab and MemAvailable before and after (kB).
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR

DEVICE = "vrdma0"
PORT = f"/sys/class/infiniband/{DEVICE}/ports/1"
DEVICE_FATAL = e.IBV_EVENT_DEVICE_FATAL


class Timeout(Exception):
    pass


def on_alarm(*_):
    raise Timeout


def run(*argv):
    result = subprocess.run(argv, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}): {result.stdout}{result.stderr}")


def meminfo():
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: int(fields[key].split()[0]) for key in ("Slab", "MemAvailable")}


def ready():
    """vrdma0's port is ACTIVE and has the RoCE v2 GID of eth0's IPv4 address (what a program needs to connect)."""
    try:
        with open(f"{PORT}/state") as f:
            if "ACTIVE" not in f.read():
                return False
        indexes = os.listdir(f"{PORT}/gid_attrs/types")
    except OSError:
        return False  # no device (yet)
    for index in indexes:
        try:
            with open(f"{PORT}/gid_attrs/types/{index}") as f:
                kind = f.read()
            with open(f"{PORT}/gids/{index}") as f:
                gid = f.read()
        except OSError:
            continue  # an empty entry of the GID table (its type reads as EINVAL), or the device went away
        if "v2" in kind and gid.startswith("0000:0000:0000:0000:0000:ffff:"):
            return True
    return False


def wait_ready(timeout):
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            sys.exit(f"{DEVICE} not ready within {timeout} s of modprobe")
        time.sleep(0.02)


def hold_objects():
    ctx = Context(name=DEVICE)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    mr = MR(pd, 65536, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=4, max_recv_wr=4)))
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index, attr.port_num, attr.qp_access_flags = 0, 1, e.IBV_ACCESS_REMOTE_WRITE
    qp.to_init(attr)
    qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    return ctx, [qp, mr, cq, pd]


def cycle(timeout, phases):
    start = time.monotonic()
    ctx, objects = hold_objects()
    qp, mr, cq = objects[0], objects[1], objects[2]
    opened = time.monotonic()
    run("rmmod", "vrdma")  # with every object open
    unloaded = time.monotonic()
    signal.alarm(timeout)
    event = ctx.get_async_event()
    signal.alarm(0)
    kind = event.event_type
    event.ack()
    if kind != DEVICE_FATAL:
        sys.exit(f"first async event after rmmod is {kind}, not IBV_EVENT_DEVICE_FATAL")
    try:
        qp.post_recv(RecvWR(wr_id=2, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
        sys.exit("a receive was posted to a QP whose device is gone")
    except PyverbsRDMAError:
        pass
    flushed = cq.poll(4)  # the provider flushes what was outstanding; poll must return, whatever it holds
    for obj in objects:
        obj.close()
    ctx.close()
    closed = time.monotonic()
    run("modprobe", "vrdma")
    wait_ready(timeout)
    back = time.monotonic()
    for name, seconds in (("open", opened - start), ("rmmod", unloaded - opened), ("close", closed - unloaded),
                          ("modprobe", back - closed), ("cycle", back - start)):
        phases.setdefault(name, []).append(seconds)
    return flushed[0]


def main(cycles, timeout):
    signal.signal(signal.SIGALRM, on_alarm)
    wait_ready(timeout)
    before, phases, flushed = meminfo(), {}, 0
    done = 0
    try:
        while done < cycles:
            flushed += cycle(timeout, phases)
            done += 1
    except Timeout:
        sys.exit(f"cycle {done + 1}: no async event within {timeout} s of rmmod")
    print(json.dumps({
        "cycles": done, "flushed": flushed, "before": before, "after": meminfo(),
        "seconds": {name: {"median": statistics.median(v), "max": max(v)} for name, v in phases.items()}}))


if __name__ == "__main__":
    if sys.argv[1] != "reload":
        sys.exit(__doc__)
    main(int(sys.argv[2]), int(sys.argv[3]))
