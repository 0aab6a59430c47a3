"""The sweep's pure parts (which seeds, one line per seed, the summary) and its process pool."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import UsageError
from bc.sim.sweep import SeedOutcome, line, parse_seeds, summary, sweep


def test_seeds_are_ranges_and_lists_each_once_in_order() -> None:
    assert parse_seeds("1-5") == [1, 2, 3, 4, 5]
    assert parse_seeds("7") == [7]
    assert parse_seeds("1,3,7-9,3") == [1, 3, 7, 8, 9]


@pytest.mark.parametrize("spec", ["", "x", "5-1", "-3", "1-", "1,,2", "1-100000"])
def test_bad_seeds_are_one_sentence(spec: str) -> None:
    with pytest.raises(UsageError, match="--seeds"):
        parse_seeds(spec)


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 20)), min_size=1, max_size=6))
def test_every_named_seed_is_swept_once(ranges: list[tuple[int, int]]) -> None:
    spec = ",".join(f"{lo}-{lo + n}" for lo, n in ranges)
    named = {s for lo, n in ranges for s in range(lo, lo + n + 1)}
    seeds = parse_seeds(spec)
    assert set(seeds) == named and len(seeds) == len(named)


def ok(seed: int) -> SeedOutcome:
    return SeedOutcome(seed=seed, repro=f"bc sim --seed {seed}", digest="ab" * 32, wall_seconds=1.5)


def test_the_summary_names_each_failure_and_how_to_replay_it() -> None:
    bad = SeedOutcome(seed=4, repro="bc sim --seed 4", failed=("I2", "I8"), first_failure="c-1 ran twice")
    broken = SeedOutcome(seed=9, repro="bc sim --seed 9", harness_error="RuntimeError: fault injection failed")
    out = summary([ok(1), bad, broken], breaking=None)
    assert out == [
        "1 of 3 seeds held every invariant",
        "violations: I2 in 1, I8 in 1",
        "harness errors: 1 (a bug in bc sim, not in the fleet)",
        "reproduce: bc sim --seed 4",
        "reproduce: bc sim --seed 9",
    ]
    assert line(bad, breaking=False).startswith("seed     4  FAIL I2,I8")
    assert "HARNESS ERROR RuntimeError" in line(broken, breaking=False)


def test_with_a_break_a_harness_error_is_not_a_catch() -> None:
    caught = SeedOutcome(seed=1, repro="r1", failed=("I1",))
    crashed = SeedOutcome(seed=2, repro="r2", failed=("I1",), harness_error="boom")
    out = summary([caught, crashed, ok(3)], breaking="double-book")
    assert out[0] == "break double-book: caught in 1 of 3 seeds"
    assert out[-2:] == ["reproduce: r2", "reproduce: bc sim --seed 3"]
    assert line(ok(3), breaking=True).split()[2] == "missed"


def outcome_or_die(shape: str, seed: int) -> SeedOutcome:
    if seed == 2:
        os._exit(9)  # the process dies outright, as an out-of-memory kill would
    return SeedOutcome(seed=seed, repro=f"{shape} --seed {seed}")


def raises(shape: str, seed: int) -> SeedOutcome:
    raise RuntimeError(f"{shape} could not inject a fault")


def test_a_seed_whose_process_dies_is_its_own_harness_error_and_the_others_still_report() -> None:
    seen: list[int] = []
    outcomes = sweep(
        [1, 2, 3],
        outcome_or_die,
        "bc sim",
        parallel=2,
        repro_of=lambda shape, seed: f"{shape} --seed {seed}",
        on_done=lambda o: seen.append(o.seed),
    )
    assert [o.seed for o in outcomes] == [1, 2, 3] and sorted(seen) == [1, 2, 3]
    assert outcomes[1].harness_error == "the seed's process ended (exit code 9) before it reported"
    assert outcomes[1].repro == "bc sim --seed 2"
    assert outcomes[0].ok and outcomes[2].ok  # its neighbours ran to the end


def test_what_a_seed_raises_is_its_harness_error() -> None:
    [outcome] = sweep([5], raises, "shape", parallel=1)
    assert outcome.harness_error == "RuntimeError: shape could not inject a fault" and not outcome.caught
