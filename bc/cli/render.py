"""What the CLI prints: tables, ages, durations, and protobuf messages as JSON.

Pure functions of their arguments (no clock reads, no I/O) so they are unit
tested on their own; `with_progress` at the end is the one exception.

The JSON form is the one scripts read, so it is stable: proto field names
(snake_case), every field present even at its default, fields in descriptor
order (so a top-level `generation` comes before the sections' ones), and
64-bit integers as JSON numbers (protobuf's JSON mapping quotes them, which
would make `generation` a string). `bc.cli.msg_json` renders them so without
protobuf's `json_format`, whose import a one-shot call would pay for.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from bc.cli.msg_json import message_to_json as message_to_json  # re-exported: commands render from here
from bc.cli.output import Lines, echo, json_text, lines, one_line
from bc.client.fmt import format_bytes as format_bytes  # re-exported: commands render from here
from bc.client.fmt import format_time_ms as format_time_ms
from bc.errors import UsageError

# -- durations and ages ----------------------------------------------------

INT64_MAX = 2**63 - 1
"""The largest value a protobuf int64 field takes: options that become one are bounded by it."""

MAX_DURATION_S = 3650 * 86400
"""Ten years: longer than any deadline or ttl we take, and far inside int64 milliseconds."""

_UNITS: tuple[tuple[str, int], ...] = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_UNIT_SECONDS = dict(_UNITS)
_DURATION_RE = re.compile(r"(\d+)([dhms])")


def parse_duration(text: str, *, what: str = "duration") -> int:
    """`90s`, `10m`, `1h`, `2d`, `1h30m` or plain seconds, to whole seconds (> 0)."""
    s = text.strip().lower()
    if s.isdigit():
        seconds = int(s)
    elif s and _DURATION_RE.sub("", s) == "":
        seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in _DURATION_RE.findall(s))
    else:
        raise UsageError(f"the {what} {text!r} is not a duration; write it like 90s, 10m, 1h, 2d or plain seconds")
    if seconds <= 0:
        raise UsageError(f"the {what} {text!r} must be longer than zero")
    if seconds > MAX_DURATION_S:
        raise UsageError(f"the {what} {text!r} is longer than ten years (3650d)")
    return seconds


def format_duration(seconds: float) -> str:
    """Whole seconds as its two largest units: 3600 -> `1h`, 5400 -> `1h30m`, 90 -> `1m30s`."""
    rest = max(0, int(seconds))
    if rest == 0:
        return "0s"
    parts: list[str] = []
    for unit, size in _UNITS:
        n, rest = divmod(rest, size)
        if n and len(parts) < 2:
            parts.append(f"{n}{unit}")
        elif parts:
            # Only adjacent units: "1d5s" reads worse than "1d".
            break
    return "".join(parts)


def format_age(age_ms: int) -> str:
    """An age in milliseconds as `3s ago`, `5m ago`, `2h ago`, `4d ago`; negative (-1) means `never`."""
    if age_ms < 0:
        return "never"
    s = age_ms // 1000
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m ago"
    if s < 2 * 86400:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"


def format_span(age_ms: int) -> str:
    """How long something has been so, as `3s`, `5m`, `2h`: an age without the `ago`."""
    return format_age(age_ms).removesuffix(" ago")


def format_mib(mib: int) -> str:
    if mib >= 1024 and mib % 1024 == 0:
        return f"{mib // 1024} GiB"
    if mib >= 1024:
        return f"{mib / 1024:.1f} GiB"
    return f"{mib} MiB"


# -- tables ------------------------------------------------------------------


def cell(value: object, *, width: int = 0) -> str:
    """One table cell: on one line (tables break otherwise), cut to `width` when given."""
    text = one_line(" ".join(str(value).split()))
    if text == "":
        return "-"
    if width and len(text) > width:
        return text[: width - 1] + "…"
    return text


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> Lines:
    """Left-aligned columns two spaces apart, no trailing blanks; the header is printed as given."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError(f"a row has {len(row)} cells for {len(headers)} columns")
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    return lines(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [list(headers), *cells]
    )


def render_fields(pairs: Sequence[tuple[str, object]]) -> Lines:
    """`key   value` lines with the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    return lines(f"{k.ljust(width)}  {cell(v)}".rstrip() for k, v in pairs)


# -- JSON --------------------------------------------------------------------


def dumps(value: Any) -> str:
    return json_text(value)


# -- progress ----------------------------------------------------------------

_T = TypeVar("_T")


async def with_progress(aw: Awaitable[_T], message: str, *, after_s: float = 2.0) -> _T:
    """Await `aw`; if it takes longer than `after_s`, say `message` on stderr (stdout stays pure)."""
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({task}, timeout=after_s)
    if not done:
        echo(message, err=True)
    return await task
