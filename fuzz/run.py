"""Run every fuzzer for a budget and print what each did: `make fuzz` (default budget) and the smoke `make test` runs.

Interfaces, one fuzzer each (fuzz/README.md):

  engine      the data engine's rings, WQEs, page lists, doorbells   libFuzzer + ASan + UBSan (fuzz/engine/)
  engine-threads  the same, the engine in its own thread beside its caller  libFuzzer + TSan (fuzz/engine/)
  roce        the RoCE transport's state between two hosts           libFuzzer + ASan + UBSan (fuzz/roce/)
  vhost-user  vhost-user framing and validation                      atheris (fuzz/vhost_user_fuzz.py)
  commands    the control-command decoder                            atheris (fuzz/commands_fuzz.py)
  state       the device-state loader (migration, upgrade)           atheris (fuzz/state_fuzz.py)
  channel     the container channel: a hostile host process          atheris (fuzz/channel_fuzz.py)
  campaign    a real `vrdma backend`, attacker VM against victim VM  black box (fuzz/campaign/)

The default budget gives each interface at least --inputs inputs (1,000,000): an input is one libFuzzer execution
for the engine and roce (a whole scenario) and vhost-user (a whole stream), one command for the command decoder
(an execution holds a sequence of them), one message for the container channel (an execution is one process's
connection), one message, command or work request for the campaign. An interface
that stops short of its inputs (its time cap ran out first) is a failure. --smoke runs each for
a few seconds instead (about a minute in all). Each fuzzer's libFuzzer log is in build/fuzz/<interface>.log; new
corpus entries go to build/fuzz/corpus/<interface>/ (the repository's fuzz/corpus/ seeds them; --merge adds what
is new to it); crashes, hangs and leaks are saved under fuzz/crashes/<interface>/ and replayed by
tests/backend/test_fuzz_regressions.py. The table is also written to build/fuzz/results.json
(build/fuzz/smoke-results.json for --smoke). Exit status 1 if any interface found anything or fell short.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fuzz import build
from fuzz.atheris_main import read_stats

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "fuzz"
CORPUS = ROOT / "fuzz" / "corpus"
CRASHES = ROOT / "fuzz" / "crashes"
DEFAULT_INPUTS = 1_000_000
# Seconds an interface may take in a default run, whatever its rate (measured on the project's 2-core machines,
# 2026-11-27, a slow instance: engine 18 min, engine-threads 61 (TSan), roce about 85, vhost-user 6, commands 4,
# campaign 4 for 1,000,000 inputs); one that runs out of it short of its inputs fails the run.
TIME_CAP = {"engine": 1800, "engine-threads": 5400, "roce": 5400, "vhost-user": 1800, "commands": 1800,
            "state": 3600, "channel": 1800, "campaign": 1800}
SMOKE_SECONDS = {"engine": 12, "engine-threads": 6, "roce": 6, "vhost-user": 8, "commands": 8, "state": 6,
                 "channel": 6, "campaign": 18}
ARTIFACT = re.compile(r"Test unit written to (\S+)")
COVERAGE = re.compile(r"cov: (\d+) ft: (\d+)")


@dataclass
class Outcome:
    interface: str
    unit: str
    inputs: int = 0
    execs: int = 0
    seconds: float = 0.0
    coverage: str = "n/a"
    crashes: int = 0
    hangs: int = 0
    leaks: int = 0
    artifacts: list[str] = field(default_factory=list)
    notes: str = ""
    short: bool = False        # a default run that stopped short of its inputs (its time cap ran out)

    @property
    def rate(self) -> float:
        return self.inputs / self.seconds if self.seconds else 0.0

    @property
    def found(self) -> int:
        return self.crashes + self.hangs + self.leaks


@dataclass(frozen=True)
class Target:
    """A libFuzzer-driven fuzzer (native or atheris)."""

    interface: str
    corpus: str                # directory name under fuzz/corpus/, build/fuzz/corpus/, fuzz/crashes/
    unit: str
    command: tuple[str, ...]
    inputs_from_stats: bool    # inputs are counted by the fuzzer (commands), not libFuzzer's executions
    timeout: int               # seconds one input may take before it is a hang
    max_len: int = 4096        # the largest input libFuzzer makes (a device state with its doorbell pages: more)


TARGETS = {
    "engine": Target("engine", "engine", "scenarios", (str(build.OUT),), False, 10),
    # the engine's corpus (fuzz/corpus/engine_threads links to it); findings of its own
    "engine-threads": Target("engine-threads", "engine_threads", "scenarios",
                             (str(build.OUT.with_name("engine_threads_fuzz")),), False, 10),
    "roce": Target("roce", "roce", "scenarios", (str(build.ROCE_OUT),), False, 10),
    "vhost-user": Target("vhost-user", "vhost_user", "streams", (sys.executable, "-m", "fuzz.vhost_user_fuzz"),
                         False, 20),
    "commands": Target("commands", "commands", "commands", (sys.executable, "-m", "fuzz.commands_fuzz"), True, 20),
    "state": Target("state", "state", "states", (sys.executable, "-m", "fuzz.state_fuzz"), False, 20, 32768),
    "channel": Target("channel", "channel", "messages", (sys.executable, "-m", "fuzz.channel_fuzz"), True, 20),
}


def _libfuzzer(target: Target, runs: int | None, seconds: int, log: Path) -> Outcome:
    """One libFuzzer run; findings are parsed from its output and its artifacts."""
    work = OUT / "corpus" / target.corpus
    seeds = CORPUS / target.corpus
    artifacts = CRASHES / target.corpus
    for directory in (work, seeds, artifacts):
        directory.mkdir(parents=True, exist_ok=True)
    stats = OUT / f"{target.corpus}.stats"
    stats.unlink(missing_ok=True)
    options = [f"-max_total_time={seconds}", f"-timeout={target.timeout}", "-rss_limit_mb=4096",
               "-print_final_stats=1", f"-artifact_prefix={artifacts}/", f"-max_len={target.max_len}"]
    if runs is not None:
        options.append(f"-runs={runs}")
    env = dict(os.environ, VRDMA_FUZZ_STATS=str(stats), PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    start = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n### {' '.join([*target.command, *options])}\n")
        out.flush()
        status = subprocess.run([*target.command, *options, str(work), str(seeds)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    elapsed = time.monotonic() - start
    text = log.read_text(errors="replace").rsplit("\n### ", 1)[-1]
    outcome = Outcome(target.interface, target.unit, seconds=elapsed)
    executed = re.findall(r"stat::number_of_executed_units: (\d+)", text)
    outcome.execs = int(executed[-1]) if executed else _last_exec_count(text)
    outcome.inputs = outcome.execs
    if target.inputs_from_stats:
        counted = read_stats(str(stats))
        outcome.inputs = counted[1] if counted else 0
    coverage = COVERAGE.findall(text)
    if coverage:
        outcome.coverage = f"cov {coverage[-1][0]} ft {coverage[-1][1]}"
    for match in ARTIFACT.finditer(text):
        path = match.group(1)
        name = Path(path).name
        if path in outcome.artifacts:
            continue
        outcome.artifacts.append(path)
        if name.startswith("timeout-") or name.startswith("slow-unit-"):
            outcome.hangs += 1
        elif name.startswith("leak-") or "FdLeak" in text or "LeakSanitizer" in text:
            outcome.leaks += 1
        else:
            outcome.crashes += 1
    if status != 0 and not outcome.found:
        outcome.crashes += 1
        outcome.notes = f"the fuzzer exited with status {status}: see {log.relative_to(ROOT)}"
    return outcome


def _last_exec_count(text: str) -> int:
    counts = re.findall(r"^#(\d+)\s", text, flags=re.M)
    return int(counts[-1]) if counts else 0


def run_target(target: Target, inputs: int | None, seconds: int) -> Outcome:
    """Until ``inputs`` inputs (more rounds for fuzzers whose executions hold several) or ``seconds`` passed."""
    log = OUT / f"{target.corpus}.log"
    log.write_text("")
    if inputs is None:
        return _libfuzzer(target, None, seconds, log)
    total = Outcome(target.interface, target.unit)
    per_exec = 1.0 if not target.inputs_from_stats else 10.0   # a first guess, corrected after each round
    while total.inputs < inputs and total.seconds < seconds and not total.found:
        # Executions are exact; inputs counted by the fuzzer vary per execution: aim a little past the target.
        margin = 1.05 if target.inputs_from_stats else 1.0
        runs = max(1000, math.ceil((inputs - total.inputs) / per_exec * margin))
        part = _libfuzzer(target, runs, max(1, int(seconds - total.seconds)), log)
        total.inputs += part.inputs
        total.execs += part.execs
        total.seconds += part.seconds
        total.coverage = part.coverage
        total.crashes, total.hangs, total.leaks = part.crashes, part.hangs, part.leaks
        total.artifacts += part.artifacts
        total.notes = part.notes
        if part.execs == 0:
            break
        per_exec = max(1.0, total.inputs / total.execs)
    return total


def run_campaign(inputs: int | None, seconds: int, sanitized: bool) -> Outcome:
    log = OUT / "campaign.log"
    result_file = OUT / "campaign.json"
    result_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "fuzz.campaign", "--inputs", str(inputs or 1 << 62), "--seconds", str(seconds),
               "--json", str(result_file), *(["--sanitize"] if sanitized else [])]
    start = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    outcome = Outcome("campaign", "msgs+cmds+WQEs", seconds=time.monotonic() - start)
    if not result_file.exists():
        outcome.crashes = 1
        outcome.notes = f"the campaign did not finish (status {status}): see {log.relative_to(ROOT)}"
        return outcome
    result = json.loads(result_file.read_text())
    outcome.inputs = result["inputs"]
    outcome.execs = result["batches"]
    outcome.seconds = result["seconds"]
    outcome.crashes = result["crashes"] + result["isolation"]
    outcome.hangs = result["hangs"]
    outcome.leaks = result["leaks"]
    if result["reproducer"]:
        outcome.artifacts.append(result["reproducer"])
    outcome.notes = (f"{result['messages']} messages, {result['commands']} commands, {result['wqes']} WQEs "
                     f"({result['executed']} executed), {result['connections']} attacker connections, "
                     f"seed {result['seed']}{', sanitized backend' if sanitized else ''}; fds +{result['max_fds_over']}"
                     f" max, RSS +{result['max_rss_over'] >> 20} MiB max"
                     + (f"; FAILED: {result['failure']}" if result["failure"] else ""))
    return outcome


def table(outcomes: list[Outcome]) -> str:
    header = ("interface", "inputs", "unit", "inputs/s", "execs", "coverage", "crashes", "hangs", "leaks")
    rows = [header] + [(o.interface, f"{o.inputs:,}", o.unit, f"{o.rate:,.0f}", f"{o.execs:,}", o.coverage,
                        str(o.crashes), str(o.hangs), str(o.leaks)) for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if i in (0, 2, 5) else cell.rjust(width)
                       for i, (cell, width) in enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    for o in outcomes:
        if o.notes:
            lines.append(f"{o.interface}: {o.notes}")
        for artifact in o.artifacts:
            lines.append(f"{o.interface}: reproducer {artifact}")
    return "\n".join(lines)


def _launcher(target: Target) -> list[str]:
    """The fuzzer as one executable: libFuzzer's merge starts its own argv[0] again, and an atheris fuzzer's
    argv[0] is a module file, not something to execute: so a script that runs the module is written for it."""
    if not target.command[0].startswith(sys.executable):
        return list(target.command)
    script = OUT / f"{target.corpus}_fuzz"
    script.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_module({target.command[-1]!r}, "
                      f"run_name='__main__')\n")
    script.chmod(0o755)
    return [str(script)]


def merge(chosen: list[str]) -> None:
    """Rebuild the repository's corpora of the `chosen` interfaces: the hand-written seeds, then the fewest inputs
    from the corpus and the working corpus that add edges they do not cover (libFuzzer -merge=1, counting edges,
    not hit counts, so that the corpus stays small; the working corpus keeps the rest). A corpus that is a link to
    another's (engine-threads reads the engine's) is that one's to merge."""
    for name, target in TARGETS.items():
        corpus, work = CORPUS / target.corpus, OUT / "corpus" / target.corpus
        if name not in chosen or corpus.is_symlink():
            continue
        fresh = OUT / "merge" / target.corpus
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        for seed in corpus.glob("seed-*"):
            shutil.copy(seed, fresh / seed.name)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        sources = [str(d) for d in (corpus, work) if d.is_dir()]
        with (OUT / f"{target.corpus}.merge.log").open("w") as log:
            subprocess.run([*_launcher(target), "-merge=1", "-use_counters=0", str(fresh), *sources], cwd=ROOT,
                           env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
        shutil.rmtree(corpus)
        shutil.copytree(fresh, corpus)
        print(f"{target.interface}: {len(list(corpus.iterdir()))} inputs in {corpus.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds per interface (what `make test` runs)")
    parser.add_argument("--inputs", type=int, default=DEFAULT_INPUTS, help="inputs per interface (default 1000000)")
    parser.add_argument("--only", default=",".join([*TARGETS, "campaign"]),
                        help="comma-separated interfaces (default: all eight)")
    parser.add_argument("--plain-campaign", action="store_true",
                        help="run the campaign's backend without the sanitizer build")
    parser.add_argument("--merge", action="store_true",
                        help="merge the working corpora (of --only's interfaces) into fuzz/corpus/ and exit")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(chosen) - {*TARGETS, "campaign"}
    if unknown:
        parser.error(f"unknown interface(s): {', '.join(sorted(unknown))}")
    if args.merge:
        merge(chosen)
        return 0
    for native in ("engine", "engine-threads", "roce"):
        if native in chosen:
            build.fuzzer(native.replace("-", "_"))
    sanitized = not args.plain_campaign
    if "campaign" in chosen and sanitized:
        from fuzz import sanitize

        sanitize.build()
    outcomes = []
    for name in chosen:
        seconds = SMOKE_SECONDS[name] if args.smoke else TIME_CAP[name]
        inputs = None if args.smoke else args.inputs
        budget = f"{seconds} s" if args.smoke else f"{args.inputs:,} inputs"
        print(f"[fuzz] {name}: {budget} ...", flush=True)
        if name == "campaign":
            outcome = run_campaign(inputs, seconds, sanitized)
        else:
            outcome = run_target(TARGETS[name], inputs, seconds)
        if not args.smoke and outcome.inputs < args.inputs and not outcome.found:
            outcome.short = True
            outcome.notes = (f"{outcome.notes}; " if outcome.notes else "") + \
                f"SHORT: {outcome.inputs:,} of {args.inputs:,} inputs when its {seconds} s ran out"
        print(f"[fuzz] {name}: {outcome.inputs:,} inputs in {outcome.seconds:.0f} s, "
              f"{outcome.found} finding(s)", flush=True)
        outcomes.append(outcome)
    report = table(outcomes)
    print(report)
    # The smoke's table goes beside the last full run's, not over it.
    (OUT / ("smoke-results.json" if args.smoke else "results.json")).write_text(json.dumps({
        "mode": "smoke" if args.smoke else "default", "budget_inputs": None if args.smoke else args.inputs,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "interfaces": [asdict(o) | {"inputs_per_second": round(o.rate, 1)} for o in outcomes],
    }, indent=1))
    return 1 if any(o.found or o.short for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
