"""When the agent renews its certificate: at 60 % of its life, then back-off 30 s → 10 min, never past expiry."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.renewal import (
    LAST_TRY_MARGIN_S,
    RETRY_BASE_S,
    RETRY_CAP_S,
    next_attempt_at,
    renew_at,
    retry_delay,
)
from bc.pki.ca import BACKDATE_S

T0 = 1_800_000_000.0


def test_a_day_long_certificate_renews_after_14_4_hours() -> None:
    # The CA dates the certificate 60 s back; the 24 h it granted start when it was issued.
    assert renew_at(T0 - BACKDATE_S, T0 + 86_400) == pytest.approx(T0 + 0.6 * 86_400)


def test_a_20_s_certificate_renews_after_12_s_not_at_once() -> None:
    assert renew_at(T0 - BACKDATE_S, T0 + 20) == pytest.approx(T0 + 12)


def test_a_certificate_without_backdating_renews_at_60_percent_of_its_dates() -> None:
    assert renew_at(T0, T0 + 30, backdate_s=0) == pytest.approx(T0 + 18)
    # Shorter than the backdate: nothing to take off, the dates are the lifetime.
    assert renew_at(T0, T0 + 50) == pytest.approx(T0 + 30)


@given(
    issued=st.floats(min_value=0, max_value=4e9),
    lifetime=st.floats(min_value=1, max_value=86_400),
)
def test_renewal_is_at_60_percent_of_the_granted_lifetime(issued: float, lifetime: float) -> None:
    not_before, not_after = issued - BACKDATE_S, issued + lifetime
    at = renew_at(not_before, not_after)
    assert not_before < at < not_after
    assert at == pytest.approx(issued + 0.6 * lifetime, abs=1e-3)


def test_the_back_off_starts_at_30_s_and_doubles_to_10_min() -> None:
    rng = random.Random(1)
    assert retry_delay(1, rng) == RETRY_BASE_S
    nominal = [30, 60, 120, 240, 480, 600, 600, 600]
    for attempt, top in enumerate(nominal, start=1):
        for _ in range(50):
            d = retry_delay(attempt, rng)
            assert max(RETRY_BASE_S, 0.8 * top) <= d <= top, (attempt, d)


@given(attempt=st.integers(min_value=0, max_value=10_000), seed=st.integers(min_value=0, max_value=2**32))
def test_the_back_off_stays_within_30_s_and_10_min(attempt: int, seed: int) -> None:
    d = retry_delay(attempt, random.Random(seed))
    assert RETRY_BASE_S <= d <= RETRY_CAP_S


def test_the_back_off_is_jittered_and_depends_only_on_the_rng() -> None:
    delays = {retry_delay(4, random.Random(seed)) for seed in range(50)}
    assert len(delays) > 40, "failed nodes must not retry in step"
    assert [retry_delay(i, random.Random(7)) for i in range(1, 9)] == [
        retry_delay(i, random.Random(7)) for i in range(1, 9)
    ]


def test_a_retry_far_from_expiry_waits_the_back_off() -> None:
    rng = random.Random(3)
    at = next_attempt_at(T0, 1, T0 + 3600, rng)
    assert at == T0 + RETRY_BASE_S


def test_a_retry_that_would_overshoot_the_expiry_is_the_last_one_just_before_it() -> None:
    not_after = T0 + 100
    assert next_attempt_at(T0, 3, not_after, random.Random(1)) == not_after - LAST_TRY_MARGIN_S
    # After that last try, nothing can start before the expiry.
    assert next_attempt_at(not_after - LAST_TRY_MARGIN_S, 4, not_after, random.Random(1)) is None


def test_no_retry_once_expired() -> None:
    assert next_attempt_at(T0 + 1, 1, T0, random.Random(1)) is None
    assert next_attempt_at(T0, 1, T0, random.Random(1)) is None


@given(
    now=st.floats(min_value=0, max_value=4e9),
    left=st.floats(min_value=-1e5, max_value=2e5),
    attempt=st.integers(min_value=1, max_value=100),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_a_retry_is_always_later_and_never_past_expiry(now: float, left: float, attempt: int, seed: int) -> None:
    not_after = now + left
    at = next_attempt_at(now, attempt, not_after, random.Random(seed))
    if at is None:
        assert now >= not_after - LAST_TRY_MARGIN_S
    else:
        assert now < at < not_after
        assert at - now <= RETRY_CAP_S


@given(lifetime=st.integers(min_value=120, max_value=86_400), seed=st.integers(min_value=0, max_value=2**32))
def test_a_renewal_that_keeps_failing_stops_at_expiry(lifetime: int, seed: int) -> None:
    """Walk the schedule: the first try at 60 %, retries until none fits, all before the expiry."""
    rng = random.Random(seed)
    not_before, not_after = T0 - BACKDATE_S, T0 + lifetime
    tries = [renew_at(not_before, not_after)]
    while (nxt := next_attempt_at(tries[-1], len(tries), not_after, rng)) is not None:
        tries.append(nxt)
    assert tries == sorted(tries) and len(set(tries)) == len(tries)
    assert tries[-1] < not_after
    # No gap is shorter than 30 s except before the last try (cut to just before the expiry).
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert all(g >= RETRY_BASE_S for g in gaps[:-1])
    assert all(g <= RETRY_CAP_S for g in gaps)
