"""The fuzzers' smoke run (`python -m fuzz.run --smoke`, about a minute): each interface fuzzed for a few
seconds from its corpus, none may find anything. `make fuzz` runs the same with the full budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.fuzz


@pytest.mark.timeout(600)
def test_every_fuzzer_runs_clean_for_a_few_seconds() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    result = subprocess.run([sys.executable, "-m", "fuzz.run", "--smoke"], cwd=ROOT, env=env, check=False,
                            capture_output=True, text=True, timeout=600)
    print(result.stdout)  # the table, in the test's captured output
    assert result.returncode == 0, f"a fuzzer found something (reproducers under fuzz/crashes/):\n{result.stdout}\n" \
                                   f"{result.stderr[-10000:]}"
    results = json.loads((ROOT / "build" / "fuzz" / "smoke-results.json").read_text())
    interfaces = {entry["interface"]: entry for entry in results["interfaces"]}
    assert set(interfaces) == {"engine", "engine-threads", "roce", "vhost-user", "commands", "state", "channel",
                               "campaign"}
    for name, entry in interfaces.items():
        assert entry["inputs"] > 0, f"{name} ran no inputs"
    # Each coverage-guided fuzzer starts by replaying its corpus, so a smoke reaches about the corpus's coverage. A
    # fuzzer whose harness broke (say, every fuzzed device refusing to open) still runs inputs, just not far: these
    # floors, some 10% under what the corpora reach today (engine 892, roce 994, vhost-user 123, commands 460, state
    # 286, channel 444), catch that.
    floors = {"engine": 800, "roce": 890, "vhost-user": 110, "commands": 410, "state": 250, "channel": 400}
    for name, floor in floors.items():
        edges = int(interfaces[name]["coverage"].split()[1])
        assert edges >= floor, f"{name} reached {edges} edges, the corpus alone reaches more than {floor}"


def test_the_campaign_notices_a_breach_a_crash_and_a_hang(tmp_path: Path) -> None:
    """The campaign's oracles, each made to fire once: the victim's protected memory written behind the backend's
    back, the backend stopped (a hang), the backend killed (a crash)."""
    import random
    import signal

    sys.path.insert(0, str(ROOT))
    from fuzz import campaign

    backend = campaign.Backend(tmp_path)
    try:
        victim = campaign.Victim(backend, random.Random(1))
        victim.timeout = 1.0
        peer = campaign.Peer(0, campaign.GID["vm0"])
        victim.check(backend, peer)
        victim.verbs.memory.write(victim.protected[1].addr + 100, b"x")
        with pytest.raises(campaign.CampaignFailure, match="isolation"):
            victim.check(backend, peer)
        victim.digest = victim.hash()
        backend.proc.send_signal(signal.SIGSTOP)
        with pytest.raises(campaign.CampaignFailure, match="hang"):
            victim.check(backend, peer)
        backend.proc.send_signal(signal.SIGKILL)
        with pytest.raises(campaign.CampaignFailure, match="crash"):
            victim.check(backend, peer)
    finally:
        backend.proc.kill()
        backend.proc.wait()


# The engine fuzzer's seeds (fuzz/engine/seeds.py) that move data between the two VMs, as the harness reports it.
MOVING_SEEDS = ("every-opcode", "scatter-gather", "srq", "memory-change", "moderation-and-arm", "two-level-list",
                "several-regions", "park", "cq-overflow", "migrate-mid-flight")


@pytest.mark.timeout(300)
def test_the_engine_fuzzers_seeds_move_data(tmp_path: Path) -> None:
    """The seed encoder and the harness read an operation's operands alike: a seed that drifted from the harness
    (as two did, unnoticed, until the VMs of every seed moved nothing) is caught here by its counters."""
    sys.path.insert(0, str(ROOT))
    from fuzz import build
    from fuzz.engine import seeds

    harness = build.fuzzer("engine")
    scenarios = seeds.scenarios()
    for name in MOVING_SEEDS:
        seed = tmp_path / name
        seed.write_bytes(scenarios[name]().bytes())
        result = subprocess.run([str(harness), str(seed)], env=dict(os.environ, ENGINE_FUZZ_VERBOSE="1"),
                                capture_output=True, check=False, timeout=60)
        report = result.stderr.decode(errors="replace")
        assert result.returncode == 0, f"seed {name}:\n{report[-4000:]}"
        cqes = [int(line.split(" cqes ")[1].split()[0]) for line in report.splitlines() if line.startswith("vm0: ")]
        assert cqes and cqes[-1] > 0, f"seed {name} completed nothing on vm0:\n{report[-4000:]}"
