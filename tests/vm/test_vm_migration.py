"""Issue 28 (live migration and backend upgrade), in guests: a VM stopped and continued keeps its device, queue
pairs and traffic (QEMU's `stop` stops every queue as a migration's last phase does; only a reset resets)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import wait_until
from storage_checks import VERIFY

from vrdma.harness import daemon, fio, nvmeof, verbs
from vrdma.harness.cluster import Cluster
from vrdma.harness.daemon import vm_counters
from vrdma.harness.errors import MigrationFailed
from vrdma.harness.qemu_cmdline import GuestIdentity
from vrdma.harness.stream import WriteStream
from vrdma.harness.vm import Products, Vm, span_switchover

pytestmark = pytest.mark.vm
log = logging.getLogger(__name__)

DEVICE = "vrdma0"
STOPPED_FOR = 2.0  # seconds a VM stays stopped in the middle of its traffic


@pytest.fixture(scope="module")
def guests(products: Products, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(2, tmp_path_factory.mktemp("migration"), products=products) as cluster:
        yield cluster


def test_a_stopped_and_continued_vm_keeps_its_queue_pairs(guests: Cluster) -> None:
    """`ibv_rc_pingpong -c` (every buffer checked) between two guests; the server's VM stopped in QMP in the middle
    and continued: the device is suspended, not reset (no new epoch, nothing lost), the peer's completions stand
    still meanwhile, and both programs finish every iteration without an error."""
    server, client = guests[0], guests[1]
    backend = guests.backend
    assert backend is not None
    gid = verbs.ipv4_gid_index(server, DEVICE)
    iterations = 20000
    argv = ["ibv_rc_pingpong", "-d", DEVICE, "-g", str(gid), "-s", "4096", "-n", str(iterations), "-c"]
    server_pid = server.agent.spawn(argv)
    verbs.wait_listening(server, verbs.PINGPONG_PORT, timeout=60, server_pid=server_pid)
    client_pid = client.agent.spawn([*argv, server.address])
    before = vm_counters(backend, "vm0")["connection"]
    sent = vm_counters(backend, "vm1")["engine"]["send_wqes"]
    wait_until("ping-pong traffic through the backend",
               lambda: vm_counters(backend, "vm1")["engine"]["send_wqes"] > sent + 200, 120)

    server.qmp("stop")
    wait_until("vm0's device suspended", lambda: vm_counters(backend, "vm0")["connection"]["suspended"], 30)
    peer = vm_counters(backend, "vm1")["engine"]["cqes"]
    deadline = time.monotonic() + STOPPED_FOR
    while time.monotonic() < deadline:  # the peer waits for the stopped VM: no completion, no error
        engine = vm_counters(backend, "vm1")["engine"]
        assert (engine["cqes"], engine["error_cqes"]) == (peer, 0), engine
        time.sleep(0.2)
    server.qmp("cont")

    server_result = server.agent.wait(server_pid, argv, timeout=600)
    client_result = client.agent.wait(client_pid, argv, timeout=600)
    for name, result in (("server", server_result), ("client", client_result)):
        assert result.exit_status == 0, f"{name}: {result.stdout}{result.stderr}"
        assert f"{iterations} iters in" in result.stdout, result.stdout
    after = vm_counters(backend, "vm0")["connection"]
    assert after["stops"] == before["stops"] + 1 and after["device_resets"] == before["device_resets"]
    assert not after["suspended"]
    dmesg = server.run(["dmesg"]).check("dmesg").stdout
    assert "device lost" not in dmesg, dmesg[-3000:]


def test_queue_pairs_keep_running_across_migrations_between_two_qemus_of_one_backend(guests: Cluster) -> None:
    """`ibv_rc_pingpong -c` and a WRITE stream whose receiver checks every byte (write_stream.py) between two guests
    of one backend, the receiving guest live-migrated twice and the sending one once, each to a new QEMU connecting
    to the same backend socket while the old one is still connected (the backend's second device of the VM, which
    takes the first's place when it starts from its state): both run through every move, finish with every
    buffer and block right, and no device is reset or closed."""
    backend = guests.backend
    assert backend is not None
    server = guests[0]
    gid = verbs.ipv4_gid_index(server, DEVICE)
    (pingpong, server_pid, client_pid), stream = start_traffic(guests, gid, 30000)
    before = {name: vm_counters(backend, name)["connection"] for name in ("vm0", "vm1")}
    both_flow(backend, stream, "before the migrations")
    for name in ("vm0", "vm1", "vm0"):
        info = guests.migrate(name)
        log.info("%s migrated within the backend: %s ms total, %s ms downtime", name, info.get("total-time"),
                 info.get("downtime"))
        both_flow(backend, stream, f"after {name}'s migration")
    programs = [(guests[0], server_pid, pingpong), (guests[1], client_pid, pingpong)]
    for guest, pid, argv in programs:  # all of them ran through every move
        assert guest.agent.poll(pid) is None, f"{argv[0]} in {guest.name} ended before the last migration"
    assert stream.running(), "the WRITE stream ended before the last migration"
    end_stream(stream)
    for guest, pid, argv in programs:
        result = guest.agent.wait(pid, argv, timeout=600)
        assert result.exit_status == 0, f"{argv[:4]} in {guest.name}: {result.stdout}{result.stderr}"
        assert "30000 iters in" in result.stdout, result.stdout
    for name, moves in (("vm0", 2), ("vm1", 1)):
        after = vm_counters(backend, name)["connection"]
        assert after["migrations_in"] == before[name]["migrations_in"] + moves, after
        assert (after["device_resets"], after["closed"], after["refused"]) == (
            before[name]["device_resets"], before[name]["closed"], before[name]["refused"]), after
        assert vm_counters(backend, name)["engine"]["error_cqes"] == 0
    for guest in (guests[0], guests[1]):
        dmesg = guest.run(["dmesg"]).check("dmesg").stdout
        assert "device lost" not in dmesg, dmesg[-3000:]


def test_a_backend_upgrade_during_traffic_on_two_vms_is_a_pause(guests: Cluster) -> None:
    """`vrdma admin upgrade` while two guests run `ibv_rc_pingpong -c` and the checked WRITE stream between them: a
    new backend process takes both VMs over (their connections, memory, doorbell regions and states) and the old one
    exits; both programs go on, every buffer and block right, and no device is reset. The stream's longest gap
    between completions is the pause the guests saw."""
    backend = guests.backend
    assert backend is not None
    server, client = guests[0], guests[1]
    gid = verbs.ipv4_gid_index(server, DEVICE)
    (pingpong, server_pid, client_pid), stream = start_traffic(guests, gid, 20000)
    before = {name: vm_counters(backend, name)["connection"] for name in ("vm0", "vm1")}
    both_flow(backend, stream, "before the upgrade")
    old_pid = backend.process.pid if backend.process is not None else None
    status = backend.upgrade()
    log.info("upgraded: %s", status)
    assert status["pid"] != old_pid and status["upgrade"]["vms"] == 2, status
    both_flow(backend, stream, "after the upgrade")
    programs = [(server, server_pid, pingpong), (client, client_pid, pingpong)]
    for guest, pid, argv in programs:
        assert guest.agent.poll(pid) is None, f"{argv[0]} in {guest.name} ended before the upgrade was done"
    assert stream.running(), "the WRITE stream ended before the upgrade was done"
    end_stream(stream)
    for guest, pid, argv in programs:
        result = guest.agent.wait(pid, argv, timeout=600)
        assert result.exit_status == 0, f"{argv[:4]} in {guest.name}: {result.stdout}{result.stderr}"
    for name in ("vm0", "vm1"):
        after = vm_counters(backend, name)["connection"]
        assert {k: after[k] for k in ("device_resets", "closed", "accepted")} == \
            {k: before[name][k] for k in ("device_resets", "closed", "accepted")}, after
        assert vm_counters(backend, name)["engine"]["error_cqes"] == 0
    for guest in (server, client):
        dmesg = guest.run(["dmesg"]).check("dmesg").stdout
        assert "device lost" not in dmesg, dmesg[-3000:]


def test_datagrams_unreliable_connections_and_rdma_cm_survive_a_migration(guests: Cluster) -> None:
    """`ibv_ud_pingpong -c`, `ibv_uc_pingpong -c` and `rping -V` (rdma_cm) between two guests of one backend, the
    server's guest migrated to a new QEMU in the middle: a datagram or a UC message sent while the VM is stopped
    waits for it rather than being lost, and every program ends with every buffer checked."""
    backend = guests.backend
    assert backend is not None
    server, client = guests[0], guests[1]
    gid = str(verbs.ipv4_gid_index(server, DEVICE))
    programs = {
        "ud": (["ibv_ud_pingpong", "-d", DEVICE, "-g", gid, "-s", "1024", "-n", "3000", "-c", "-p", "18520"],
               18520, False),
        "uc": (["ibv_uc_pingpong", "-d", DEVICE, "-g", gid, "-s", "4096", "-n", "3000", "-c", "-p", "18521"],
               18521, False),
        "rping": (["rping", "-s", "-a", server.address, "-V", "-C", "500", "-S", "1024", "-p", "7175"], 7175, True)}
    spawned = []
    for name, (argv, port, rdma_cm) in programs.items():
        pid = server.agent.spawn(argv)
        verbs.wait_listening(server, port, timeout=60, server_pid=pid, rdma_cm=rdma_cm)
        client_argv = (["rping", "-c", *argv[2:], "-v"] if name == "rping" else [*argv, server.address])
        spawned.append((name, pid, argv, client.agent.spawn(client_argv), client_argv))

    def client_sends() -> int:
        return int(vm_counters(backend, "vm1")["engine"]["send_wqes"])

    sent = client_sends()
    wait_until("traffic of all three", lambda: client_sends() > sent + 600, 120)
    # The programs must still be running when the server's guest switches over, however fast this machine runs
    # them and however long its RAM takes to copy: the client's guest is stopped once it has sent 600 more while
    # RAM is copied (each program has thousands to go), and runs again once the source has stopped and before its
    # device state is saved, so that what it sends then meets a stopped server.
    copying_from = client_sends()
    held: list[bool] = []

    def hold_client() -> None:
        if not held and client_sends() > copying_from + 600:
            client.qmp("stop")
            held.append(True)

    def release_client() -> None:
        if held:
            client.qmp("cont")
        for name, _, _, client_pid, _ in spawned:
            ended = client.agent.poll(client_pid)
            assert ended is None, f"{name} ended before the switch-over (exit {ended.exit_status}):\n" \
                                  f"{ended.stdout}{ended.stderr}"

    guests.migrate("vm0", while_copying=hold_client, before_switchover=release_client)
    server = guests[0]
    for name, pid, argv, client_pid, client_argv in spawned:
        for side, guest, each, args in (("server", server, pid, argv), ("client", client, client_pid, client_argv)):
            result = guest.agent.wait(each, args, timeout=600)
            assert result.exit_status == 0, f"{name} {side}: {result.stdout}{result.stderr}"
    # (rping's disconnect flushes the receive it had posted: an error completion of its own, not of the move)


def test_nvme_over_fabrics_keeps_verifying_across_a_migration_of_its_target(guests: Cluster) -> None:
    """The kernel's NVMe-oF target (nvmet-rdma) in vm0 and its host (nvme-rdma) in vm1, fio writing and verifying
    every block through it while vm0 is live-migrated: the kernel's own QPs move with the device's state, and
    every block fio wrote reads back right, with no controller reset in the host."""
    backend = guests.backend
    assert backend is not None
    moves = vm_counters(backend, "vm0")["connection"]["migrations_in"]
    with nvmeof.target(lambda: guests["vm0"], "rdma", size_mib=32) as exported, \
            nvmeof.host(guests[1], exported) as device:
        host = guests[1]
        pid, argv = fio.spawn(host, device, "--rw=randwrite", "--bs=16k", "--iodepth=16", "--size=16M", *VERIFY)
        read = vm_counters(backend, "vm1")["engine"]["bytes"]
        wait_until("fio's I/O through vrdma", lambda: vm_counters(backend, "vm1")["engine"]["bytes"] > read + (2 << 20),
                   120)
        guests.migrate("vm0", **span_switchover(host, pid, lambda: vm_counters(backend, "vm1")["engine"]["bytes"],
                                                2 << 20, "fio"))
        job = fio.wait(host, pid, argv, timeout=300)
    assert job["write"]["io_bytes"] == job["read"]["io_bytes"] == 16 << 20, job
    assert vm_counters(backend, "vm0")["connection"]["migrations_in"] == moves + 1
    dmesg = host.run(["dmesg"]).check("dmesg").stdout
    assert not any(sign in dmesg for sign in ("error recovery", "resetting controller", "Reconnecting")), \
        dmesg[-3000:]


def test_a_cancelled_migration_and_a_refused_state_leave_the_source_running(guests: Cluster, products: Products,
                                                                            tmp_path: Path) -> None:
    """A migration cancelled while RAM is copied (the destination QEMU connected to the same backend, its device
    dropped when it goes), and one to a backend that refuses the state (it serves the VM under another MAC: another
    VM's state): both fail, the source runs on, and the WRITE stream through both checks every block."""
    backend = guests.backend
    assert backend is not None
    server, client = guests[0], guests[1]
    gid = verbs.ipv4_gid_index(server, DEVICE)
    (pingpong, server_pid, client_pid), stream = start_traffic(guests, gid, 4000)
    before = vm_counters(backend, "vm0")["connection"]
    # Cancelled: RAM copied at 8 MB/s, which a 1 GiB guest does not finish before the cancel.
    destination = server.incoming_copy(tmp_path / "cancelled")
    with pytest.raises(MigrationFailed, match="cancelled"):
        server.migrate_to(destination, max_bandwidth=8 << 20, cancel_when=lambda: vm_counters(
            backend, "vm0")["connection"]["incoming"])
    server.qmp("migrate-set-parameters", **{"max-bandwidth": 1 << 30})
    wait_until("the cancelled destination's device dropped",
               lambda: not vm_counters(backend, "vm0")["connection"]["incoming"], 30)
    both_flow(backend, stream, "after the cancelled migration")
    # Refused: a destination backend that serves vm0 with another MAC (another VM's device).
    stranger = GuestIdentity(0)
    with daemon.DaemonProcess([daemon.Served(stranger.name, daemon.socket_path(tmp_path / "b", stranger),
                                             "52:54:00:00:00:99")],
                              log_file=tmp_path / "b" / "backend.log",
                              admin_socket=tmp_path / "b" / "backend" / "admin.sock",
                              doorbell_dir=tmp_path / "b" / "backend") as other:
        destination = server.incoming_copy(tmp_path / "b" / stranger.name,
                                           vrdma_socket=daemon.socket_path(tmp_path / "b", stranger))
        with pytest.raises(MigrationFailed):
            server.migrate_to(destination)
        assert "not of" in other.log_text() or "refused" in other.log_text(), other.log_text()[-3000:]
    both_flow(backend, stream, "after the refused migration")
    end_stream(stream)
    for guest, pid, argv in ((server, server_pid, pingpong), (client, client_pid, pingpong)):
        result = guest.agent.wait(pid, argv, timeout=600)
        assert result.exit_status == 0, f"{result.stdout}{result.stderr}"
    after = vm_counters(backend, "vm0")["connection"]  # (closed: the cancelled destination QEMU's connection)
    assert (after["device_resets"], after["closed"], after["migrations_in"]) == (
        before["device_resets"], before["closed"] + 1, before["migrations_in"]), after
    assert not after["suspended"] and not after["incoming"]


def start_traffic(guests: Cluster, gid: int, iterations: int) -> tuple[tuple[list[str], int, int], WriteStream]:
    """The WRITE stream from vm1 into vm0, flowing, then `ibv_rc_pingpong -c` of ``iterations`` between them: (the
    ping-pong's argv and pids, the stream)."""
    stream = WriteStream(guests, "vm0", "vm1", gid)
    server, client = guests[0], guests[1]
    pingpong = ["ibv_rc_pingpong", "-d", DEVICE, "-g", str(gid), "-s", "4096", "-n", str(iterations), "-c"]
    server_pid = server.agent.spawn(pingpong)
    verbs.wait_listening(server, verbs.PINGPONG_PORT, timeout=60, server_pid=server_pid)
    client_pid = client.agent.spawn([*pingpong, server.address])
    return (pingpong, server_pid, client_pid), stream


def both_flow(backend: daemon.DaemonProcess, stream: WriteStream, when: str) -> None:
    """The ping-pong (vm1's send WQEs) and the WRITE stream (the blocks its receiver checked) both move on,
    ``when``."""
    sent = vm_counters(backend, "vm1")["engine"]["send_wqes"]
    stream.wait_for(128, f"the WRITE stream {when}")
    wait_until(f"the ping-pong {when}", lambda: vm_counters(backend, "vm1")["engine"]["send_wqes"] >= sent + 200,
               120)


def end_stream(stream: WriteStream) -> dict[str, dict[str, Any]]:
    """Both sides' reports; every block the sender wrote was checked, and right."""
    streamed = stream.end()
    log.info("WRITE stream: %s", streamed)
    assert streamed["recv"]["blocks"] == streamed["send"]["blocks"] > 0 and streamed["recv"]["wrong"] is None, \
        streamed
    return streamed


@pytest.fixture
def lone_guest(products: Products, tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(1, tmp_path / "source", products=products) as cluster:
        yield cluster


def test_a_vm_migrated_to_another_backend_keeps_its_queue_pairs_running(lone_guest: Cluster, products: Products,
                                                                        tmp_path: Path) -> None:
    """`ibv_rc_pingpong -c` between two processes of one guest, live-migrated by QEMU to another QEMU whose device is
    another backend's: the device's state travels in QEMU's stream (SET_DEVICE_STATE_FD), the pages the backend
    writes while RAM is copied are logged, and both programs finish every iteration with every buffer checked, on
    the destination, without the driver seeing its device lost."""
    source = lone_guest[0]
    identity = GuestIdentity(0)
    with daemon.for_guests(tmp_path / "destination", [identity]) as backend_b:
        destination = Vm(identity, tmp_path / "destination" / identity.name, accel=lone_guest.accel,
                         products=products, link_remote=str(tmp_path / "nowhere.sock"),
                         memory_mib=lone_guest.memory_mib)
        try:
            gid = verbs.ipv4_gid_index(source, DEVICE)
            iterations = 2000  # about 16 s under TCG, the migration 4-5 s of it (the QPs must be there to move)
            argv = ["ibv_rc_pingpong", "-d", DEVICE, "-g", str(gid), "-s", "4096", "-n", str(iterations), "-c"]
            server_pid = source.agent.spawn(argv)
            verbs.wait_listening(source, verbs.PINGPONG_PORT, timeout=60, server_pid=server_pid)
            client_pid = source.agent.spawn([*argv, source.address])
            assert lone_guest.backend is not None
            sent = vm_counters(lone_guest.backend, "vm0")["engine"]["send_wqes"]
            wait_until("ping-pong traffic through the source's backend",
                       lambda: vm_counters(lone_guest.backend, "vm0")["engine"]["send_wqes"] > sent + 200, 120)

            info = source.migrate_to(destination)
            log.info("migrated: %s ms total, %s ms downtime, %s", info.get("total-time"), info.get("downtime"),
                     info.get("ram"))
            moved = vm_counters(backend_b, "vm0")
            assert moved["objects"]["qp"] >= 2 and moved["connection"]["states_refused_at_start"] == 0, moved

            # (a lost completion shows as a ping-pong that never ends: what the destination's memory lacks when the
            # backend's writes are not logged dirty)
            server_result = destination.agent.wait(server_pid, argv, timeout=180)
            client_result = destination.agent.wait(client_pid, argv, timeout=180)
            for name, result in (("server", server_result), ("client", client_result)):
                assert result.exit_status == 0, f"{name}: {result.stdout}{result.stderr}"
                assert f"{iterations} iters in" in result.stdout, result.stdout
            assert vm_counters(backend_b, "vm0")["engine"]["send_wqes"] > 0
            dmesg = destination.run(["dmesg"]).check("dmesg").stdout
            assert "device lost" not in dmesg, dmesg[-3000:]
        finally:
            destination.shutdown()
