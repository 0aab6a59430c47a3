"""`bc sim` as an operator runs it: the installed entry point in a subprocess.

A tiny run prints one JSON document on stdout (progress stays on stderr) and exits 0 when every
invariant holds; bad input is one sentence and exit 2 before anything runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BC = str(Path(sys.executable).parent / "bc")
KEYS = {"digest", "invariants", "faults", "work", "seed", "nodes", "sim_seconds", "wall_seconds", "repro", "ok"}


def bc(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BC, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_a_tiny_run_prints_its_json_and_exits_0(tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    out = bc(
        "sim", "--nodes", "3", "--chaos", "light", "--seed", "4", "--duration", "3m", "--json", "--trace", str(trace)
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # stdout is the document and nothing else
    assert set(doc) >= KEYS, doc
    assert doc["ok"] is True and doc["seed"] == 4 and doc["nodes"] == 3
    assert [i["id"] for i in doc["invariants"]] == ["I1", "I2", "I3", "I4", "I5", "I7", "I8", "Q1"]
    assert all(i["ok"] and i["counterexample"] is None for i in doc["invariants"]), doc["invariants"]
    assert doc["work"]["quorum.changes"] > 0, doc["work"]  # the workload ran: approvers were set up
    assert doc["repro"] == "bc sim --nodes 3 --chaos light --seed 4 --duration 3m"
    assert len(doc["digest"]) == 64
    # How often each invariant's dangerous situation happened (bc.sim.coverage), with too few flagged.
    assert [c["invariant"] for c in doc["coverage"]] == ["I1", "I2", "I3", "I3", "I4", "I5", "I7", "I8", "Q1"]
    assert all(c["few"] == (c["count"] < 10) for c in doc["coverage"]), doc["coverage"]
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(events) == doc["events"]
    assert out.stderr.startswith("bc sim: 3 nodes, chaos light, seed 4, 3m simulated")
    assert "Traceback" not in out.stderr


def test_a_broken_invariant_exits_10_with_the_counterexample_and_the_replay() -> None:
    # Liveness without grace marks a node unreachable the moment a session closes, and a node's first
    # session closes as it starts: I4 fails in any run, with or without chaos.
    rule = "unreachable-without-grace"
    out = bc("sim", "--nodes", "5", "--chaos", "none", "--seed", "1", "--duration", "3m", "--break", rule)
    assert out.returncode == 10, out.stderr
    fails = [line for line in out.stdout.splitlines() if line.startswith("  FAIL")]
    assert fails and fails[0].startswith("  FAIL  I4  no false liveness positives: "), out.stdout
    assert "marked unreachable" in fails[0] and fails[0].endswith(", simulated)")
    replay = f"bc sim --nodes 5 --chaos none --seed 1 --duration 3m --break {rule}"
    assert f"reproduce: {replay}" in out.stdout.splitlines()
    assert "result: an invariant FAILED" in out.stdout.splitlines()
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: 1 invariant(s) failed, first I4 (no false liveness positives); replay: {replay}"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--nodes", "0"), "--nodes must be between 1 and 100,000, not 0"),
        (("--nodes", "100001"), "--nodes must be between 1 and 100,000, not 100,001"),
        (("--chaos", "wild"), "unknown chaos level 'wild'; levels are none, light, heavy, storm"),
        (("--chaos", "storm"), "--chaos storm takes the shared store out: it needs --gateways 2 or more"),
        (("--break", "nothing"), "unknown --break rule 'nothing'; rules are "),
        (("--duration", "0"), "the --duration '0' must be longer than zero"),
        (("--duration", "soon"), "the --duration 'soon' is not a duration"),
        (("--gateways", "0"), "--gateways must be between 1 and 8, not 0"),
        (("--gateways", "9"), "--gateways must be between 1 and 8, not 9"),
        *(
            (("--break", rule), f"--break {rule} breaks the health reconciler, which acts only with --health")
            for rule in (
                "health-ignore-limits",
                "health-release-holds",
                "health-reset-under-hold",
                "health-forget-repeats",
            )
        ),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args: tuple[str, ...], says: str) -> None:
    out = bc("sim", *args, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: " + says), lines


def test_coverage_prints_each_invariants_count_and_flags_the_weak_ones() -> None:
    out = bc("sim", "--nodes", "3", "--chaos", "light", "--seed", "4", "--duration", "3m", "--coverage")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = lines.index("coverage (how often each invariant's dangerous situation happened):")
    rows = lines[at + 1 : at + 10]
    assert [r.split()[0] for r in rows] == ["I1", "I2", "I3", "I3", "I4", "I5", "I7", "I8", "Q1"]  # I3: two situations
    assert any("fewer than 10: a pass here is weak evidence" in r for r in rows)  # a 3-minute run is thin


def test_a_sweep_runs_each_seed_as_its_single_run_and_sums_them_up() -> None:
    shape = ("--nodes", "3", "--chaos", "light", "--duration", "2m")
    out = bc("sim", *shape, "--seeds", "1-3", "--parallel", "2", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [s["seed"] for s in doc["seeds"]] == [1, 2, 3]
    assert doc["ok"] == 3 and doc["harness_errors"] == 0 and doc["summary"][0] == "3 of 3 seeds held every invariant"
    one = json.loads(bc("sim", *shape, "--seed", "2", "--json").stdout)
    assert doc["seeds"][1]["digest"] == one["digest"]  # a seed in a sweep is that seed's run, byte for byte
    assert doc["seeds"][1]["repro"] == one["repro"]


def test_a_sweep_with_a_break_counts_the_seeds_that_caught_it_and_exits_10_on_a_miss() -> None:
    rule = "unreachable-without-grace"  # caught in any run (see the test above)
    out = bc("sim", "--nodes", "3", "--chaos", "none", "--duration", "2m", "--seeds", "1,2", "--break", rule)
    assert out.returncode == 0, out.stderr
    assert [line.split()[2] for line in out.stdout.splitlines()[:2]] == ["caught", "caught"]
    assert f"break {rule}: caught in 2 of 2 seeds" in out.stdout.splitlines()
    missed = bc("sim", "--nodes", "2", "--chaos", "none", "--duration", "1m", "--seeds", "1", "--break", "double-book")
    assert missed.returncode == 10, missed.stderr
    assert "break double-book: caught in 0 of 1 seeds" in missed.stdout.splitlines()
    assert "reproduce: bc sim --nodes 2 --chaos none --seed 1 --duration 1m --break double-book" in missed.stdout
    assert missed.stderr.strip().splitlines()[-1] == (
        "error: 1 of 1 seeds missed the break double-book; each one's replay is above"
    )
