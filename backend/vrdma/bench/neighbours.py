"""The noisy neighbour: what one VM's flood does to another VM's latency on the same backend (issue 27's table).

One backend serves four simulated VMs (vm0..vm3, the simulated frontend, no guests): a victim pair (vm1 writes into
vm0) and a neighbour pair (vm3 writes into vm2), each requester driven by the C load generator as libvrdma would
drive it. In alternating rounds the victim does signaled 8-byte RDMA WRITEs one at a time, yielding the CPU while it
waits for each (on two cores a spinning victim would starve the flood's thread and measure the gaps that makes; a
pause between them longer than the engine's spin would measure the engine's wake-up), and QUERY_DEVICE commands
through the control queue, alone, while the neighbour floods 1 MiB WRITEs at full queue depth, and while it floods
8-byte WRITEs; each condition's samples are pooled over the rounds. Reported, not asserted.

The flood runs in a thread of this process (cffi releases the GIL in C); when its queue is full it sleeps 20 us
rather than spin (loadgen.c), so that on two cores the figures show the engine's scheduling, not a third spinner.

`sharing` uses the same four VMs for the engine's shares: both requesters flood 1 MiB WRITEs at once for a second,
with weights 1:1 and 3:1 set through the admin socket (the ratio of their bytes), and one flood alone under a byte
limit (its rate against the limit).

`scaling` runs the two pairs as two independent floods at once, of 1 MiB and then of 8-byte WRITEs, for a second
each, served by one engine thread and then by two (`--engine-threads`): the aggregate bandwidth and WRITE rate, and
what two threads make of it against one. The floods' drivers post a queue's worth (1,024 WRITEs) at a time and sleep
until it has drained, looking now and then (as drivers that wait for their completions would), so that on two cores
the engine's threads have the cores. Where a machine has more cores, `vrdma bench --only scaling --scaling-threads
1,2,4,8` draws the curve further, with one pair of VMs per thread of the largest count.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import cast

from vrdma.bench.backend import MIB, STREAM_TIMEOUT_NS, NativePair, native_pair
from vrdma.bench.metric import Metric
from vrdma.device import abi
from vrdma.device.constants import CommandOpcode
from vrdma.harness import daemon as daemon_launcher
from vrdma.harness.daemon import socket_path
from vrdma.harness.qemu_cmdline import GuestIdentity
from vrdma.testing.frontend import Frontend

log = logging.getLogger(__name__)

ROUNDS = 3                # alternating rounds of the three conditions
VICTIM_WRITES = 1000      # signaled 8-byte WRITEs per round and condition, one at a time, back to back ...
VICTIM_WARMUP = 50        # ... of which the first are not counted
VICTIM_COMMANDS = 200     # QUERY_DEVICE round trips per round and condition
FLOOD_DEPTH = 64          # the neighbour's queue: this many WRITEs queued at all times
FLOOD_SIGNAL_EVERY = 16
FLOODS = {"alone": 0, "flood_1mib": MIB, "flood_8b": 8}  # condition: the neighbour's WRITE size (0: no flood)
COMMAND = "vrdma bench (noisy neighbour: four simulated VMs, native drivers)"
SHARE_SECONDS = 1.0       # each sharing run: both floods (or the limited one) this long
LIMIT_BYTES_PER_S = 1_000_000_000  # the limited flood's bytes-per-s ...
LIMIT_BURST = 4 * MIB     # ... and burst (small against a second's worth, which would double the first second)
SCALING_THREADS = (1, 2)  # engine threads serving the two floods (two pairs keep at most two threads busy)
SCALING_DEPTH = 1024      # their queues: a batch of 8-byte WRITEs keeps an engine thread busy ~100 us
# How often a scaling flood's driver looks at its CQ while its batch drains (a batch of 1 MiB WRITEs takes ms): on
# two cores every look takes an engine thread's core for a moment.
SCALING_SLEEP_US = {"1mib": 500, "8b": 50}


class Flood:
    """The neighbour's WRITEs of `length` bytes at full depth, in a thread, from entering until leaving
    (`batch_sleep_us`: the queue refilled only once drained, the driver looking this often meanwhile)."""

    def __init__(self, pair: NativePair, length: int, batch_sleep_us: int = 0) -> None:
        from vrdma.testing._loadgen import ffi as nffi  # built by `make backend`

        self.pair, self.length, self.batch_sleep_us = pair, length, batch_sleep_us
        self.stop = nffi.new("uint32_t *", 0)
        self.result: int | None = None
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, name=f"flood-{length}", daemon=True)

    def _run(self) -> None:
        from vrdma.testing._loadgen import lib as nlib

        start = time.perf_counter()
        self.result = int(nlib.nat_write_flood(self.pair.queue, self.pair.cq, self.pair.write(self.length),
                                               FLOOD_SIGNAL_EVERY, self.batch_sleep_us, self.stop, STREAM_TIMEOUT_NS))
        self.seconds = time.perf_counter() - start

    def __enter__(self) -> Flood:
        # In full swing before the victim starts: its queue filled once and then some (the C driver moves prod).
        first = int(self.pair.queue.prod)
        self.thread.start()
        deadline = time.monotonic() + STREAM_TIMEOUT_NS / 1e9
        while (int(self.pair.queue.prod) - first) & 0xFFFFFFFF < 2 * FLOOD_DEPTH:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"the neighbour's {self.length}-byte flood never filled its queue")
            time.sleep(0.0001)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop[0] = 1
        self.thread.join(STREAM_TIMEOUT_NS / 1e9)
        if self.result is None or self.result < 0:
            raise RuntimeError(f"the neighbour's {self.length}-byte flood failed ({self.result})")


def _victim_round(victim: NativePair, writes: list[float], commands: list[float]) -> None:
    from vrdma.testing._loadgen import ffi as nffi
    from vrdma.testing._loadgen import lib as nlib

    samples = nffi.new("int64_t[]", VICTIM_WRITES)
    if nlib.nat_write_latency(victim.queue, victim.cq, victim.write(8), VICTIM_WRITES, samples, STREAM_TIMEOUT_NS,
                              1) != 0:
        raise RuntimeError("the victim's 8-byte WRITEs failed")
    writes += [samples[i] / 1000 for i in range(VICTIM_WARMUP, VICTIM_WRITES)]
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": CommandOpcode.QUERY_DEVICE}))
    size = abi.sizeof("vrdma_resp_query_device")
    for _ in range(VICTIM_COMMANDS):
        start = time.perf_counter_ns()
        victim.requester.command(request, size)
        commands.append((time.perf_counter_ns() - start) / 1000)


def _quantile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=1000, method="inclusive")[round(q * 1000) - 1]


@contextmanager
def simulated_vms(pairs: int = 2, engine_threads: int = 1, depth: int = FLOOD_DEPTH) -> Iterator[
        tuple[daemon_launcher.DaemonProcess, list[NativePair]]]:
    """One backend serving 2 x `pairs` simulated VMs, pair k being vm(2k+1) writing into vm(2k), with send queues
    of `depth` (pair 0 is the victim's, pair 1 the neighbour's)."""
    guests = [GuestIdentity(i) for i in range(2 * pairs)]
    options = ["--engine-threads", str(engine_threads)]
    with tempfile.TemporaryDirectory(prefix="vrdma-bench-") as tmp, \
            daemon_launcher.for_guests(Path(tmp), guests, options=options) as daemon, ExitStack() as stack:
        fes = [stack.enter_context(Frontend(str(socket_path(Path(tmp), g)), memory_size=64 * MIB)) for g in guests]
        yield daemon, [native_pair(Path(tmp), fes[2 * k], fes[2 * k + 1], (guests[2 * k].name, guests[2 * k + 1].name),
                                   depth) for k in range(pairs)]


def noisy_neighbour(rounds: int = ROUNDS) -> list[Metric]:
    writes: dict[str, list[float]] = {condition: [] for condition in FLOODS}
    commands: dict[str, list[float]] = {condition: [] for condition in FLOODS}
    moved: dict[str, list[float]] = {condition: [] for condition in FLOODS if FLOODS[condition]}
    with simulated_vms() as (_, (victim, neighbour)):
        for _ in range(rounds):
            for condition, length in FLOODS.items():
                if not length:
                    _victim_round(victim, writes[condition], commands[condition])
                    continue
                with Flood(neighbour, length) as flood:
                    _victim_round(victim, writes[condition], commands[condition])
                moved[condition].append((flood.result or 0) * length / flood.seconds / 1e9)
    results: list[Metric] = []
    for condition in FLOODS:
        name = f"neighbour_victim_write_{condition}"
        results += [Metric(f"{name}_p50_us", round(statistics.median(writes[condition]), 2), "us", COMMAND),
                    Metric(f"{name}_p99_us", round(_quantile(writes[condition], 0.99), 2), "us", COMMAND),
                    Metric(f"{name}_p999_us", round(_quantile(writes[condition], 0.999), 2), "us", COMMAND),
                    Metric(f"neighbour_victim_control_{condition}_p99_us",
                           round(_quantile(commands[condition], 0.99), 1), "us", COMMAND)]
    for condition, rates in moved.items():
        results.append(Metric(f"neighbour_{condition}_gbps", round(statistics.median(rates), 3), "GB/s", COMMAND))
    return results



def _qos(daemon: daemon_launcher.DaemonProcess, vm: str, **settings: object) -> None:
    reply = daemon_launcher.admin(daemon, {"command": "vm-qos", "name": vm, **settings})
    if not reply.get("ok"):
        raise RuntimeError(f"vm-qos {vm}: {reply.get('error')}")


def _floods(pairs: list[NativePair], length: int = MIB, batch_sleep_us: int = 0) -> list[float]:
    """Every pair floods `length`-byte WRITEs at once for SHARE_SECONDS: the WRITEs per second each moved."""
    with ExitStack() as stack:
        floods = [stack.enter_context(Flood(pair, length, batch_sleep_us)) for pair in pairs]
        time.sleep(SHARE_SECONDS)  # the measurement's length, not a wait for readiness
    return [(flood.result or 0) / flood.seconds for flood in floods]


def sharing() -> list[Metric]:
    """Weights and limits honoured: the byte ratio of two equal floods at weights 1:1 and 3:1, and one flood's rate
    under a byte limit against that limit."""
    results: list[Metric] = []
    with simulated_vms() as (daemon, (victim, neighbour)):
        first, second = GuestIdentity(1).name, GuestIdentity(3).name  # the requesters
        for weights in ((100, 100), (300, 100)):
            _qos(daemon, first, weight=weights[0])
            _qos(daemon, second, weight=weights[1])
            rates = _floods([victim, neighbour])  # (of WRITEs of one size: their ratio is the bytes')
            name = f"sharing_weight_{weights[0] // 100}to{weights[1] // 100}_ratio"
            results.append(Metric(name, round(rates[0] / rates[1], 3), "x", COMMAND))
        _qos(daemon, first, weight=100, **{"bytes-per-s": LIMIT_BYTES_PER_S, "bytes-burst": LIMIT_BURST})
        (rate,) = _floods([victim])
        results.append(Metric("sharing_limit_rate_ratio", round(rate * MIB / LIMIT_BYTES_PER_S, 3), "x", COMMAND))
    return results


def _engine_busy_ns(daemon: daemon_launcher.DaemonProcess) -> int:
    """The engine threads' time in passes that did work, all together (`vrdma admin counters`)."""
    threads = cast(list[dict[str, int]], daemon_launcher.admin(daemon, {"command": "counters"})["engine_threads"])
    return sum(t["busy_ns"] for t in threads)


def scaling(thread_counts: tuple[int, ...] = SCALING_THREADS) -> list[Metric]:
    """Independent floods at once, one pair of VMs per thread of the largest count (at least two pairs), served by
    each count of engine threads in turn: aggregate 1 MiB bandwidth and 8-byte WRITE rate, and each count's figure
    over one thread's."""
    if not thread_counts or thread_counts[0] != 1 or list(thread_counts) != sorted(set(thread_counts)):
        raise ValueError(f"scaling needs rising engine thread counts from 1, not {thread_counts}")
    pairs = max(2, thread_counts[-1])
    figures: dict[tuple[str, int], float] = {}
    busy: dict[tuple[str, int], float] = {}
    for threads in thread_counts:
        log.info("scaling: %d pairs of VMs flooding, %d engine thread(s)", pairs, threads)
        with simulated_vms(pairs, engine_threads=threads, depth=SCALING_DEPTH) as (daemon, floods):
            for size, length, scale in (("1mib", MIB, MIB / 1e9), ("8b", 8, 1e-6)):
                before, start = _engine_busy_ns(daemon), time.perf_counter()
                figures[size, threads] = sum(_floods(floods, length, SCALING_SLEEP_US[size])) * scale
                spent = (_engine_busy_ns(daemon) - before) / 1e9
                busy[size, threads] = 100 * spent / threads / (time.perf_counter() - start)
    command = COMMAND if pairs == 2 else f"{COMMAND} ({2 * pairs} VMs)"
    results: list[Metric] = []
    for size, unit, name in (("1mib", "GB/s", "gbps"), ("8b", "M/s", "mops")):
        for threads in thread_counts:
            results.append(Metric(f"scaling_{size}_{name}_{threads}_threads", round(figures[size, threads], 3),
                                  unit, command))
            # How busy the threads were (their passes that did work): whether the engine or the drivers bound it.
            results.append(Metric(f"scaling_{size}_engine_busy_{threads}_threads_pct",
                                  round(busy[size, threads], 1), "% of each thread", command))
        for threads in thread_counts[1:]:
            results.append(Metric(f"scaling_{size}_{threads}_threads_vs_1",
                                  round(figures[size, threads] / figures[size, 1], 3), "x", command))
    return results
