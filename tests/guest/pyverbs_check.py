"""Run inside a guest: the vrdma device through libibverbs and libvrdma, from pyverbs. Modes:

  query DEVICE         open DEVICE, query it and port 1; prints JSON
  pds DEVICE N         open DEVICE, allocate N PDs, free them all, close; prints JSON
  hold DEVICE          open DEVICE and keep the context until killed
"""

import json
import signal
import sys

from pyverbs.device import Context
from pyverbs.pd import PD


def query(name):
    with Context(name=name) as ctx:
        dev = ctx.query_device()
        port = ctx.query_port(1)
        return {"fw_ver": dev.fw_version, "phys_port_cnt": dev.phys_port_cnt, "max_qp": dev.max_qp,
                "max_cq": dev.max_cq, "max_mr": dev.max_mr, "max_pd": dev.max_pd,
                "node_guid": dev.node_guid, "port_state": port.state, "link_layer": port.link_layer,
                "gid_tbl_len": port.gid_tbl_len, "active_mtu": port.active_mtu}


def pds(name, count):
    with Context(name=name) as ctx:
        allocated = [PD(ctx) for _ in range(count)]
        for pd in allocated:
            pd.close()
    return {"allocated": len(allocated)}


def hold(name):
    with Context(name=name):
        signal.pause()  # the test kills this process while the context is open


if __name__ == "__main__":
    mode, device = sys.argv[1], sys.argv[2]
    if mode == "query":
        print(json.dumps(query(device)))
    elif mode == "pds":
        print(json.dumps(pds(device, int(sys.argv[3]))))
    elif mode == "hold":
        hold(device)
    else:
        sys.exit(f"unknown mode {mode}")
