"""`bench.fleet_rows` judges each of issue 38's figures against its goal, in the direction the goal runs."""

from __future__ import annotations

from typing import Any

from bench.fleet_rows import Figure, parser, throughput_figures


def result(store: str, nodes: int, per_s: float, serve: float, agents: float, gateways: int = 1) -> dict[str, Any]:
    return {
        "store": store,
        "nodes": nodes,
        "gateways": gateways,
        "commands_per_s": per_s,
        "cpu_ms_per_command": {
            "serve": serve,
            "serve_net_of_idle": serve - 0.1,
            "agents": agents,
            "agents_net_of_idle": agents,
        },
    }


def test_a_time_goal_is_met_at_or_below_it_and_a_ratio_goal_at_or_above_it() -> None:
    assert Figure("t", 0.5, "s", 0.5, True, "cmd", "cores=2").met
    assert not Figure("t", 0.51, "s", 0.5, True, "cmd", "cores=2").met
    assert Figure("r", 0.8, "×", 0.8, False, "cmd", "cores=2").met
    assert not Figure("r", 0.79, "×", 0.8, False, "cmd", "cores=2").met
    line = Figure("t", 0.61, "s", 0.5, True, "python -m x", "cores=2 load1=1.00 run_queue=1").line()
    assert "MISSED" in line and "python -m x" in line and "cores=2" in line


def test_throughput_rows_compare_postgres_with_sqlite_at_the_same_node_count() -> None:
    results = [
        result("sqlite", 1, 100.0, 9.0, 2.0),
        result("sqlite", 100, 400.0, 1.5, 0.9),
        result("postgres", 100, 300.0, 2.0, 1.0, gateways=3),
    ]
    figures = throughput_figures(results, "python -m bench.throughput", "cores=2")
    rows = {f.row: f for f in figures}
    assert [f.met for f in figures if f.row.startswith("server CPU")] == [False, False]
    assert rows["agent CPU per command, 100 nodes, SQLite, one gateway"].met
    ratio = rows["PostgreSQL with 3 gateways ÷ SQLite's one gateway, 100 nodes"]
    assert ratio.value == 0.75 and not ratio.met


def test_an_unknown_part_is_refused_in_one_sentence() -> None:
    import asyncio

    import pytest

    from bench.fleet_rows import run

    with pytest.raises(SystemExit, match="no part nodez"):
        asyncio.run(run(parser().parse_args(["--only", "nodez"])))
