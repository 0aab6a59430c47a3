"""The capacity CLI's parsing: times on the CLI host's clock, durations, sizes, selectors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from bc.cli.capacity_cmds import parse_duration, parse_selector, parse_size, parse_time
from bc.errors import UsageError

PARIS = timezone(timedelta(hours=1))


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def test_a_bare_time_is_the_next_one_in_local_time() -> None:
    now = datetime(2026, 12, 1, 9, 30, tzinfo=PARIS)
    assert parse_time("20:00", now) == ms(datetime(2026, 12, 1, 20, 0, tzinfo=PARIS))
    assert parse_time("08:00", now) == ms(datetime(2026, 12, 2, 8, 0, tzinfo=PARIS))  # passed today: tomorrow
    assert parse_time("09:30", now) == ms(now)  # passed less than a minute ago: now (issue 30), not tomorrow
    assert parse_time("09:29", now) == ms(datetime(2026, 12, 2, 9, 29, tzinfo=PARIS))


def test_an_iso_time_with_a_zone_is_taken_as_written() -> None:
    assert parse_time("2026-12-02T20:00Z") == ms(datetime(2026, 12, 2, 20, 0, tzinfo=UTC))
    assert parse_time("2026-12-02T20:00+01:00") == ms(datetime(2026, 12, 2, 19, 0, tzinfo=UTC))


@pytest.mark.parametrize("bad", ["25:00", "tonight", "2026-13-01T00:00Z"])
def test_a_bad_time_is_one_sentence(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_time(bad)


def test_durations_sizes_and_selectors() -> None:
    assert parse_duration("12h") == 12 * 3_600_000
    assert parse_duration("1h30m") == 5_400_000
    assert parse_duration("45s") == 45_000
    assert parse_size("128G") == 128 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1024") == 1024
    assert parse_selector(("pool=a100,zone=b", "rack=7")) == {"pool": "a100", "zone": "b", "rack": "7"}
    for bad in ("12", "h", "1x"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    with pytest.raises(UsageError):
        parse_size("lots")
    with pytest.raises(UsageError):
        parse_selector(("pool",))
