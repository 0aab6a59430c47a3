"""The gateway's fence: when it stops routing and when it routes again (bc.gateway.fence)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from bc.gateway.fence import FENCE_AFTER_S, MIN_CHECK_S, LeaseFence


def test_ten_seconds_without_a_renewal_fence_and_the_next_renewal_lifts_it() -> None:
    f = LeaseFence(last_renewed=100.0)
    assert not f.check(109.9) and not f.fenced
    assert f.failed(110.0) and f.fenced and "10 s" in f.why
    assert not f.failed(111.0)  # raised once
    assert f.renewed(112.0) and not f.fenced and f.why == ""


def test_another_owner_fences_at_once() -> None:
    f = LeaseFence(last_renewed=100.0)
    assert f.moved(101.0) and f.fenced and "moved" in f.why
    assert not f.moved(102.0)


def test_the_loop_wakes_in_time_to_fence() -> None:
    f = LeaseFence(last_renewed=100.0)
    assert f.next_check_in(100.0, 5.0) == 5.0
    assert f.next_check_in(107.0, 5.0) == 3.0  # a failing store: wake at the deadline, not after it
    f.failed(110.0)
    assert f.next_check_in(110.0, 5.0) == 1.0  # fenced: try to renew every second


Event = st.tuples(st.sampled_from(["renewed", "moved", "failed", "check"]), st.floats(0, 30))


@given(st.lists(Event, max_size=30))
def test_fenced_exactly_when_the_lease_moved_or_went_unrenewed_too_long(events: list[tuple[str, float]]) -> None:
    f = LeaseFence(last_renewed=0.0)
    now, last_ok, moved_since = 0.0, 0.0, False
    late = False
    for what, dt in events:
        now += dt
        getattr(f, what)(now)
        if what == "renewed":
            last_ok, moved_since, late = now, False, False
        elif what == "moved":
            moved_since = True
        else:
            late = late or now - last_ok >= FENCE_AFTER_S
        assert f.fenced == (moved_since or late)


def test_the_lease_loop_never_sleeps_so_little_that_the_clock_cannot_move() -> None:
    """Just before the deadline, `deadline - now` can be smaller than the clock's resolution at `now`: a sleep
    that short leaves the clock where it was, and a loop on virtual time woke at one instant forever (bc sim
    --chaos storm). The sleep has a floor, and the deadline is one expression for both the check and the sleep."""
    last = 123_456.789
    now = math.nextafter(last + FENCE_AFTER_S, 0.0)  # one float below the deadline
    f = LeaseFence(last_renewed=last)
    assert not f.check(now)
    wait = f.next_check_in(now, 5.0)
    assert wait == MIN_CHECK_S and now + wait > now
    assert f.check(now + wait)  # and after it the fence rises
