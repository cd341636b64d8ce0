"""Guests on two hosts (issue 14): vrdma guests whose backends speak RoCE v2 to each other, and to the kernel's rxe.

Three guests on the two hosts of a vrdma.harness.multihost fabric (network namespaces): vm0 (vrdma) on h0, vm1
(vrdma) and vm2 (rxe, no vrdma device) on h1. vm0 to vm1 is vrdma to vrdma across hosts; vm0 to vm2 is vrdma to
rxe across hosts, vm1 to vm2 on the same host, both ways: rxe is an independent implementation of the protocol, so
each of its runs is the proof that the wire format is right. A capture on h1's link during vrdma-to-rxe traffic
decodes in scapy's RoCE layer with the ICRCs scapy computes.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import wait_until
from storage_checks import VERIFY

from vrdma.harness import fio, nvmeof, verbs
from vrdma.harness.daemon import vm_counters
from vrdma.harness.impair import Impairment
from vrdma.harness.multihost import GuestPlan, MultiHost
from vrdma.harness.stream import WriteStream
from vrdma.harness.vm import Products, Vm, span_switchover

pytestmark = pytest.mark.vm
log = logging.getLogger(__name__)

PLAN = [GuestPlan(0), GuestPlan(1), GuestPlan(1, rxe=True)]


@pytest.fixture(scope="module")
def hosts(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    # h2 has no guest of its own: vm0 is live-migrated there, last (test_a_vm_migrated_to_a_third_host...).
    with MultiHost(tmp_path_factory.mktemp("interhost"), PLAN, products=products, host_count=3) as multihost:
        yield multihost


def device(mh: MultiHost, vm: Vm) -> str:
    return "rxe0" if mh.plan[mh.vms.index(vm)].rxe else "vrdma0"


def roce_counters(mh: MultiHost, host: int, vm: str) -> dict[str, int]:
    return vm_counters(mh.backends[host], vm)["roce"]  # type: ignore[no-any-return]


def pingpong(mh: MultiHost, server: Vm, client: Vm, size: int = 4096, iterations: int = 200) -> Any:
    """ibv_rc_pingpong with its data check (-c), each side on its own device and IPv4 GID."""
    server_argv, client_argv = both(mh, server, client, "ibv_rc_pingpong", "-s", str(size), "-n", str(iterations),
                                    "-c")
    _, out = verbs.client_server(server, client, server_argv, client_argv=client_argv, timeout=300)
    assert re.search(rf"{iterations} iters in [\d.]+ seconds", out.stdout), out.stdout
    return out


def both(mh: MultiHost, server: Vm, client: Vm, tool: str, *args: str) -> tuple[list[str], list[str]]:
    """A pingpong's server and client argv, each on its own device and IPv4 GID."""
    return ([tool, "-d", device(mh, server), "-g", str(verbs.ipv4_gid_index(server, device(mh, server))), *args],
            [tool, "-d", device(mh, client), "-g", str(verbs.ipv4_gid_index(client, device(mh, client))), *args,
             server.address])


def vrdma_guests(mh: MultiHost, *vms: Vm) -> dict[str, int]:
    """The vrdma guests among ``vms``: their names and hosts (rxe guests have no backend to ask)."""
    return {vm.name: mh.plan[mh.vms.index(vm)].host for vm in vms if device(mh, vm) == "vrdma0"}


def perftest(mh: MultiHost, server: Vm, client: Vm, tool: str, extra: tuple[str, ...] = (),
             check_data: bool = True) -> list[Any]:
    """A perftest tool between two guests, each side on its own device and IPv4 GID: its result rows. perftest
    checks no data and reports whatever ran: each vrdma side's backend must have sent and taken at least a packet
    per iteration over RoCE, and (``check_data``) ibv_rc_pingpong's data check then passes between the same two."""
    guests = vrdma_guests(mh, server, client)
    before = {name: roce_counters(mh, host, name) for name, host in guests.items()}
    rows = verbs.perftest(server, client, tool, device(mh, server), verbs.ipv4_gid_index(server, device(mh, server)),
                          ("-n", "200", *extra), timeout=600,
                          client_device=(device(mh, client), verbs.ipv4_gid_index(client, device(mh, client))))
    assert rows
    for name, host in guests.items():
        after = roce_counters(mh, host, name)
        moved = {key: after[key] - before[name][key] for key in ("tx_packets", "rx_packets")}
        assert min(moved.values()) >= 200, f"{tool}: {name}'s backend moved {moved} RoCE packets for 200 iterations"
    if check_data:
        pingpong(mh, server, client, size=4096, iterations=20)
    return rows


@pytest.mark.parametrize("size", [4096, 65536])
def test_rc_pingpong_vrdma_to_vrdma_across_hosts(hosts: MultiHost, size: int) -> None:
    vm0, vm1 = hosts.vms[0], hosts.vms[1]
    before = roce_counters(hosts, 0, "vm0")["tx_packets"]
    out = pingpong(hosts, vm1, vm0, size=size)
    sent = roce_counters(hosts, 0, "vm0")["tx_packets"] - before
    # every message went over the wire, segmented at the 1024-byte path MTU of a 1500-byte link
    assert sent >= 200 * -(-size // 1024), sent
    log.info("vrdma<->vrdma across hosts, %d B: %s", size, out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tool", ["ib_write_bw", "ib_read_bw", "ib_atomic_bw", "ib_send_lat"])
def test_perftest_vrdma_to_vrdma_across_hosts(hosts: MultiHost, tool: str) -> None:
    rows = perftest(hosts, hosts.vms[1], hosts.vms[0], tool)
    log.info("%s across hosts: %s", tool, rows)


# (server, client) guest indexes: vrdma on h0 with rxe on h1, both ways; vrdma and rxe on h1, both ways.
INTEROP = {"vrdma h0 -> rxe h1": (2, 0), "rxe h1 -> vrdma h0": (0, 2), "vrdma h1 -> rxe h1": (2, 1),
           "rxe h1 -> vrdma h1": (1, 2)}


@pytest.mark.parametrize("pair", INTEROP, ids=list(INTEROP))
def test_rc_pingpong_with_rxe(hosts: MultiHost, pair: str) -> None:
    server, client = (hosts.vms[i] for i in INTEROP[pair])
    pingpong(hosts, server, client, size=8192)


@pytest.mark.parametrize("tool", ["ib_write_bw", "ib_read_bw"])
@pytest.mark.parametrize("pair", INTEROP, ids=list(INTEROP))
def test_perftest_with_rxe(hosts: MultiHost, pair: str, tool: str) -> None:
    server, client = (hosts.vms[i] for i in INTEROP[pair])
    perftest(hosts, server, client, tool)



ALL_PAIRS = {"vrdma h0 -> vrdma h1": (1, 0), **INTEROP}
RPING_PORT = 7174


@pytest.mark.parametrize("pair", ALL_PAIRS, ids=list(ALL_PAIRS))
def test_ud_pingpong(hosts: MultiHost, pair: str) -> None:
    """Datagrams (a DETH, the Q_Key checked) between hosts and with rxe: ibv_ud_pingpong with its data check."""
    server, client = (hosts.vms[i] for i in ALL_PAIRS[pair])
    server_argv, client_argv = both(hosts, server, client, "ibv_ud_pingpong", "-n", "200", "-s", "1024", "-c")
    _, out = verbs.client_server(server, client, server_argv, client_argv=client_argv, timeout=300)
    assert "200 iters in" in out.stdout, out.stdout


@pytest.mark.parametrize("pair", ["vrdma h0 -> vrdma h1", "vrdma h0 -> rxe h1", "rxe h1 -> vrdma h0"])
def test_uc_pingpong(hosts: MultiHost, pair: str) -> None:
    server, client = (hosts.vms[i] for i in ALL_PAIRS[pair])
    server_argv, client_argv = both(hosts, server, client, "ibv_uc_pingpong", "-n", "200", "-s", "8192", "-c")
    _, out = verbs.client_server(server, client, server_argv, client_argv=client_argv, timeout=300)
    assert "200 iters in" in out.stdout, out.stdout


@pytest.mark.parametrize("pair", ALL_PAIRS, ids=list(ALL_PAIRS))
def test_rping(hosts: MultiHost, pair: str) -> None:
    """The RDMA CM across hosts: its MADs as datagrams between the QP1s (GSI), then RC; rping checks its data."""
    server, client = (hosts.vms[i] for i in ALL_PAIRS[pair])
    _, out = verbs.client_server(
        server, client, ["rping", "-s", "-a", server.address, "-V", "-C", "200", "-p", str(RPING_PORT)],
        port=RPING_PORT, rdma_cm=True,
        client_argv=["rping", "-c", "-a", server.address, "-V", "-C", "200", "-v", "-p", str(RPING_PORT)])
    assert out.stdout.count("ping data: rdma-ping-") == 200, out.stdout[-2000:]



def test_nvmeof_across_hosts(hosts: MultiHost) -> None:
    """NVMe over Fabrics between hosts: the kernel's target in vm1 (h1), its host in vm0 (h0), fio verifying every
    block; every byte crossed the wire as RoCE (each backend's device counted it)."""
    target_vm, host_vm = hosts.vms[1], hosts.vms[0]
    before = [roce_counters(hosts, k, f"vm{k}")["rx_packets"] for k in (0, 1)]
    with nvmeof.target(target_vm, "rdma", size_mib=32) as exported, nvmeof.host(host_vm, exported) as device:
        job = fio.job(host_vm, device, "--rw=randwrite", "--bs=16k", "--iodepth=16", "--size=16M", *VERIFY)
    assert job["write"]["io_bytes"] == job["read"]["io_bytes"] == 16 << 20, job
    received = [roce_counters(hosts, k, f"vm{k}")["rx_packets"] - before[k] for k in (0, 1)]
    assert all(n >= (16 << 20) // 1024 for n in received), received  # 16 MiB each way in 1024-byte packets


SNIFF = """
import sys
from scapy.all import UDP, AsyncSniffer, wrpcap
sniffer = AsyncSniffer(iface="eth0", lfilter=lambda p: UDP in p and p[UDP].dport == 4791,
                       started_callback=lambda: print("sniffing", flush=True))
sniffer.start()
sys.stdin.readline()  # until the test has made its traffic
wrpcap(sys.argv[1], sniffer.stop())
print("written", flush=True)
"""


def test_capture_decodes_as_roce_v2_with_valid_icrcs(hosts: MultiHost, tmp_path: Path) -> None:
    """vrdma (vm0, h0) to rxe (vm2, h1): what crosses h1's link, both ways, decodes in scapy's RoCE layer, and
    every ICRC is the one scapy computes."""
    from scapy.all import IP, UDP, rdpcap
    from scapy.contrib.roce import BTH

    pcap = tmp_path / "roce.pcap"
    sniffer = subprocess.Popen(hosts.fabric[1].command([sys.executable, "-c", SNIFF, str(pcap)]),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert sniffer.stdin is not None and sniffer.stdout is not None
    try:
        assert sniffer.stdout.readline().strip() == "sniffing", sniffer.stderr
        pingpong(hosts, hosts.vms[2], hosts.vms[0], size=3000, iterations=20)
        sniffer.stdin.write("done\n")
        sniffer.stdin.flush()
        assert sniffer.stdout.readline().strip() == "written", sniffer.stderr
    finally:
        sniffer.kill()
        sniffer.wait(30)
    captured = rdpcap(str(pcap))  # every UDP datagram to port 4791 that crossed the link
    undecoded = [p.summary() for p in captured if BTH not in p]
    assert not undecoded, f"{len(undecoded)} of {len(captured)} packets to 4791 are no RoCE v2: {undecoded[:5]}"
    packets = list(captured)
    assert len(packets) >= 20 * 3 * 2, len(packets)  # 20 exchanges of 3000 B each way, at least
    senders = {p[IP].src for p in packets}
    assert senders == {hosts.vms[0].address, hosts.vms[2].address}, senders
    for p in packets:
        got = p[BTH].icrc
        again = p[IP].copy()
        again[BTH].icrc = None
        assert IP(bytes(again))[BTH].icrc == got, p.summary()
        assert p[UDP].dport == 4791 and p[BTH].version == 0
    opcodes = {p[BTH].opcode for p in packets}
    assert {0x00, 0x02, 0x11} <= opcodes, opcodes  # SEND first and last (3000 B at 1024), ACKs
    log.info("%d RoCE v2 packets decoded, opcodes %s", len(packets), sorted(opcodes))


LOSSY = Impairment(loss=0.01, duplicate=0.01, reorder=0.01, seed=14)


def test_lossy_link_keeps_the_data_intact(products: Products, tmp_path: Path) -> None:
    """1% loss, 1% duplication and 1% reordering on the link between the hosts (the harness's impairing switch:
    this machine has no netem): ibv_rc_pingpong's data check and ib_write_bw complete, and the backends' counters
    show the recovery (retransmissions, duplicates answered again)."""
    with MultiHost(tmp_path, [GuestPlan(0), GuestPlan(1)], products=products, impairment=LOSSY,
                   prefix=f"lossy{os.getpid() % 100000}") as lossy:
        vm0, vm1 = lossy.vms
        pingpong(lossy, vm1, vm0, size=16384, iterations=300)
        perftest(lossy, vm1, vm0, "ib_write_bw", ("-s", "65536"), check_data=False)  # (the pingpong above did)
        sent = [roce_counters(lossy, k, f"vm{k}") for k in (0, 1)]
        log.info("after 1%% loss, duplication and reordering: vm0 %s, vm1 %s", sent[0], sent[1])
        assert sum(c["retransmits"] for c in sent) > 0, sent
        assert sum(c["duplicates"] + c["seq_naks"] for c in sent) > 0, sent


def test_a_vm_migrated_to_a_third_host_keeps_its_queue_pairs_with_its_peer(hosts: MultiHost) -> None:
    """vm0 (h0) live-migrated to h2 while `ibv_rc_pingpong -c` and the checked WRITE stream run between it and vm1
    on h1: the device's state travels in QEMU's stream to h2's backend, the harness moves vm0's address and RoCE to
    h2 (MultiHost.migrate: what an operator's network does), RC retransmission covers what vm1 sent to h0 during
    the switch-over, and both programs finish with every buffer and block right, vm0's RoCE now through h2. (Last in
    this module: vm0 stays on h2.)"""
    server, client = hosts["vm0"], hosts["vm1"]
    gid = verbs.ipv4_gid_index(server, "vrdma0")
    assert verbs.ipv4_gid_index(client, "vrdma0") == gid  # (the stream gives both sides one index)
    stream = WriteStream(hosts, "vm0", "vm1", gid)
    server_argv, client_argv = both(hosts, server, client, "ibv_rc_pingpong", "-s", "4096", "-n", "1500", "-c")
    server_pid = server.agent.spawn(server_argv)
    verbs.wait_listening(server, verbs.PINGPONG_PORT, timeout=60, server_pid=server_pid)
    client_pid = client.agent.spawn(client_argv)
    sent = roce_counters(hosts, 1, "vm1")["tx_packets"]
    wait_until("the ping-pong across hosts", lambda: roce_counters(hosts, 1, "vm1")["tx_packets"] > sent + 400, 120)
    stream.wait_for(64)
    # (its client held by SIGSTOP, the process only: its guest's device goes on answering the stream and vm0's
    # retransmissions, where a stopped guest's would drop them and cost the peers their retries)
    hosts.migrate("vm0", 2, **span_switchover(client, client_pid, lambda: roce_counters(hosts, 1, "vm1")["tx_packets"],
                                              400, "the ping-pong's client"))
    server = hosts["vm0"]
    before = roce_counters(hosts, 2, "vm0")
    stream.wait_for(128, "the WRITE stream after vm0 moved to h2")
    streamed = stream.end()
    log.info("WRITE stream across hosts: %s", streamed)
    assert streamed["recv"]["blocks"] == streamed["send"]["blocks"] > 0 and streamed["recv"]["wrong"] is None
    for guest, pid, argv in ((server, server_pid, server_argv), (client, client_pid, client_argv)):
        result = guest.agent.wait(pid, argv, timeout=180)
        assert result.exit_status == 0, f"{guest.name}: {result.stdout}{result.stderr}"
        assert "1500 iters in" in result.stdout, result.stdout
    after = roce_counters(hosts, 2, "vm0")
    assert after["rx_packets"] > before["rx_packets"] and after["tx_packets"] > before["tx_packets"], after
    assert "vm0" not in {vm["name"] for vm in daemon_vms(hosts, 0)}, "h0's backend still serves vm0"
    dmesg = server.run(["dmesg"]).check("dmesg").stdout
    assert "device lost" not in dmesg, dmesg[-3000:]


def daemon_vms(mh: MultiHost, host: int) -> list[dict[str, Any]]:
    from vrdma.harness import daemon

    reply = daemon.admin(mh.backends[host], {"command": "vm-list"})
    assert reply["ok"], reply
    return reply["vms"]  # type: ignore[no-any-return]
