"""`bc sim`'s summary and `--json` document, on hand-made results: what an operator reads after a run."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from bc.sim.checkers import InvariantResult
from bc.sim.report import all_ok, invariant_line, sim_time, summary, to_json

AT = 1_790_000_123_456  # a store-clock instant


@dataclass(frozen=True)
class Cfg:
    nodes: int = 100
    seed: int = 7
    chaos: str = "heavy"
    gateways: int = 1


@dataclass(frozen=True)
class Res:
    invariants: list[InvariantResult]
    digest: str = "ab" * 32
    events: int = 12_345
    faults: Counter[str] = field(default_factory=lambda: Counter({"partition": 3, "agent-crash": 5, "reset": 0}))
    work: Counter[str] = field(
        default_factory=lambda: Counter({"reservations": 40, "command.diag.nvml": 12, "jobs.reboot": 2})
    )
    link_faults: Counter[str] = field(default_factory=lambda: Counter({"dropped": 40, "duplicated": 2}))
    sim_seconds: float = 3600.0
    wall_seconds: float = 36.0
    repro: str = "bc sim --nodes 100 --chaos heavy --seed 7 --duration 1h"
    gateway_fences: int = 0
    traces: dict[str, list[str]] = field(default_factory=dict)


PASS = [
    InvariantResult("I1", "no overlapping bookings or bindings", True, None, None),
    InvariantResult("I2", "at most one execution per command", True, None, None),
]
FAILED = [
    PASS[0],
    InvariantResult(
        "I2",
        "at most one execution per command",
        False,
        "command c-1 ran twice on n003 (boot b1, then b2)",
        AT,
        ("n003", "c-1"),
    ),
]
TRACE = ["14:15:22.000 command.dispatched c-1 {}", "14:15:23.456 command.started c-1 {}"]


def test_a_passing_run_says_so_line_by_line() -> None:
    text = summary(Res(PASS), Cfg())
    lines = text.splitlines()
    assert lines[0] == (
        "bc sim: 100 nodes, chaos heavy, seed 7: 3,600 s simulated in 36.0 s wall (100x real time), 12,345 events"
    )
    assert "  pass  I1  no overlapping bookings or bindings" in lines
    assert "  pass  I2  at most one execution per command" in lines
    assert f"digest: {'ab' * 32}" in lines
    assert "result: every invariant holds" in lines
    assert lines[-1] == "reproduce: bc sim --nodes 100 --chaos heavy --seed 7 --duration 1h"
    # Work and faults by type, sorted; a type that never happened is left out.
    work = lines[lines.index("work:") + 1 : lines.index("faults:")]
    assert [w.split()[0] for w in work] == ["command.diag.nvml", "jobs.reboot", "reservations"]
    faults = lines[lines.index("faults:") + 1 : lines.index("links:")]
    assert [f.split() for f in faults] == [["agent-crash", "5"], ["partition", "3"]]
    links = lines[lines.index("links:") + 1 : lines.index("invariants:")]
    assert [f.split() for f in links] == [["dropped", "40"], ["duplicated", "2"]]


def test_a_failed_invariant_shows_its_counterexample_and_when() -> None:
    r = Res(FAILED)
    assert not all_ok(r)
    line = invariant_line(FAILED[1])
    assert line == (
        "  FAIL  I2  at most one execution per command: command c-1 ran twice on n003 (boot b1, then b2)"
        f" (at {sim_time(AT)}, simulated)"
    )
    assert sim_time(AT) == "2026-09-21 14:15:23.456Z"
    text = summary(r, Cfg())
    assert line in text.splitlines() and "result: an invariant FAILED" in text
    # A sentence that names its invariant itself is not prefixed twice.
    named = InvariantResult("I5", "no release because a node disconnected", False, "I5: res-1 was released", AT)
    assert invariant_line(named).startswith("  FAIL  I5  no release because a node disconnected: res-1 was released")


def test_a_failed_invariant_is_followed_by_the_last_events_touching_what_it_names() -> None:
    lines = summary(Res(FAILED, traces={"I2": TRACE}), Cfg()).splitlines()
    at = lines.index(invariant_line(FAILED[1]))
    assert lines[at + 1 : at + 4] == [
        "        the last events touching n003, c-1:",
        "          14:15:22.000 command.dispatched c-1 {}",
        "          14:15:23.456 command.started c-1 {}",
    ]
    assert to_json(Res(FAILED, traces={"I2": TRACE}), Cfg())["invariants"][1]["trace"] == TRACE


def test_no_faults_reads_none() -> None:
    text = summary(Res(PASS, faults=Counter(), link_faults=Counter()), Cfg(chaos="none"))
    assert "faults: none" in text.splitlines() and "links: none" in text.splitlines()


def test_the_json_document_carries_every_key_and_round_trips() -> None:
    doc = json.loads(json.dumps(to_json(Res(FAILED), Cfg())))
    assert {"digest", "invariants", "faults", "work", "seed", "nodes", "sim_seconds", "wall_seconds"} <= set(doc)
    assert doc["ok"] is False and doc["seed"] == 7 and doc["nodes"] == 100 and doc["chaos"] == "heavy"
    assert doc["invariants"][1] == {
        "id": "I2",
        "name": "at most one execution per command",
        "ok": False,
        "counterexample": "command c-1 ran twice on n003 (boot b1, then b2)",
        "at_ms": AT,
        "entities": ["n003", "c-1"],
        "trace": [],
    }
    assert doc["invariants"][0]["counterexample"] is None and doc["invariants"][0]["at_ms"] is None
    assert list(doc["faults"]) == ["agent-crash", "partition", "reset"]  # sorted, stable across runs
    assert doc["link_faults"] == {"dropped": 40, "duplicated": 2}
    assert doc["work"]["reservations"] == 40 and doc["sim_seconds"] == 3600.0


def test_several_gateways_are_named_with_their_fences() -> None:
    text = summary(Res(PASS, gateway_fences=4), Cfg(gateways=3))
    assert text.splitlines()[0].startswith("bc sim: 100 nodes, 3 gateways, chaos heavy, seed 7:")
    assert "gateways: 3, fenced themselves 4 times" in text.splitlines()
    doc = to_json(Res(PASS, gateway_fences=4), Cfg(gateways=3))
    assert doc["gateways"] == 3 and doc["gateway_fences"] == 4
    one = summary(Res(PASS), Cfg())
    assert "gateways" not in one and one.startswith("bc sim: 100 nodes, chaos heavy")
