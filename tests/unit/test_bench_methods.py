"""docs/performance.md's method table is the one vrdma.bench.methods generates from the benchmarks' constants: a
count the code changed and the page did not fails here (`python -m vrdma.bench.methods --write` brings it back)."""

from __future__ import annotations

import re

from vrdma.bench import backend, guests, methods, neighbours


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


def test_the_cli_names_the_benchmarks_the_bench_runs() -> None:
    import argparse

    import pytest

    from vrdma import bench, cli

    assert cli.BENCH_GROUPS == bench.GROUPS
    parser = cli.build_parser()
    args = parser.parse_args(["bench", "--only", "scaling,neighbour", "--scaling-threads", "1,2,4"])
    assert (args.only, args.scaling_threads) == (("scaling", "neighbour"), (1, 2, 4))
    assert parser.parse_args(["bench"]).scaling_threads == neighbours.SCALING_THREADS
    for bad in (["--only", "scaling,nope"], ["--scaling-threads", "2,4"], ["--scaling-threads", "1,4,2"],
                ["--scaling-threads", "1,x"]):
        with pytest.raises(argparse.ArgumentTypeError):
            {"--only": cli._bench_groups, "--scaling-threads": cli._thread_counts}[bad[0]](bad[1])
