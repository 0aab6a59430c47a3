"""agent.instances.transfer.Stall: a window short of its bytes, or a transfer over its time, ends it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.instances.transfer import Limits, Stall

LIMITS = Limits(min_bytes=1000, window_s=10.0, max_s=100.0)


def test_a_steady_transfer_runs_until_its_overall_limit() -> None:
    s = Stall(LIMITS, start=0.0)
    for t in range(100):
        s.feed(200, float(t))  # 2000 bytes a window
        assert s.verdict(float(t)) is None
    assert s.verdict(100.0) == "the transfer ran over 100 s"


def test_a_window_short_of_its_bytes_ends_it_and_later_bytes_do_not_save_it() -> None:
    s = Stall(LIMITS, start=0.0)
    s.feed(999, 1.0)
    assert s.verdict(9.9) is None
    assert s.next_check() == 10.0
    s.feed(5000, 10.5)  # too late: they belong to the next window
    assert s.verdict(10.5) == "the transfer stalled: 999 bytes in 10 s, under the 1000 it must move"


def test_silence_ends_it_at_the_first_window() -> None:
    s = Stall(LIMITS, start=5.0)
    assert s.verdict(14.9) is None
    assert s.verdict(15.0) is not None


@given(st.lists(st.tuples(st.floats(0, 9.99), st.integers(0, 3000)), max_size=30))
def test_the_verdict_at_a_window_end_is_whether_that_window_moved_enough(feeds: list[tuple[float, int]]) -> None:
    s = Stall(LIMITS, start=0.0)
    for t, n in sorted(feeds):
        s.feed(n, t)
    moved = sum(n for _, n in feeds)
    assert (s.verdict(10.0) is None) == (moved >= 1000)
