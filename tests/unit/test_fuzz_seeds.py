"""The engine fuzzer's seed encoder (fuzz/engine/seeds.py) and its decoder (fuzz/engine/engine_fuzz.c) agree on
the operations: an input's operation byte is `op + OP_COUNT * device`, which the harness decodes modulo the length
of its ops[] table, so one operation added on one side alone shifts every second-device operation of every seed."""

from __future__ import annotations

import re
from pathlib import Path

from fuzz.engine import seeds

HARNESS = Path(__file__).resolve().parents[2] / "fuzz" / "engine" / "engine_fuzz.c"


def test_the_seed_encoder_counts_the_harness_operations() -> None:
    table = re.search(r"static const op_fn ops\[\] = \{(.*?)\};", HARNESS.read_text(), flags=re.S)
    assert table is not None
    ops = [name.strip() for name in table.group(1).split(",") if name.strip()]
    assert len(ops) == seeds.OP_COUNT, ops
    assert ops[seeds.GID_SET] == "op_gid_set" and ops[seeds.ROCE] == "op_roce"
