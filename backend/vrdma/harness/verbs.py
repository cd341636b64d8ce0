"""RDMA helpers run inside guests: software RoCE links, GID lookup, and client/server verbs programs
(ibv_rc_pingpong, ibv_srq_pingpong, perftest) between two guests or two processes of one guest."""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from vrdma.harness.agent import ExecResult
from vrdma.harness.errors import AgentError, CommandTimeout
from vrdma.harness.vm import Vm

log = logging.getLogger(__name__)

PERFTEST_CLOCK_ATTEMPTS = 3  # runs of a perftest tool whose clock calibration failed (inf), before giving up
PINGPONG_PORT = 18515  # the default TCP port of ibv_*_pingpong and perftest for exchanging QP addresses


def add_rxe(vm: Vm, device: str = "rxe0", netdev: str = "eth0") -> None:
    """Create a software RoCE device on a guest netdev (the kernel's rxe driver)."""
    vm.run(["rdma", "link", "add", device, "type", "rxe", "netdev", netdev], timeout=60).check(
        f"rdma link add {device} in {vm.name}")


JUMBO_MTU = 9000  # what RoCE fabrics run: room for a 4096-byte path MTU (datagrams of 4 KiB)


@contextlib.contextmanager
def link_mtu(vms: Sequence[Vm], mtu: int = JUMBO_MTU, netdev: str = "eth0") -> Iterator[None]:
    """The guests' link at ``mtu`` for the block, then back to what it was. A RoCE port's active MTU follows its
    netdev's (vrdma and rxe alike): 1500 gives 1024-byte paths and datagrams, 9000 gives 4096."""
    before = [int(vm.run(["cat", f"/sys/class/net/{netdev}/mtu"]).check("netdev MTU").stdout) for vm in vms]
    try:
        for vm in vms:
            vm.run(["ip", "link", "set", netdev, "mtu", str(mtu)]).check(f"ip link set {netdev} mtu {mtu}")
        yield
    finally:
        for vm, old in zip(vms, before, strict=True):
            vm.run(["ip", "link", "set", netdev, "mtu", str(old)]).check(f"ip link set {netdev} mtu {old}")


def ipv4_gid_index(vm: Vm, device: str, port: int = 1) -> int:
    """Index of the RoCE v2 GID that carries the guest's IPv4 address (::ffff:a.b.c.d).

    The table has hundreds of slots (rxe: 1024), so one grep reads them all: a process per slot costs
    seconds under TCG. Empty slots fail to report a type (EINVAL); those errors are expected and ignored.
    """
    port_dir = f"/sys/class/infiniband/{device}/ports/{port}"
    result = vm.sh(f"cd {port_dir} && grep -H . gids/* gid_attrs/types/* 2>/dev/null", timeout=60)
    gids: dict[str, str] = {}
    types: dict[str, str] = {}
    for line in result.stdout.splitlines():
        path, _, value = line.partition(":")
        table, _, index = path.rpartition("/")
        (gids if table == "gids" else types)[index] = value
    if not gids:
        raise AgentError(f"cannot read the GID table of {device} in {vm.name} ({port_dir}): {result.stderr}")
    for index, gid in gids.items():
        if gid.startswith("0000:0000:0000:0000:0000:ffff:") and "v2" in types.get(index, ""):
            return int(index)
    listed = "\n".join(f"{i} {g} {types.get(i, '')}" for i, g in sorted(gids.items(), key=lambda kv: int(kv[0]))
                       if g != "0000:0000:0000:0000:0000:0000:0000:0000")
    raise AgentError(f"{device} in {vm.name} has no RoCE v2 IPv4 GID; GID table:\n{listed}")


# What the guest kernel's MAD layer holds on a registered vrdma0 for as long as the port is open: its PD, its CQ
# and QP1 (the GSI QP). A guest with nothing else open has these objects in the backend, and only these.
MAD_OBJECTS = {"pd": 1, "cq": 1, "qp": 1}


def wait_listening(vm: Vm, port: int, timeout: float = 60.0, server_pid: int | None = None,
                   rdma_cm: bool = False) -> None:
    """Wait until a TCP port is listening in the guest (a server started in the background is ready), or with
    ``rdma_cm`` an RDMA CM port (a LISTEN cm_id in `rdma resource show cm_id`); with ``server_pid``, fail at once,
    with its output, if that server exits instead."""
    deadline = time.monotonic() + timeout
    if rdma_cm:
        argv, pattern, what = ["rdma", "resource", "show", "cm_id"], rf"state LISTEN .*src-addr \S+:{port}\b", "RDMA CM"
    else:
        argv, pattern, what = ["ss", "-ltnH"], rf":{port}\s", "TCP"
    while time.monotonic() < deadline:
        if re.search(pattern, vm.run(argv, timeout=30).stdout):
            return
        exited = vm.agent.poll(server_pid) if server_pid is not None else None
        if exited is not None:
            raise AgentError(f"the server in {vm.name} exited ({exited.exit_status}) before listening on port "
                             f"{port}:\n{exited.stdout}{exited.stderr}")
    raise AgentError(f"nothing listens on {what} port {port} in {vm.name} after {timeout:g} s")


@dataclass(frozen=True)
class PingPongResult:
    size: int
    iterations: int
    seconds: float
    mbit_per_s: float
    usec_per_iter: float
    server_output: str
    client_output: str


_BYTES = re.compile(r"(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec")
_ITERS = re.compile(r"(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter")


def client_server(server: Vm, client: Vm, argv: list[str], *, port: int = PINGPONG_PORT,
                  timeout: float = 300.0, client_argv: list[str] | None = None,
                  rdma_cm: bool = False) -> tuple[ExecResult, ExecResult]:
    """Run a verbs program as server (``argv``) in one guest and as client in another, or in the same guest:
    ``client_argv`` if given, else ``argv`` + the server's address. The server is ready when it listens on
    ``port`` (TCP, or an RDMA CM port with ``rdma_cm``). Return (server, client) results, raise with both outputs
    when either side fails."""
    server_pid = server.agent.spawn(argv)
    try:
        wait_listening(server, port, timeout=min(timeout, 60.0), server_pid=server_pid, rdma_cm=rdma_cm)
        client_result = client.run(client_argv or [*argv, server.address], timeout=timeout)
        server_result = server.agent.wait(server_pid, argv, timeout)
    except (AgentError, CommandTimeout):
        server.agent.kill(server_pid)
        raise
    if client_result.exit_status != 0 or server_result.exit_status != 0:
        raise AgentError(f"{' '.join(argv)} failed: server {server.name} exit {server_result.exit_status}, "
                         f"client {client.name} exit {client_result.exit_status}\n"
                         f"server output:\n{server_result.stdout}{server_result.stderr}\n"
                         f"client output:\n{client_result.stdout}{client_result.stderr}")
    return server_result, client_result


def rc_pingpong(server: Vm, client: Vm, device: str, gid_index: int, *, size: int = 4096,
                iterations: int = 1000, extra: tuple[str, ...] = (), timeout: float = 300.0) -> PingPongResult:
    """Run ibv_rc_pingpong between two guests (or two processes of one) and parse what the client measured."""
    args = ["-d", device, "-g", str(gid_index), "-s", str(size), "-n", str(iterations), *extra]
    server_result, client_result = client_server(server, client, ["ibv_rc_pingpong", *args], timeout=timeout)
    rate, per_iter = _BYTES.search(client_result.stdout), _ITERS.search(client_result.stdout)
    if rate is None or per_iter is None:
        raise AgentError(f"unexpected ibv_rc_pingpong output from {client.name}:\n{client_result.stdout}")
    return PingPongResult(size=size, iterations=int(per_iter.group(1)), seconds=float(per_iter.group(2)),
                          mbit_per_s=float(rate.group(3)), usec_per_iter=float(per_iter.group(3)),
                          server_output=server_result.stdout, client_output=client_result.stdout)


def perftest(server: Vm, client: Vm, tool: str, device: str, gid_index: int, extra: tuple[str, ...] = (),
             timeout: float = 900.0, client_device: tuple[str, int] | None = None) -> list[dict[str, float]]:
    """Run a perftest tool (ib_write_bw, ib_send_lat, ...) between two guests; return its result rows as
    {column: value}, columns named as perftest prints them (``#bytes``, ``BW average[MiB/sec]``, ...).
    ``client_device``: the client's (device, GID index), where it differs from the server's (vrdma and rxe)."""
    argv = [tool, "-d", device, "-x", str(gid_index), "-F", *extra]
    cdev, cgid = client_device or (device, gid_index)
    client_argv = [tool, "-d", cdev, "-x", str(cgid), "-F", *extra, server.address]
    for attempt in range(1, PERFTEST_CLOCK_ATTEMPTS + 1):
        _, out = client_server(server, client, argv, timeout=timeout, client_argv=client_argv)
        rows = perftest_rows(tool, out.stdout)
        if all(math.isfinite(value) for row in rows for value in row.values()):
            return rows
        # A latency tool converts cycles to time with the TSC rate it measures against gettimeofday; in a TCG guest
        # on a busy host that fit can fail (perftest: "Correlation coefficient r^2 < 0.9"), and it prints inf.
        # The run itself went through (its exit status is checked): measure again.
        log.warning("%s could not calibrate its clock in %s (attempt %d of %d): %s", tool, client.name, attempt,
                    PERFTEST_CLOCK_ATTEMPTS, out.stderr.strip().splitlines()[-1:] or "no message")
    raise AgentError(f"{tool} printed non-finite results {PERFTEST_CLOCK_ATTEMPTS} times:\n{out.stdout}{out.stderr}")


def perftest_rows(tool: str, stdout: str) -> list[dict[str, float]]:
    """A perftest result table as {column: value} rows."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("#bytes"):
            # Names: "#bytes", "#iterations", then "<words>[<unit>]" ("BW peak[MiB/sec]", "99% percentile[usec]").
            columns = re.findall(r"#\w+|[\w%.]+(?: [\w%.]+)?\[[^\]]*\]", line)
            rows = []
            for row in lines[i + 1:]:
                values = row.split()
                if not values or not values[0].isdigit():
                    break
                rows.append({name: float(value) for name, value in zip(columns, values, strict=False)})
            if rows:
                return rows
    raise AgentError(f"no result table in the output of {tool}:\n{stdout}")
