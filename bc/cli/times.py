"""The one time parser of the CLI (issue 30): every option that takes a time reads it here.

    now                      now
    +10m, +1h30m             that long from now
    -1h                      that long ago
    1h                       from now for a time ahead (`--start`, a window's `--until`);
                             ago for a time behind (`--since`, `bc usage --until`)
    20:20                    a clock time in the CLI host's local zone: ahead, the next one (a time that
                             passed less than a minute ago is now: `--start 20:20` typed at 20:20:58 is
                             not tomorrow); behind, the last one
    2026-12-01               local midnight of that day
    2026-12-02T20:00[Z|+01:00]   as written; without a zone, local

Every result is bounded (`bc.protocol.limits`): at most `max_start_ahead_ms` from now either way, so it
always fits an int64 of milliseconds and a datetime. `lands_elsewhere` says when a time falls on another
local day than now, so the command can print its date and how far away it is.

Pure: `now` is passed in (an aware datetime in the zone to read clock times in).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from enum import Enum

from bc.errors import UsageError
from bc.protocol.limits import LIMITS

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(?:\d+(?:ms|s|m|h|d))+")
MAX_TEXT = 64
"""Longer than any time or duration anyone types: refused before a regex or int() sees it."""
_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
JUST_PASSED = timedelta(minutes=1)
"""A clock time that passed less than this long ago is now, not tomorrow."""
FORMS = "now, +10m, -1h, 20:00, 2026-12-01 or 2026-12-02T20:00Z"


class Toward(Enum):
    """Which way a bare duration or clock time points: a window's start is ahead, a report's `--since` behind."""

    AHEAD = 1
    BEHIND = -1


def duration_ms(text: str, *, what: str = "duration") -> int:
    """'12h', '90m', '1h30m', '45s', '2d', '250ms' to milliseconds (> 0, at most `max_duration_ms`)."""
    s = re.sub(r"\s+", "", text.strip().lower())
    if len(s) > MAX_TEXT or not _DURATION.fullmatch(s):
        raise UsageError(f"the {what} {text!r} is not a duration; write it like 12h, 90m or 1h30m")
    ms = sum(int(n) * _UNITS_MS[u] for n, u in _PART.findall(s))
    if ms <= 0:
        raise UsageError(f"a duration must be positive: the {what} is {text!r}")
    if ms > LIMITS.max_duration_ms:
        days = LIMITS.max_duration_ms // 86_400_000
        raise UsageError(f"the {what} {text!r} is longer than {days} days ({days}d, max_duration_ms)")
    return ms


def parse_instant(text: str, now: datetime, *, toward: Toward = Toward.AHEAD, what: str = "time") -> int:
    """`text` as epoch milliseconds, read against `now` (aware); a UsageError naming `what` otherwise."""
    t = text.strip()
    if len(t) > MAX_TEXT:
        raise UsageError(f"the {what} is {len(t):,} characters long; write {FORMS}")
    low = t.lower()
    now_ms = _ms(now)
    if low == "now":
        at = now_ms
    elif low[:1] in "+-" and len(low) > 1 and _DURATION.fullmatch(re.sub(r"\s+", "", low[1:])):
        sign = 1 if low[0] == "+" else -1
        at = now_ms + sign * duration_ms(low[1:], what=what)
    elif _DURATION.fullmatch(re.sub(r"\s+", "", low)):
        at = now_ms + toward.value * duration_ms(low, what=what)
    elif (m := _CLOCK.fullmatch(t)) is not None:
        at = _clock_time(int(m.group(1)), int(m.group(2)), now, toward, text, what)
    else:
        at = _calendar(t, now, text, what)
    reach = LIMITS.max_start_ahead_ms
    if abs(at - now_ms) > reach:
        raise UsageError(f"the {what} {text!r} is more than {reach // 86_400_000} days from now (max_start_ahead_ms)")
    return at


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def _clock_time(hour: int, minute: int, now: datetime, toward: Toward, text: str, what: str) -> int:
    if hour > 23 or minute > 59:
        raise UsageError(f"the {what} {text!r} is not a time of day; write it like 20:00")
    today = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if toward is Toward.AHEAD:
        if today > now:
            return _ms(today)
        if now - today < JUST_PASSED:
            return _ms(now)  # typed as the minute turned: now, not tomorrow
        return _ms(today + timedelta(days=1))
    return _ms(today if today <= now else today - timedelta(days=1))


def _calendar(t: str, now: datetime, text: str, what: str) -> int:
    try:
        if _DATE.fullmatch(t):
            at = datetime.fromisoformat(t).replace(tzinfo=None)
        else:
            at = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except (ValueError, OverflowError):
        raise UsageError(f"the {what} {text!r} is not a time; write {FORMS}") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=now.tzinfo)  # local, as written
    try:
        return _ms(at)
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"the {what} {text!r} is out of range") from None


def lands_elsewhere(at_ms: int, now: datetime) -> str | None:
    """When `at_ms` falls on another local day than `now`: its date and time and how far away, e.g.
    `2026-12-06 20:20 +01:00 (tomorrow, in 23h59m)`; None on the same day."""
    at = datetime.fromtimestamp(at_ms / 1000, tz=now.tzinfo)
    days = (at.date() - now.date()).days
    if days == 0:
        return None
    gap_ms = at_ms - _ms(now)
    when = {1: "tomorrow", -1: "yesterday"}.get(days, f"{abs(days)} days {'ahead' if days > 0 else 'ago'}")
    span = _span(abs(gap_ms))
    away = f"in {span}" if gap_ms >= 0 else f"{span} ago"
    return f"{at.strftime('%Y-%m-%d %H:%M %z')[:-2]}:{at.strftime('%z')[-2:]} ({when}, {away})"


def _span(ms: int) -> str:
    """Whole minutes as its two largest units: `23h59m`, `3d4h`, `5m`."""
    rest = ms // 60_000
    parts: list[str] = []
    for unit, size in (("d", 1440), ("h", 60), ("m", 1)):
        n, rest = divmod(rest, size)
        if n and len(parts) < 2:
            parts.append(f"{n}{unit}")
        elif parts:
            break
    return "".join(parts) or "0m"


__all__ = ["FORMS", "JUST_PASSED", "Toward", "duration_ms", "lands_elsewhere", "parse_instant"]
