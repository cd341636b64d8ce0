"""Every input a fuzzer ever found (fuzz/crashes/<interface>/) replayed through its fuzzer: each must pass now.

A finding becomes a file there (libFuzzer and atheris write crash-, leak- and timeout- files; the campaign a
directory with its seed); once its cause is fixed it stays, under a name that says what it was, as this test.
A finding that is known and not fixed yet is listed in fuzz/crashes/KNOWN (one path a line, with the reason):
it is expected to fail until it is fixed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRASHES = ROOT / "fuzz" / "crashes"
FUZZERS = {"engine": None, "engine_threads": None, "roce": None, "vhost_user": "fuzz.vhost_user_fuzz",
           "commands": "fuzz.commands_fuzz", "state": "fuzz.state_fuzz", "channel": "fuzz.channel_fuzz"}

pytestmark = pytest.mark.fuzz


def _known() -> dict[str, str]:
    known = CRASHES / "KNOWN"
    if not known.exists():
        return {}
    entries = (line.split(None, 1) for line in known.read_text().splitlines() if line and not line.startswith("#"))
    return {path: (rest[0] if rest else "") for path, *rest in entries}


def _findings() -> list[object]:
    known = _known()
    params: list[object] = []
    for interface in FUZZERS:
        for path in sorted((CRASHES / interface).glob("*")) if (CRASHES / interface).is_dir() else []:
            name = f"{interface}/{path.name}"
            marks = [pytest.mark.xfail(reason=known[name], strict=True)] if name in known else []
            params.append(pytest.param(interface, path, id=name, marks=marks))
    return params


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.mark.parametrize(("interface", "path"), _findings())
def test_finding_replays_clean(interface: str, path: Path) -> None:
    if FUZZERS[interface] is None:  # a native harness (fuzz/build.py)
        sys.path.insert(0, str(ROOT))
        from fuzz import build

        command = [str(build.fuzzer(interface))]
    else:
        command = [sys.executable, "-m", str(FUZZERS[interface])]
    # Given files (not directories), libFuzzer runs each once and exits: status 0 when none fails.
    result = subprocess.run([*command, str(path)], cwd=ROOT, env=_env(), check=False, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"{path} fails again:\n{result.stdout[-5000:]}\n{result.stderr[-20000:]}"


def _campaign_findings() -> list[object]:
    found = sorted((CRASHES / "campaign").glob("*/reproducer.json")) if (CRASHES / "campaign").is_dir() else []
    return [pytest.param(path, id=path.parent.name) for path in found] or [
        pytest.param(None, id="none", marks=pytest.mark.skip(reason="the campaign has found nothing so far"))]


@pytest.mark.parametrize("reproducer", _campaign_findings())
def test_campaign_finding_replays_clean(reproducer: Path) -> None:
    """The campaign's choices are its seed's: the same seed up to the batch that failed makes them again."""
    found = json.loads(reproducer.read_text())
    command = [sys.executable, "-m", "fuzz.campaign", "--seed", str(found["seed"]), "--batches", str(found["batch"]),
               *(["--sanitize"] if found.get("sanitized") else [])]
    result = subprocess.run(command, cwd=ROOT, env=_env(), check=False, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"{reproducer.parent} fails again:\n{result.stdout[-5000:]}{result.stderr[-5000:]}"
