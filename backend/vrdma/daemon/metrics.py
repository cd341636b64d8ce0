"""The backend's Prometheus metrics (``--metrics [HOST:]PORT``): per-VM counters, objects and connection state, the
network's counters, the engine's time, and the process's own (CPU, memory, fds), served by prometheus_client.

prometheus_client's HTTP server runs in a thread of its own; everything it reports is read on the loop's thread, the
only one that touches the devices: a scrape asks the loop for a snapshot through a pipe the loop watches and waits
for the answer (SNAPSHOT_TIMEOUT). The counters are those `vrdma admin counters` shows, under Prometheus names:

    vrdma_<group>_<counter>_total{vm="..."}   group: engine (struct vre_counters), roce (a VM's RoCE traffic),
                                              connection (its vhost-user connections)
    vrdma_commands_total{vm}, vrdma_command_errors_total{vm}, vrdma_commands_by_opcode_total{vm, opcode}
    vrdma_events_posted_total{vm}, vrdma_events_dropped_total{vm}, vrdma_events_pending{vm}
    vrdma_objects{vm, kind}, vrdma_vm_connected{vm}
    vrdma_network_<counter>_total                 what arrived from other hosts that no QP took, what went out
    vrdma_qos_<...>{vm="..."}                  its share of the engine: turns, throttled seconds, deferred bytes,
                                              pieced messages (counters); weight and limits (gauges)
    vrdma_vms, vrdma_vm_slots, vrdma_engine_seconds_total, vrdma_engine_work_total, vrdma_engine_threads,
    vrdma_engine_thread_busy_seconds_total{thread}, vrdma_engine_thread_work_total{thread}

docs/operating.md lists them with their meaning.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import MetricsHandler
from prometheus_client.process_collector import ProcessCollector

from vrdma.daemon.config import parse_listen_address
from vrdma.engine.api import COUNTERS, ROCE_COUNTERS
from vrdma.loop import EventLoop

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT = 5.0  # a scrape waits this long for the loop (busy with a long command) before it fails
# The counters among a VM's "connection" values (the others are its state and what it negotiated).
CONNECTION_COUNTERS = ("accepted", "refused", "closed", "migrations_in", "protocol_errors", "memory_faults",
                       "config_reads", "device_resets", "stops", "states_refused_at_start", "shared_memory_maps")


@dataclass
class Snapshot:
    """What one scrape reports, taken on the loop's thread."""

    vms: dict[str, dict[str, Any]]       # VmEndpoint.counters_snapshot() by name
    network: dict[str, int] | None       # the engine's network counters (None without --roce)
    vm_slots: int
    engine_seconds: float
    engine_work: int
    engine_threads: list[dict[str, int]] = field(default_factory=list)  # each thread's (api.THREAD_STATS)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, handler: type) -> None:
        # HTTPServer binds IPv4 unless told: an IPv6 HOST needs its family
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        super().__init__((host, port), handler)


class MetricsEndpoint:
    """``--metrics``: prometheus_client's exposition of ``snapshot()``, on an HTTP port, until close()."""

    def __init__(self, address: str, loop: EventLoop, snapshot: Callable[[], Snapshot]) -> None:
        host, port = parse_listen_address(address, "--metrics")
        self.loop = loop
        self.snapshot = snapshot
        self._lock = threading.Lock()
        self._waiting: list[concurrent.futures.Future[Snapshot]] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, resident memory, open fds
        try:
            self.server = _Server(host, port, MetricsHandler.factory(registry))
        except OSError:
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            raise
        self.address = f"{host}:{self.server.server_address[1]}"
        loop.add_reader(self._wake_r, self._answer)
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)
        self.thread.start()
        log.info("metrics on http://%s/metrics", self.address if ":" not in host else f"[{host}]:{port}")

    def ask(self) -> Snapshot:
        """On the HTTP thread: a snapshot taken by the loop."""
        future: concurrent.futures.Future[Snapshot] = concurrent.futures.Future()
        with self._lock:
            self._waiting.append(future)
        with contextlib.suppress(BlockingIOError):  # a full pipe already wakes the loop
            os.write(self._wake_w, b"x")
        return future.result(SNAPSHOT_TIMEOUT)

    def _answer(self) -> None:
        """On the loop: one snapshot for every scrape waiting."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        with self._lock:
            waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        try:
            taken = self.snapshot()
        except Exception as err:  # a scrape fails with the reason; the loop goes on
            log.exception("metrics snapshot failed")
            for future in waiting:
                future.set_exception(err)
            return
        for future in waiting:
            future.set_result(taken)

    def close(self) -> None:
        self.loop.remove_reader(self._wake_r)
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
        with self._lock:
            for future in self._waiting:
                future.set_exception(RuntimeError("the backend is stopping"))
            self._waiting = []
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)


class _Collector:
    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint

    def collect(self) -> Iterator[Metric]:
        return iter(families(self.endpoint.ask()))


def families(snap: Snapshot) -> list[Metric]:
    """The snapshot as metric families (every counter of `vrdma admin counters`, named as the module says)."""
    out: list[Metric] = []

    def per_vm(name: str, doc: str, kind: type, key: Callable[[dict[str, Any]], int | float]) -> None:
        family = kind(name, doc, labels=["vm"])
        for vm, counters in sorted(snap.vms.items()):
            family.add_metric([vm], key(counters))
        out.append(family)

    def group(prefix: str, names: tuple[str, ...], counters_of: Callable[[dict[str, Any]], dict[str, int]],
              doc: str) -> None:
        def value(counter: str) -> Callable[[dict[str, Any]], int]:
            return lambda c: counters_of(c)[counter]

        for counter in names:
            per_vm(f"vrdma_{prefix}_{counter}", f"{doc}: {counter}", CounterMetricFamily, value(counter))

    out.append(GaugeMetricFamily("vrdma_vms", "VMs the backend serves", value=len(snap.vms)))
    out.append(GaugeMetricFamily("vrdma_vm_slots", "VMs the backend may serve at once (--max-vms)",
                                 value=snap.vm_slots))
    out.append(CounterMetricFamily("vrdma_engine_seconds", "time the loop spent in the data engine (polling and "
                                   "running work)", value=snap.engine_seconds))
    out.append(CounterMetricFamily("vrdma_engine_work", "WQEs and packets the data engine handled",
                                   value=snap.engine_work))
    out.append(GaugeMetricFamily("vrdma_engine_threads", "the engine's threads (--engine-threads)",
                                 value=len(snap.engine_threads)))
    busy = CounterMetricFamily("vrdma_engine_thread_busy_seconds", "time an engine thread spent in passes that "
                               "did work", labels=["thread"])
    work = CounterMetricFamily("vrdma_engine_thread_work", "WQEs, pieces and packets an engine thread handled",
                               labels=["thread"])
    rx = CounterMetricFamily("vrdma_engine_thread_rx_packets", "RoCE packets an engine thread took from its receive "
                             "rings (the kernel's fanout shares the flows among them)", labels=["thread"])
    for thread, stats in enumerate(snap.engine_threads):
        busy.add_metric([str(thread)], stats["busy_ns"] / 1e9)
        work.add_metric([str(thread)], stats["work"])
        rx.add_metric([str(thread)], stats["rx_packets"])
    out += [busy, work, rx]
    per_vm("vrdma_vm_connected", "1 while the VM's QEMU is connected", GaugeMetricFamily,
           lambda c: int(c["connection"]["state"] == "connected"))
    per_vm("vrdma_commands", "control commands the VM's driver sent", CounterMetricFamily, lambda c: c["commands"])
    per_vm("vrdma_command_errors", "control commands that failed", CounterMetricFamily, lambda c: c["command_errors"])
    per_vm("vrdma_events_posted", "events posted to the VM's driver", CounterMetricFamily,
           lambda c: c["events_posted"])
    per_vm("vrdma_events_dropped", "events dropped (the driver did not take them in time)", CounterMetricFamily,
           lambda c: c["events_dropped"])
    per_vm("vrdma_events_pending", "events waiting for the VM's driver", GaugeMetricFamily,
           lambda c: c["events_pending"])
    by_opcode = CounterMetricFamily("vrdma_commands_by_opcode", "control commands by opcode", labels=["vm", "opcode"])
    objects = GaugeMetricFamily("vrdma_objects", "live RDMA objects by kind", labels=["vm", "kind"])
    for vm, counters in sorted(snap.vms.items()):
        for opcode, count in sorted(counters["by_opcode"].items()):
            by_opcode.add_metric([vm, str(opcode)], count)
        for kind, count in sorted(counters["objects"].items()):
            objects.add_metric([vm, kind], count)
    out += [by_opcode, objects]
    group("engine", COUNTERS, lambda c: c["engine"], "the data engine's work for the VM")
    group("roce", ROCE_COUNTERS, lambda c: c["roce"], "the VM's RoCE v2 traffic with other hosts")
    per_vm("vrdma_qos_turns", "engine turns in which the VM had work", CounterMetricFamily,
           lambda c: c["qos"]["turns"])
    per_vm("vrdma_qos_throttled_seconds", "time the VM's limits held back work it had", CounterMetricFamily,
           lambda c: c["qos"]["throttled_ns"] / 1e9)
    per_vm("vrdma_qos_deferred_bytes", "bytes of the VM's messages moved in a later turn than their first piece",
           CounterMetricFamily, lambda c: c["qos"]["deferred_bytes"])
    per_vm("vrdma_qos_pieced_messages", "the VM's messages moved in more than one piece", CounterMetricFamily,
           lambda c: c["qos"]["pieced_messages"])
    per_vm("vrdma_qos_weight", "the VM's weight (100: an equal share)", GaugeMetricFamily,
           lambda c: c["qos"]["weight"])
    per_vm("vrdma_qos_low_latency", "1 if the VM's latency class is low", GaugeMetricFamily,
           lambda c: int(c["qos"]["latency"] == "low"))
    per_vm("vrdma_qos_limit_bytes_per_s", "the VM's limit on payload bytes per second (0: none)",
           GaugeMetricFamily, lambda c: c["qos"]["bytes-per-s"])
    per_vm("vrdma_qos_limit_wrs_per_s", "the VM's limit on work requests per second (0: none)", GaugeMetricFamily,
           lambda c: c["qos"]["wrs-per-s"])
    group("connection", CONNECTION_COUNTERS, lambda c: c["connection"], "the VM's vhost-user connections")
    if snap.network is not None:
        for counter, value in sorted(snap.network.items()):
            out.append(CounterMetricFamily(f"vrdma_network_{counter}", f"the host's RoCE v2 sockets: {counter}",
                                           value=value))
    return out
