"""The agent's redial back-off: full jitter, capped at 60 s."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.session.dialing import backoff_delay


@given(attempt=st.integers(min_value=0, max_value=10_000), seed=st.integers(min_value=0, max_value=2**32))
def test_the_delay_is_within_zero_and_the_capped_doubling(attempt: int, seed: int) -> None:
    rng = random.Random(seed)
    bound = min(60.0, 2.0**attempt) if attempt < 64 else 60.0
    for _ in range(5):
        d = backoff_delay(attempt, rng)
        assert 0.0 <= d <= bound


@pytest.mark.parametrize("attempt", [0, 1, 3, 5, 6, 20])
def test_the_delays_spread_over_the_whole_range(attempt: int) -> None:
    bound = min(60.0, 2.0**attempt)
    rng = random.Random(1234 + attempt)
    delays = [backoff_delay(attempt, rng) for _ in range(4000)]
    assert min(delays) < 0.05 * bound, "full jitter reaches down to zero (equal jitter would stay above half)"
    assert max(delays) > 0.95 * bound
    below_half = sum(d < bound / 2 for d in delays) / len(delays)
    assert 0.4 < below_half < 0.6
    below_quarter = sum(d < bound / 4 for d in delays) / len(delays)
    assert 0.15 < below_quarter < 0.35


def test_the_delay_depends_only_on_the_injected_rng() -> None:
    a = [backoff_delay(i, random.Random(7)) for i in range(10)]
    b = [backoff_delay(i, random.Random(7)) for i in range(10)]
    assert a == b
