"""The `vrdma vm` commands from a shell, as a person uses them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from polling import wait_until

pytestmark = pytest.mark.vm


def vrdma(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vrdma.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy(), check=False)


def test_exec_without_guests_is_a_clear_error(run_dir: Path) -> None:
    result = vrdma("vm", "exec", "vm0", "--", "true")
    assert result.returncode == 1
    assert "no guests are up" in result.stderr and "vrdma vm up" in result.stderr


def test_bad_flags_are_usage_errors(run_dir: Path) -> None:
    for args in (["vm", "up", "--guests", "0"], ["vm", "up", "--guests", "two"], ["vm", "exec", "vm0"],
                 ["vm", "nope"]):
        result = vrdma(*args)
        assert result.returncode == 2, (args, result)
        assert result.stderr.strip(), args


def test_up_exec_down(run_dir: Path) -> None:
    up = vrdma("vm", "up", "--guests", "2")
    try:
        assert up.returncode == 0, up.stderr
        assert "vm0\t169.254.100.1\tready in" in up.stdout and "vm1\t169.254.100.2" in up.stdout
        assert "accelerator: " in up.stderr

        status_rows = vrdma("vm", "status").stdout.splitlines()
        assert [row.split("\t")[:3] for row in status_rows] == [
            ["vm0", "169.254.100.1", "running"], ["vm1", "169.254.100.2", "running"]]

        ping = vrdma("vm", "exec", "vm1", "--", "ping", "-c1", "169.254.100.1")
        assert ping.returncode == 0, ping.stderr
        assert "1 packets transmitted, 1 received" in ping.stdout

        status = vrdma("vm", "exec", "vm0", "--", "sh", "-c", "echo out; echo err >&2; exit 5")
        assert (status.returncode, status.stdout, status.stderr) == (5, "out\n", "err\n")

        # Several exec calls at once, two against the same guest.
        procs = [subprocess.Popen([sys.executable, "-m", "vrdma.cli", "vm", "exec", guest, "--", "sh", "-c",
                                   f"sleep 1; echo {guest}-{i}"], stdout=subprocess.PIPE, text=True)
                 for i, guest in enumerate(["vm0", "vm0", "vm1"])]
        outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
        assert outputs == ["vm0-0", "vm0-1", "vm1-2"]
        assert all(p.returncode == 0 for p in procs)

        unknown = vrdma("vm", "exec", "vm7", "--", "true")
        assert unknown.returncode == 1
        assert "unknown guest 'vm7'" in unknown.stderr and "vm0, vm1" in unknown.stderr

        slow = vrdma("vm", "exec", "vm0", "--timeout", "2", "--", "sleep", "60")
        assert slow.returncode == 1
        assert "command timed out in vm0 after 2 s and was killed: sleep 60" in slow.stderr

        again = vrdma("vm", "up")
        assert again.returncode == 1 and "already up" in again.stderr
    finally:
        down = vrdma("vm", "down")
    assert down.returncode == 0, down.stderr
    assert "stopped 2 guest(s): vm0, vm1" in down.stdout
    qemus = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not qemus, "QEMU processes left after `vrdma vm down`"
    assert vrdma("vm", "exec", "vm0", "--", "true").returncode == 1
    assert "no guests are up" in vrdma("vm", "status").stdout


def test_up_on_two_hosts_runs_rdma_between_them(run_dir: Path) -> None:
    """`vrdma vm up --hosts 2 --guests 2`: vm0 on host h0, vm1 on h1, each host a network namespace with its own
    backend speaking RoCE v2; ibv_rc_pingpong between them checks its data; `vrdma vm down` stops everything and
    removes the hosts."""
    from pyroute2 import netns

    before = set(netns.listnetns())
    up = vrdma("vm", "up", "--hosts", "2", "--guests", "2")
    try:
        assert up.returncode == 0, up.stderr
        assert "vm0\t10.99.0.2\tready in" in up.stdout and "vm1\t10.99.1.3\tready in" in up.stdout, up.stdout
        rows = [row.split("\t")[:3] for row in vrdma("vm", "status").stdout.splitlines()]
        assert rows == [["vm0", "10.99.0.2", "running"], ["vm1", "10.99.1.3", "running"]]
        gid = vrdma("vm", "exec", "vm0", "--", "sh", "-c",
                    "grep -l v2 /sys/class/infiniband/vrdma0/ports/1/gid_attrs/types/* | "
                    "while read f; do i=${f##*/}; grep -q ffff /sys/class/infiniband/vrdma0/ports/1/gids/$i && "
                    "echo $i && break; done").stdout.strip()
        assert gid.isdigit(), gid
        pingpong(gid)
        # `vrdma vm migrate --to`: vm0 live-migrated to h1, its device's state taken by h1's backend
        for args, error in ((["vm0"], "give the host to move to with --to HOST"),
                            (["vm0", "--to", "h0"], "vm0 runs on h0 already"),
                            (["vm0", "--to", "h7"], "the hosts are h0 to h1")):
            refused = vrdma("vm", "migrate", *args)
            assert refused.returncode == 1 and error in refused.stderr, (args, refused.stderr)
        moved = vrdma("vm", "migrate", "vm0", "--to", "h1")
        assert moved.returncode == 0 and "vm0 migrated to" in moved.stdout, moved.stderr
        rows = [row.split("\t")[:3] for row in vrdma("vm", "status").stdout.splitlines()]
        assert rows == [["vm0", "10.99.0.2", "running"], ["vm1", "10.99.1.3", "running"]]
        pingpong(gid)
    finally:
        down = vrdma("vm", "down")
    assert down.returncode == 0, down.stderr
    assert "stopped 2 guest(s): vm0, vm1" in down.stdout
    assert set(netns.listnetns()) == before  # the hosts went with the guests


def pingpong(gid: str) -> None:
    """ibv_rc_pingpong -c, 50 iterations, server in vm1 and client in vm0, through `vrdma vm exec`."""
    server = subprocess.Popen([sys.executable, "-m", "vrdma.cli", "vm", "exec", "vm1", "--", "ibv_rc_pingpong",
                               "-d", "vrdma0", "-g", gid, "-n", "50", "-c"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    client = None
    for _ in range(100):  # the server listens once its TCP port is open: a refused client tries again
        client = vrdma("vm", "exec", "vm0", "--", "ibv_rc_pingpong", "-d", "vrdma0", "-g", gid, "-n", "50",
                       "-c", "10.99.1.3")
        if client.returncode == 0 or "Couldn't connect" not in client.stdout + client.stderr:
            break
    out, err = server.communicate(timeout=120)
    assert client is not None and client.returncode == 0, (client.stdout, client.stderr, out, err)
    assert "50 iters in" in client.stdout and server.returncode == 0, (client.stdout, out, err)


def test_terminating_vm_up_while_booting_leaves_no_guest(run_dir: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "vrdma.cli", "vm", "up", "--guests", "1"],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # the accelerator line comes right before QEMU starts
        if "accelerator:" in line:
            break
    console = run_dir / "vm0" / "console.log"
    # the guest is booting once its console has output (and not yet ready: `vm up` has not returned)
    wait_until("vm0's console to show the guest booting", lambda: console.exists() and console.stat().st_size,
               timeout=60, interval=0.05)
    assert proc.poll() is None, "`vrdma vm up` ended before the guest booted"
    proc.terminate()
    assert proc.wait(60) == 128 + signal.SIGTERM
    qemus = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not qemus, "a QEMU outlived the terminated `vrdma vm up`"
