"""The CLI's one time parser (`bc.cli.times`, issue 30) against an injected now, in several zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.cli.times import Toward, duration_ms, lands_elsewhere, parse_instant
from bc.errors import UsageError
from bc.protocol.limits import LIMITS

ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=1)), timezone(timedelta(hours=-7)), timezone(timedelta(hours=5, minutes=30))]
)
NOWS = st.builds(
    lambda base, zone: base.replace(tzinfo=UTC).astimezone(zone),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
    ZONES,
)
MIN = 60_000


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def test_the_issue_examples() -> None:
    now = datetime(2026, 12, 5, 20, 20, 58, tzinfo=UTC)
    assert parse_instant("20:20", now) == ms(now)  # passed 58 s ago: now, not tomorrow
    assert parse_instant("now", now) == ms(now)
    assert parse_instant("+10m", now) == ms(now) + 10 * MIN
    assert parse_instant("1h", now, toward=Toward.BEHIND) == ms(now) - 60 * MIN
    assert parse_instant("-1h", now, toward=Toward.BEHIND) == ms(now) - 60 * MIN
    assert parse_instant("2026-12-01", now, toward=Toward.BEHIND) == ms(datetime(2026, 12, 1, tzinfo=UTC))
    assert parse_instant("20:19", now) == ms(datetime(2026, 12, 6, 20, 19, tzinfo=UTC))  # 1m58s ago: tomorrow
    assert parse_instant("2026-12-02T20:00+01:00", now) == ms(datetime(2026, 12, 2, 19, 0, tzinfo=UTC))


@given(now=NOWS, hour=st.integers(0, 23), minute=st.integers(0, 59))
def test_a_clock_time_ahead_is_the_next_one_or_now_if_it_just_passed(now: datetime, hour: int, minute: int) -> None:
    at = parse_instant(f"{hour:02d}:{minute:02d}", now)
    got = datetime.fromtimestamp(at / 1000, tz=now.tzinfo)
    assert ms(now) - MIN < at < ms(now) + 24 * 60 * MIN
    if at == ms(now):
        assert (
            timedelta(0) <= now - now.replace(hour=hour, minute=minute, second=0, microsecond=0) < timedelta(minutes=1)
        )
    else:
        assert (got.hour, got.minute, got.second) == (hour, minute, 0)


@given(now=NOWS, hour=st.integers(0, 23), minute=st.integers(0, 59))
def test_a_clock_time_behind_is_the_last_one(now: datetime, hour: int, minute: int) -> None:
    at = parse_instant(f"{hour}:{minute:02d}", now, toward=Toward.BEHIND)
    got = datetime.fromtimestamp(at / 1000, tz=now.tzinfo)
    assert ms(now) - 24 * 60 * MIN < at <= ms(now)
    assert (got.hour, got.minute) == (hour, minute)


@given(now=NOWS, n=st.integers(1, 10_000), unit=st.sampled_from([("s", 1000), ("m", MIN), ("h", 60 * MIN)]))
def test_relative_times(now: datetime, n: int, unit: tuple[str, int]) -> None:
    suffix, size = unit
    assert parse_instant(f"+{n}{suffix}", now, toward=Toward.BEHIND) == ms(now) + n * size
    assert parse_instant(f"-{n}{suffix}", now) == ms(now) - n * size
    assert parse_instant(f"{n}{suffix}", now) == ms(now) + n * size
    assert parse_instant(f"{n}{suffix}", now, toward=Toward.BEHIND) == ms(now) - n * size


@given(now=NOWS, text=st.text(max_size=40), toward=st.sampled_from(list(Toward)))
def test_any_text_is_a_bounded_time_or_one_usage_error(now: datetime, text: str, toward: Toward) -> None:
    try:
        at = parse_instant(text, now, toward=toward)
    except UsageError as e:
        assert "\n" not in e.message.strip("\n") or "\n" in text
        return
    assert abs(at - ms(now)) <= LIMITS.max_start_ahead_ms


@pytest.mark.parametrize("text", ["+3651d", "-3651d", "9999-12-31T23:59Z", "+99999999999999999999d", "106751991167d"])
def test_times_past_the_bound_are_refused_naming_it(text: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_instant(text, datetime(2026, 12, 5, tzinfo=UTC))
    assert "max_start_ahead_ms" in refused.value.message or "max_duration_ms" in refused.value.message


@pytest.mark.parametrize("text", ["25:00", "tonight", "2026-13-01T00:00Z", "", "+", "1x", "12", "-"])
def test_what_is_not_a_time_says_so(text: str) -> None:
    with pytest.raises(UsageError):
        parse_instant(text, datetime(2026, 12, 5, tzinfo=UTC))


def test_durations_are_bounded() -> None:
    assert duration_ms("1h30m") == 90 * MIN
    assert duration_ms("3650d") == LIMITS.max_duration_ms
    with pytest.raises(UsageError, match="max_duration_ms"):
        duration_ms("3651d")
    with pytest.raises(UsageError, match="must be positive"):
        duration_ms("0s")


def test_a_time_on_another_day_says_its_date_and_how_far() -> None:
    now = datetime(2026, 12, 5, 20, 21, 30, tzinfo=UTC)
    assert lands_elsewhere(ms(now) + 60 * MIN, now) is None
    tomorrow = parse_instant("20:20", now)
    assert lands_elsewhere(tomorrow, now) == "2026-12-06 20:20 +00:00 (tomorrow, in 23h58m)"
    assert lands_elsewhere(ms(now) - 3 * 24 * 60 * MIN, now) == "2026-12-02 20:21 +00:00 (3 days ago, 3d ago)"
