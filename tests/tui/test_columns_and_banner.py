"""The pure parts of issue 30's TUI changes: the free-text columns' widths (`tui.columns`) and what the
banner says while `bc serve` is away (`tui.widgets.banner_text`), on made-up widths and a made-up clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tui.columns import FLOOR, share, sized
from tui.state import Link
from tui.widgets import banner_text, rows_stale


def test_everything_whole_when_it_fits() -> None:
    assert share(60, {"labels": 30, "sched": 20}) == {"labels": 30, "sched": 20}


def test_short_of_room_the_short_column_is_whole_and_the_long_one_takes_the_rest() -> None:
    assert share(40, {"labels": 60, "sched": 10}) == {"labels": 30, "sched": 10}


def test_never_below_the_floor_even_on_a_narrow_terminal() -> None:
    assert share(5, {"labels": 60, "sched": 40}) == {"labels": FLOOR, "sched": FLOOR}


@given(st.integers(0, 300), st.dictionaries(st.sampled_from("abcde"), st.integers(0, 200), min_size=1))
def test_widths_are_floored_capped_and_fit_when_they_can(spare: int, wants: dict[str, int]) -> None:
    widths = share(spare, wants)
    assert set(widths) == set(wants)
    for k, w in widths.items():
        assert min(wants[k], FLOOR) <= w <= wants[k]
    assert sum(widths.values()) <= max(spare, sum(min(w, FLOOR) for w in wants.values()))
    if sum(wants.values()) > spare >= sum(min(w, FLOOR) for w in wants.values()):
        assert sum(widths.values()) == spare, "no room left unused while a column is clipped"


def test_sized_clips_only_the_free_text_columns() -> None:
    rows = [("b-1", "x" * 100, "1 of 2")]
    (row,) = sized(60, ("ID", "WHAT", "APPROVALS"), rows, (1,))
    assert row[0] == "b-1" and row[2] == "1 of 2"
    assert row[1].endswith("…") and len(row[1]) < 100


def test_the_banner_while_the_server_is_away_says_for_how_long_the_next_attempt_and_stale() -> None:
    link = Link(live=False, data_at=90.0)
    reason = "bc serve at h:1 is not answering (connection refused)"
    link.outage.failed(reason, 100.0)
    link.outage.failed(reason, 100.2)
    text = banner_text(link, "h:1", 103.0).plain
    assert text == (
        "bc serve at h:1 is not answering (connection refused) for 3s; next attempt in 0s (attempt 3);"
        " the rows shown are stale (as of 13s ago)"
    )
    assert rows_stale(link)
    link.live = True
    link.outage.recovered()
    assert banner_text(link, "h:1", 104.0).plain == "" and not rows_stale(link)


def test_before_the_first_answer_it_is_connecting_and_nothing_is_stale() -> None:
    link = Link()
    assert banner_text(link, "h:1", 0.0).plain == "connecting to bc serve at h:1…"
    assert not rows_stale(link)


def test_a_notice_shows_whatever_the_link_s_state() -> None:
    link = Link(live=True, notice="your operator certificate was revoked")
    assert banner_text(link, "h:1", 0.0).plain == "your operator certificate was revoked"
