"""docs/performance.md's method table is the one vrdma.bench.methods generates from the benchmarks' constants: a
count the code changed and the page did not fails here (`python -m vrdma.bench.methods --write` brings it back)."""

from __future__ import annotations

import re

from vrdma.bench import backend, guests, methods


def test_the_documented_method_table_is_the_generated_one() -> None:
    assert methods.documented() == methods.section(), \
        "docs/performance.md's method table is stale: run `python -m vrdma.bench.methods --write`"


def test_the_table_quotes_the_constants_the_benchmarks_run_with() -> None:
    text = methods.table()
    for value in (backend.LATENCY_WRITES, backend.RATE_WRITES, backend.BW_WRITES, guests.BW_ITERATIONS["vrdma0"],
                  guests.UD_ITERATIONS["vrdma0"], guests.QP_CREATES):
        assert f"{value:,}" in text, value
    assert "backend_restart_to_usable_ms" in text
    assert len(re.findall(r"^\| ", text, flags=re.M)) == len(methods.rows()) + 2  # the header and its rule


def test_the_cli_default_is_the_documented_control_iterations() -> None:
    from vrdma import cli

    assert cli.build_parser().parse_args(["bench"]).iterations == methods.CONTROL_ITERATIONS
