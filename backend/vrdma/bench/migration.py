"""Live migration and a backend upgrade with traffic running (issue 28; docs/migration.md).

Two guests of one backend; vm1 writes 1 MiB messages into vm0 over 16 RC QPs (`ib_write_bw -q 16`) for the whole
run, and the checked WRITE stream (vrdma/harness/guest/write_stream.py) runs beside it as the ping-pong whose
completions show a pause. vm0 is live-migrated to a new QEMU of the same backend (`Cluster.migrate`), then the
backend is upgraded (`vrdma admin upgrade`), each under a stream of its own:

- ``migration_device_downtime_ms``: the device's share of the migration: its state saved, checked and loaded (the
  backend's own figures, the VM's counters' ``migration``);
- ``migration_peer_blackout_ms``: the longest gap between two completions of the peer (the stream's sender in
  vm1) while vm0 migrated: QEMU's stop of the source, the RAM and device state moved, the destination started;
- ``migration_qemu_downtime_ms`` and ``migration_qemu_total_ms``: QEMU's own figures (query-migrate);
- ``migration_state_bytes``: the device's state;
- ``backend_upgrade_pause_ms``: the longest gap between two completions of the stream's sender during the
  upgrade; ``backend_upgrade_handover_ms`` the backend's own (from the old process stopping the VMs to the new one
  running them).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vrdma.bench.metric import Metric

log = logging.getLogger(__name__)

DEVICE = "vrdma0"
QPS = 16
MESSAGE = 1 << 20
BW_SECONDS = 90          # ib_write_bw's run: long enough for a migration and an upgrade under TCG
STREAM_BLOCK = 4096      # the stream's blocks: small, so its completions are frequent


def migration(smoke: bool = False) -> list[Metric]:
    """The figures above (``smoke``: the same steps without ib_write_bw, every figure produced once)."""
    from vrdma.harness import verbs
    from vrdma.harness.cluster import Cluster
    from vrdma.harness.daemon import vm_counters

    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, Cluster(2, Path(tmp)) as guests:
        server, client = guests[0], guests[1]
        backend = guests.backend
        assert backend is not None
        accel = guests.accel.upper()
        gid = verbs.ipv4_gid_index(server, DEVICE)
        bw = ["ib_write_bw", "-d", DEVICE, "-x", str(gid), "-q", str(QPS), "-s", str(MESSAGE), "-D",
              str(BW_SECONDS), "-F", "--report_gbits"]
        if not smoke:  # (the smoke run takes every figure without the load: ib_write_bw runs for a fixed time)
            bw_server = server.agent.spawn(bw)
            verbs.wait_listening(server, verbs.PINGPONG_PORT, timeout=60, server_pid=bw_server)
            bw_client = client.agent.spawn([*bw, server.address])
            _traffic(lambda: vm_counters(backend, "vm1")["engine"]["send_wqes"], "ib_write_bw")

        with _stream(guests, gid) as stream:
            info = guests.migrate("vm0")
        blackout = stream["send"]["max_gap_ms"]
        moved = vm_counters(backend, "vm0")["migration"]
        with _stream(guests, gid) as stream:
            status = backend.upgrade()
        upgrade_gap = stream["send"]["max_gap_ms"]
        server = guests[0]
        if not smoke:
            for guest, pid, argv in ((server, bw_server, bw), (client, bw_client, [*bw, server.address])):
                result = guest.agent.wait(pid, argv, timeout=BW_SECONDS + 300)
                if result.exit_status != 0:
                    raise RuntimeError(f"ib_write_bw in {guest.name} failed across the migration and the upgrade: "
                                       f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    load = "the checked WRITE stream alone (smoke)" if smoke else \
        f"ib_write_bw 1 MiB over {QPS} QPs and the checked WRITE stream"
    what = f"vrdma bench (two {accel} guests of one backend, {load} running"
    device_ms = moved["saved_ms"] + moved["checked_ms"] + moved["loaded_ms"]
    return [
        Metric("migration_device_downtime_ms", round(device_ms, 2), "ms",
               f"{what}; vm0 migrated to a new QEMU: its device state saved + checked + loaded, the backend's time)"),
        Metric("migration_peer_blackout_ms", round(blackout, 1), "ms",
               f"{what}; vm0 migrated: the longest gap between the peer's completions)"),
        Metric("migration_qemu_downtime_ms", float(info["downtime"]), "ms",
               f"{what}; vm0 migrated: QEMU's query-migrate downtime)"),
        Metric("migration_qemu_total_ms", float(info["total-time"]), "ms",
               f"{what}; vm0 migrated: QEMU's query-migrate total-time)"),
        Metric("migration_state_bytes", float(moved["bytes"]), "bytes",
               f"{what}; vm0's device state as migrated)"),
        Metric("backend_upgrade_pause_ms", round(upgrade_gap, 1), "ms",
               f"{what}; vrdma admin upgrade: the longest gap between the stream's completions)"),
        Metric("backend_upgrade_handover_ms", float(status["upgrade"]["pause_ms"]), "ms",
               f"{what}; vrdma admin upgrade: from the old backend stopping the VMs to the new one running them)"),
    ]


def _traffic(done: Any, what: str, more: int = 200) -> None:
    """``done()`` (a count) moves on by ``more``, within 120 s."""
    start, deadline = done(), time.monotonic() + 120
    while done() < start + more:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} traffic through the backend within 120 s")
        time.sleep(0.05)  # the counters are asked for; nothing announces them


@contextlib.contextmanager
def _stream(guests: Any, gid: int) -> Iterator[dict[str, Any]]:
    """The checked WRITE stream from vm1 into vm0 around a block (which may move either guest to another QEMU);
    its two reports, by side, after it. It runs steadily before and after the block, so that its longest gap is the
    block's."""
    from vrdma.harness.stream import WriteStream

    stream = WriteStream(guests, "vm0", "vm1", gid, device=DEVICE, block=STREAM_BLOCK)
    stream.wait_for(128)
    report: dict[str, Any] = {}
    yield report
    stream.wait_for(128)
    report.update(stream.end())
    log.info("WRITE stream: %s", report)
