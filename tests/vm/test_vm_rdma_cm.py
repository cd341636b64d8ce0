"""The RDMA connection manager and datagrams between two guests over vrdma0: the MAD layer opens the port on the
device's GSI QP, the IB CM's MADs travel as datagrams between the guests' QP1s, librdmacm's own tools connect over
the guests' IP addresses (route and address resolved from eth0, as for any RoCE device), and user programs send
datagrams on UD QPs, messages on UC QPs and, through XRC domains, into XRC SRQs."""

from __future__ import annotations

import json
import re
import time

import pytest

from vrdma.harness import verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.errors import AgentError, CommandTimeout

pytestmark = pytest.mark.vm

RPING_PORT, CMATOSE_PORT, UDADDY_PORT, PERFTEST_PORT, KERNEL_UD_PORT = 7174, 7471, 7174, 18515, 18516
RSTREAM_PORT = 7471


def test_the_mad_layer_opens_the_port_on_qp1(two_guests: Cluster) -> None:
    for vm in two_guests:
        log = vm.run(["dmesg"]).check("dmesg").stdout
        assert not re.search(r"Couldn't (create ib_mad|open port)", log), log
        qps = vm.run(["rdma", "resource", "show", "qp"]).check("rdma resource show qp").stdout
        assert re.search(r"link vrdma0/1 lqpn 1 type GSI state RTS .*comm \[ib_core\]", qps), qps


def test_the_port_reports_a_4x_edr_link(two_guests: Cluster) -> None:
    info = two_guests[0].run(["ibv_devinfo", "-v", "-d", "vrdma0"]).check("ibv_devinfo -v").stdout
    assert re.search(r"active_width:\s+4X", info) and re.search(r"active_speed:\s+25(\.0)? Gbps", info), info


def test_rping_verifies_1000_iterations(two_guests: Cluster) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    assert two_guests.backend is not None
    before = vm_counters(two_guests.backend, "vm1")["engine"]
    _, client = verbs.client_server(
        vm0, vm1, ["rping", "-s", "-a", vm0.address, "-V", "-C", "1000"], port=RPING_PORT, rdma_cm=True,
        client_argv=["rping", "-c", "-a", vm0.address, "-V", "-C", "1000", "-v"])
    assert client.stdout.count("ping data: rdma-ping-") == 1000
    after = vm_counters(two_guests.backend, "vm1")["engine"]
    # The CM's MADs went as datagrams between the QP1s, the pings over the connected RC QPs; the only error
    # completions are the receives flushed when the connection closed.
    assert after["send_wqes"] - before["send_wqes"] >= 2000
    assert after["error_cqes"] - before["error_cqes"] == after["flushed"] - before["flushed"]
    # The guest sees the same counters as hw_counters of its port.
    stats = vm1.run(["rdma", "statistic", "show", "link", "vrdma0/1"]).check("rdma statistic show").stdout
    found = dict(re.findall(r"(\w+) (\d+)", stats.split("vrdma0/1", 1)[1]))
    assert int(found["send_wqes"]) >= after["send_wqes"] - before["send_wqes"] and int(found["bytes"]) > 0, stats


def test_rdma_statistic_qp_counts_each_qp_and_the_port_still_adds_up(two_guests: Cluster) -> None:
    """QP counters: with auto mode by QP type, the RDMA core binds each new RC QP to a counter, which counts what
    that QP does (the device's per-QP counters). The port's counters still add up to the engine's, while the
    counter lives and after it is gone."""
    vm0, vm1 = two_guests[0], two_guests[1]
    backend = two_guests.backend
    assert backend is not None
    link = ["link", "vrdma0/1"]
    for vm in (vm0, vm1):
        vm.run(["rdma", "statistic", "qp", "set", *link, "auto", "type", "on"]).check("rdma statistic qp set auto")
    try:
        gid = verbs.ipv4_gid_index(vm0, "vrdma0")
        argv = ["ibv_rc_pingpong", "-d", "vrdma0", "-g", str(gid), "-s", "4096", "-n", "100000000"]
        server = vm0.agent.spawn(argv)
        verbs.wait_listening(vm0, verbs.PINGPONG_PORT, timeout=60, server_pid=server)
        client = vm1.agent.spawn([*argv, vm0.address])
        try:
            def pingpong_counter() -> dict[str, object] | None:
                shown = vm1.run(["rdma", "-j", "statistic", "qp", "show", *link]).check("rdma statistic qp show")
                rc = [c for c in json.loads(shown.stdout or "[]") if c.get("qp-type") == "RC"]
                return rc[0] if rc and int(rc[0]["send_wqes"]) >= 100 else None

            deadline = time.monotonic() + 120
            while (counter := pingpong_counter()) is None:
                assert time.monotonic() < deadline, "no RC QP counter with 100 sends within 120 s"
                time.sleep(0.5)
            # One QP, the ping-pong's; every send a 4 KiB message out and every receive one in.
            assert len(counter["lqpn"]) == 1, counter  # type: ignore[arg-type]
            assert int(counter["recv_wqes"]) >= 99 and int(counter["error_cqes"]) == 0, counter  # type: ignore
            assert int(counter["bytes"]) >= 4096 * int(counter["send_wqes"]), counter  # type: ignore[call-overload]
        finally:
            vm1.agent.kill(client)
            vm0.agent.kill(server)
        # The QP is gone, and its counter with it; the port's counters (hw_counters and rdma statistic show, where
        # the core adds the counters' values back) are the engine's, nothing counted twice.
        deadline = time.monotonic() + 30
        qp_show = ["rdma", "-j", "statistic", "qp", "show", *link]
        while vm1.run(qp_show).check("rdma statistic qp show").stdout.strip() not in ("", "[]"):
            assert time.monotonic() < deadline, "the QP counter outlived the ping-pong by 30 s"
            time.sleep(0.2)
        shown = vm1.run(["rdma", "-j", "statistic", "show", *link]).check("rdma statistic show").stdout
        engine = vm_counters(backend, "vm1")["engine"]
        port = json.loads(shown)[0]
        assert all(int(port[name]) == engine[name] for name in engine), (port, engine)
    finally:
        for vm in (vm0, vm1):
            vm.run(["rdma", "statistic", "qp", "set", *link, "auto", "off"]).check("rdma statistic qp set auto off")


def test_ucmatose_connects_and_moves_data_on_four_connections(two_guests: Cluster) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    server, client = verbs.client_server(vm0, vm1, ["ucmatose", "-c", "4"], port=CMATOSE_PORT, rdma_cm=True,
                                         client_argv=["ucmatose", "-s", vm0.address, "-c", "4"])
    assert "data transfers complete" in server.stdout and "return status 0" in client.stdout


@pytest.mark.parametrize("sizes", [(), ("-S", "65536", "-C", "50"), ("-S", "all", "-C", "20")],
                         ids=["defaults", "64 KiB x 50", "every size"])
def test_rstream_verifies_its_data_over_rsockets(two_guests: Cluster, sizes: tuple[str, ...]) -> None:
    """rsockets (librdmacm's sockets over RDMA: RDMA WRITE with immediate into the peer's receive buffer, credits
    by SEND) between the guests, every byte checked (-T v)."""
    vm0, vm1 = two_guests[0], two_guests[1]
    server, client = verbs.client_server(vm0, vm1, ["rstream", "-T", "v", *sizes], port=RSTREAM_PORT,
                                         rdma_cm=True, client_argv=["rstream", "-s", vm0.address, "-T", "v", *sizes])
    rows = [line for line in client.stdout.splitlines() if re.match(r"^\S+\s+\d", line)]
    assert rows, client.stdout
    assert "mismatch" not in (client.stdout + client.stderr + server.stdout + server.stderr).lower()


def test_rdma_server_and_rdma_client(two_guests: Cluster) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    server, client = verbs.client_server(vm0, vm1, ["rdma_server"], port=CMATOSE_PORT, rdma_cm=True,
                                         client_argv=["rdma_client", "-s", vm0.address])
    assert "rdma_server: end 0" in server.stdout and "rdma_client: end 0" in client.stdout


@pytest.mark.parametrize("tool", ["ib_send_bw", "ib_write_bw", "ib_read_lat"])
def test_perftest_connects_with_rdma_cm(two_guests: Cluster, tool: str) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    argv = [tool, "-R", "-d", "vrdma0", "-F"]
    _, client = verbs.client_server(vm0, vm1, argv, port=PERFTEST_PORT, rdma_cm=True)
    assert re.search(r"^\s*\d+\s+\d+\s+[\d.]+", client.stdout, re.MULTILINE), client.stdout


def test_udaddy_resolves_and_exchanges_datagrams(two_guests: Cluster) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    server, client = verbs.client_server(vm0, vm1, ["udaddy"], port=UDADDY_PORT, rdma_cm=True,
                                         client_argv=["udaddy", "-s", vm0.address])
    assert "data transfers complete" in server.stdout and "return status 0" in client.stdout


@pytest.mark.parametrize("size", [1024, 4096], ids=["1 KiB", "4 KiB on a jumbo link"])
def test_the_kernel_ud_module_ping_pongs_between_guests_over_rdma_cm(two_guests: Cluster, size: int) -> None:
    """vrdma_kverbs_ud.ko (guest-driver/tests): a kernel consumer in each guest; the kernel's rdma_cm resolves the
    server's address and learns its QP by SIDR, and 100 datagrams go to the server and back, every byte checked."""
    vm0, vm1 = two_guests[0], two_guests[1]
    assert two_guests.backend is not None
    before = vm_counters(two_guests.backend, "vm1")
    for vm in (vm0, vm1):
        vm.run(["dmesg", "-c"]).check("dmesg -c")
    common = ["messages=100", f"size={size}", f"port={KERNEL_UD_PORT}"]
    with verbs.link_mtu([vm0, vm1], 1500 if size <= 1024 else verbs.JUMBO_MTU):
        verbs.client_server(vm0, vm1, ["modprobe", "vrdma_kverbs_ud", f"server={vm0.address}", *common],
                            port=KERNEL_UD_PORT, rdma_cm=True,
                            client_argv=["modprobe", "vrdma_kverbs_ud", f"connect={vm0.address}", *common])
    client_log = vm1.run(["dmesg"]).check("dmesg").stdout
    server_log = vm0.run(["dmesg"]).check("dmesg").stdout
    found = re.search(rf"vrdma0: client QP 0x[0-9a-f]+ to server QP (0x[0-9a-f]+): 100 datagrams of {size} bytes "
                      r"sent, echoed and checked", client_log)
    assert found, client_log
    assert re.search(rf"vrdma0: server QP {found.group(1)} echoed 100 datagrams", server_log), server_log
    for vm in (vm0, vm1):
        vm.run(["rmmod", "vrdma_kverbs_ud"]).check("rmmod vrdma_kverbs_ud")
    after = vm_counters(two_guests.backend, "vm1")
    assert after["engine"]["bytes"] - before["engine"]["bytes"] >= 2 * 100 * size  # through the engine, both ways
    assert after["objects"] == before["objects"]  # the module left nothing behind


@pytest.mark.parametrize(("mtu", "size"), [(1500, 1024), (verbs.JUMBO_MTU, None), (verbs.JUMBO_MTU, 4096)],
                         ids=["1500 B link, 1 KiB", "jumbo link, defaults", "jumbo link, 4 KiB"])
def test_ibv_ud_pingpong_checks_its_data(two_guests: Cluster, mtu: int, size: int | None) -> None:
    """ibv_ud_pingpong holds a datagram to the port's active MTU, which follows eth0's: 1024 bytes on a 1500-byte
    link, its default (2048) and 4096 on a jumbo one."""
    vm0, vm1 = two_guests[0], two_guests[1]
    assert two_guests.backend is not None
    gid = str(verbs.ipv4_gid_index(vm0, "vrdma0"))
    errors = vm_counters(two_guests.backend, "vm0")["engine"]["error_cqes"]
    with verbs.link_mtu([vm0, vm1], mtu):
        _, client = verbs.client_server(vm0, vm1, ["ibv_ud_pingpong", "-d", "vrdma0", "-g", gid, "-n", "500", "-c",
                                                   *(["-s", str(size)] if size else [])])
    assert "500 iters in" in client.stdout, client.stdout
    assert vm_counters(two_guests.backend, "vm0")["engine"]["error_cqes"] == errors


@pytest.mark.parametrize("size", [4096, 1 << 20], ids=["defaults", "1 MiB"])
def test_ibv_uc_pingpong_checks_its_data(two_guests: Cluster, size: int) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    assert two_guests.backend is not None
    gid = str(verbs.ipv4_gid_index(vm0, "vrdma0"))
    before = vm_counters(two_guests.backend, "vm0")["engine"]
    _, client = verbs.client_server(vm0, vm1, ["ibv_uc_pingpong", "-d", "vrdma0", "-g", gid, "-s", str(size), "-n",
                                               "200", "-c"])
    assert "200 iters in" in client.stdout, client.stdout
    after = vm_counters(two_guests.backend, "vm0")["engine"]
    assert after["error_cqes"] == before["error_cqes"] and after["bytes"] - before["bytes"] >= 200 * size


@pytest.mark.parametrize(("size", "iterations"), [(4096, 5), (1 << 20, 50)], ids=["defaults", "1 MiB"])
def test_ibv_xsrq_pingpong(two_guests: Cluster, size: int, iterations: int) -> None:
    """XRC: each side's XRC initiator QP sends into the other's XRC SRQ through an XRC target QP (the kernel's) of
    an XRC domain opened on a file. The tool checks no data: the engine's counters show what moved, and the
    XRC objects are gone afterwards."""
    vm0, vm1 = two_guests[0], two_guests[1]
    assert two_guests.backend is not None
    gid = str(verbs.ipv4_gid_index(vm0, "vrdma0"))
    before = {vm.name: vm_counters(two_guests.backend, vm.name) for vm in two_guests}
    server, client = verbs.client_server(vm0, vm1, ["ibv_xsrq_pingpong", "-d", "vrdma0", "-g", gid, "-s", str(size),
                                                    "-n", str(iterations)])
    assert "success" in server.stdout and "success" in client.stdout, (server.stdout, client.stdout)
    for vm in two_guests:
        after = vm_counters(two_guests.backend, vm.name)
        engine, was = after["engine"], before[vm.name]["engine"]
        assert engine["error_cqes"] == was["error_cqes"], vm.name
        assert engine["recv_wqes"] - was["recv_wqes"] >= iterations and \
            engine["bytes"] - was["bytes"] >= 2 * iterations * size, (vm.name, engine, was)
        assert after["objects"] == before[vm.name]["objects"], vm.name  # XRC domain, SRQ, both QPs gone


def test_ibv_xsrq_pingpong_serves_two_clients_sleeping_on_events(two_guests: Cluster) -> None:
    """One server (one XRC domain, one XRC SRQ, a target QP per client) and two client processes in the other
    guest; the server sleeps on completion events of the SRQ's CQ."""
    vm0, vm1 = two_guests[0], two_guests[1]
    gid = str(verbs.ipv4_gid_index(vm0, "vrdma0"))
    common = ["ibv_xsrq_pingpong", "-d", "vrdma0", "-g", gid, "-n", "20", "-e"]
    server_pid = vm0.agent.spawn([*common, "-c", "2"])
    try:
        verbs.wait_listening(vm0, verbs.PINGPONG_PORT, server_pid=server_pid)
        first = vm1.agent.spawn([*common, vm0.address])
        second = vm1.run([*common, vm0.address], timeout=300)
        results = [vm1.agent.wait(first, common, 300), second, vm0.agent.wait(server_pid, common, 300)]
    except (AgentError, CommandTimeout):
        vm0.agent.kill(server_pid)
        raise
    for result in results:
        assert result.exit_status == 0 and "success" in result.stdout, result.stdout + result.stderr


def test_perftest_writes_over_uc(two_guests: Cluster) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    rows = verbs.perftest(vm0, vm1, "ib_write_bw", "vrdma0", verbs.ipv4_gid_index(vm0, "vrdma0"), extra=("-c", "UC"))
    assert rows and rows[0]["#iterations"] >= 1000, rows
    assert next(value for name, value in rows[0].items() if name.startswith("BW average")) > 0, rows


@pytest.mark.parametrize("tool", ["ib_send_bw", "ib_send_lat"])
def test_perftest_over_ud(two_guests: Cluster, tool: str) -> None:
    vm0, vm1 = two_guests[0], two_guests[1]
    rows = verbs.perftest(vm0, vm1, tool, "vrdma0", verbs.ipv4_gid_index(vm0, "vrdma0"), extra=("-c", "UD"))
    assert rows and rows[0]["#bytes"] <= 1024 and rows[0]["#iterations"] >= 1000, rows
