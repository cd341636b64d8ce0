"""The campaign's loop, its checks between batches, its result and reproducers, and its command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz import sanitize
from fuzz.campaign.attacker import Attacker, Counts
from fuzz.campaign.common import (
    CRASH_DIR,
    DEFAULT_ENGINE_THREADS,
    FD_SLACK,
    GID,
    RSS_SLACK,
    RSS_SLACK_SANITIZED,
    VICTIM_TIMEOUT,
    WARMUP_BATCHES,
    CampaignFailure,
    Peer,
)
from fuzz.campaign.process import Backend
from fuzz.campaign.victim import Victim
from vrdma.testing.frontend import FrontendError

# -- the campaign ---------------------------------------------------------------------------------------------------

@dataclass
class Result:
    inputs: int
    messages: int
    commands: int
    wqes: int
    connections: int
    batches: int
    seconds: float
    crashes: int
    hangs: int
    leaks: int
    isolation: int
    executed: int
    flushed: int
    max_fds_over: int
    max_rss_over: int
    reproducer: str | None = None
    failure: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def run(inputs: int, seconds: float, seed: int, sanitized: bool = False, *, batches: int | None = None,
        work_dir: Path | None = None, crash_dir: Path = CRASH_DIR, log: Any = sys.stderr,
        engine_threads: int = DEFAULT_ENGINE_THREADS) -> Result:
    """Run batches until ``inputs`` inputs were sent, ``seconds`` passed or ``batches`` ran, whichever first."""
    rng = random.Random(seed)
    counts = Counts()
    own_dir = work_dir is None
    directory = Path(tempfile.mkdtemp(prefix="vrdma-campaign-")) if work_dir is None else work_dir
    directory.mkdir(parents=True, exist_ok=True)
    backend = Backend(directory, sanitized=sanitized, engine_threads=engine_threads)
    failure: CampaignFailure | None = None
    fd_base = rss_base = 0
    fds_over = rss_over = 0
    start = time.monotonic()
    victim: Victim | None = None
    attacker: Attacker | None = None
    last_report = start
    try:
        victim = Victim(backend, rng)
        attacker = Attacker(backend, victim, rng, counts)
        while counts.inputs < inputs and time.monotonic() - start < seconds and \
                (batches is None or counts.batches < batches):
            counts.batches += 1
            try:
                with counts.timed("connect"):
                    s = attacker.ensure()
                with counts.timed("wqes"):
                    attacker.work_requests(s)
                if rng.randrange(2):
                    with counts.timed("commands"):
                        attacker.commands(s)
                if rng.randrange(3) == 0:
                    with counts.timed("messages"):
                        attacker.sample_engine()  # a message may end the connection, and its counts with it
                        attacker.messages(s)
            except (FrontendError, OSError, ValueError) as err:
                # The attacker's own connection broke under it (a closed socket, a stalled queue): QEMU would
                # connect again, and so does it. What matters is the victim's view, checked next.
                attacker.record.append({"attacker error": str(err)})
                if attacker.state is not None:
                    attacker.state.broken = True
            with counts.timed("checks"):
                victim.check(backend, Peer(attacker.state.qps[0][0].qpn if attacker.state else 0, GID["vm0"]))
            if counts.batches == WARMUP_BATCHES:
                fd_base, rss_base = backend.open_fds(), backend.rss()
            elif counts.batches > WARMUP_BATCHES:
                fds_over = max(fds_over, backend.open_fds() - fd_base)
                rss_over = max(rss_over, backend.rss() - rss_base)
                if fds_over > FD_SLACK:
                    raise CampaignFailure("leak", f"the backend holds {fds_over} more fds than after warm-up")
                if rss_over > (RSS_SLACK_SANITIZED if sanitized else RSS_SLACK):
                    raise CampaignFailure("leak", f"the backend's RSS grew {rss_over >> 20} MiB over warm-up")
            if attacker.state is not None and attacker.state.broken:
                with counts.timed("disconnect"):
                    attacker.disconnect()
                    _wait_closed(backend, counts.connections)
            now = time.monotonic()
            if now - last_report >= 10:
                last_report = now
                print(f"campaign: {counts.inputs} inputs ({counts.wqes} WQEs, {counts.commands} commands, "
                      f"{counts.messages} messages), {counts.connections} attacker connections, "
                      f"{counts.inputs / (now - start):.0f}/s; seconds in "
                      + ", ".join(f"{k} {v:.1f}" for k, v in counts.seconds.items()), file=log, flush=True)
    except CampaignFailure as err:
        failure = err
    finally:
        if attacker is not None:
            attacker.disconnect()
        if victim is not None:
            with contextlib.suppress(Exception):
                victim.close()
        status = backend.stop()
        if failure is None and status != 0:
            failure = CampaignFailure("crash", f"the backend exited with status {status} when stopped")
        if failure is None and sanitize.report_in(backend.log_text()):
            failure = CampaignFailure("crash", "a sanitizer report in the backend log")
    elapsed = time.monotonic() - start
    reproducer = None
    if failure is not None:
        reproducer = str(_save_reproducer(crash_dir, failure, seed, counts, attacker, backend, sanitized,
                                          engine_threads))
        print(f"campaign: FAILED ({failure}); reproducer in {reproducer}", file=log, flush=True)
    if own_dir and failure is None:
        shutil.rmtree(directory, ignore_errors=True)
    kind = failure.kind if failure else ""
    return Result(counts.inputs, counts.messages, counts.commands, counts.wqes, counts.connections, counts.batches,
                  elapsed, crashes=int(kind == "crash"), hangs=int(kind == "hang"), leaks=int(kind == "leak"),
                  isolation=int(kind == "isolation"), executed=counts.executed, flushed=counts.flushed,
                  max_fds_over=fds_over, max_rss_over=rss_over,
                  reproducer=reproducer, failure=str(failure) if failure else None)


def _wait_closed(backend: Backend, connections: int, timeout: float = VICTIM_TIMEOUT) -> None:
    """The backend has let go of all ``connections`` the attacker made, and freed everything they owned."""
    deadline = time.monotonic() + timeout
    while True:
        if not backend.alive():
            raise CampaignFailure("crash", f"the backend exited with status {backend.proc.poll()}")
        counters = backend.counters("vm0")
        if counters["connection"]["closed"] >= connections:
            leftover = {kind: n for kind, n in counters["objects"].items() if n and kind != "gid"}
            if leftover:
                raise CampaignFailure("leak", f"the attacker's closed connection left objects: {leftover}")
            return
        if time.monotonic() > deadline:
            raise CampaignFailure("hang", "the backend did not close the attacker's connection")
        time.sleep(0.002)  # the close happens in the backend's event loop: poll its counter until the deadline


def _save_reproducer(crash_dir: Path, failure: CampaignFailure, seed: int, counts: Counts,
                     attacker: Attacker | None, backend: Backend, sanitized: bool, engine_threads: int) -> Path:
    directory = crash_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{failure.kind}-seed{seed}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "reproducer.json").write_text(json.dumps({
        "failure": str(failure), "kind": failure.kind, "seed": seed, "batch": counts.batches,
        "inputs_before": counts.inputs, "sanitized": sanitized, "engine_threads": engine_threads,
        "replay": f"python -m fuzz.campaign --seed {seed} --batches {counts.batches}"
                  f" --engine-threads {engine_threads}{' --sanitize' if sanitized else ''}",
        "attacker_since_last_connection": attacker.record if attacker else [],
    }, indent=1))
    with contextlib.suppress(OSError):
        shutil.copy(backend.log, directory / "backend.log")
    return directory


def main(argv: list[str] | None = None) -> int:
    package_doc = sys.modules["fuzz.campaign"].__doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m fuzz.campaign", description=package_doc.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="stop after this many inputs (default 100000)")
    parser.add_argument("--seconds", type=float, default=3600, help="... or after this long")
    parser.add_argument("--batches", type=int, help="stop after this many batches (to replay a reproducer)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    parser.add_argument("--sanitize", action="store_true", help="run the backend with the ASan/UBSan build")
    parser.add_argument("--engine-threads", type=int, default=DEFAULT_ENGINE_THREADS, choices=range(1, 9),
                        metavar="N", help=f"the backend's engine threads (default {DEFAULT_ENGINE_THREADS}: the "
                        "attacker and the victim each on one)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % (1 << 31)
    if args.sanitize:
        sanitize.build()
    # A replay (--batches) runs the same seed's choices up to the batch that failed, whatever the input count.
    inputs = args.inputs if args.batches is None else 1 << 62
    result = run(inputs, args.seconds, seed, args.sanitize, batches=args.batches, engine_threads=args.engine_threads)
    print(json.dumps({"seed": seed, **result.as_dict()}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"seed": seed, **result.as_dict()}, indent=1))
    return 1 if result.failure else 0


if __name__ == "__main__":
    sys.exit(main())
