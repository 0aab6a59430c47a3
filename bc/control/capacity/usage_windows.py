"""Usage accounting as pure functions: which windows to flush, and how `bc usage` adds them up.

Theory of operation
-------------------
A hold's usage runs on the store clock from the later of its window start and
its placement commit to the earlier of its window end and its release commit
(`Span.usage_start_ms`, `Span.usage_end_ms`); when the node bound it does not
matter, since the atoms were the tenant's from the commit on.

While a hold is active its usage is written as `UsageWindow` rows, cut at
every whole hour of the store clock (so a flush happens at least hourly) and
at the usage end (release or window end). A window is keyed
`(reservation_id, start_ms)` and the store inserts it with "on conflict do
nothing": a flush retried after an unknown commit writes the same windows
with the same keys and counts nothing twice. A flush after a crash asks
`windows_to_flush` again with the last *committed* window end and resumes
exactly there, so no second is lost either. Only closed windows are flushed;
the part of the current hour not yet flushed is the *open* window
(`open_window`), which `aggregate` counts up to now.

Everything is in integer milliseconds so that I8 (usage = booked duration ×
atoms) is an equality, not a tolerance; `atom_seconds` is `atom_ms / 1000`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

HOUR_MS = 3_600_000
BY = ("reservation", "tenant", "node")


@dataclass(frozen=True)
class Span:
    """A booked reservation as billing sees it: what it holds, its window and its placement and release commits."""

    reservation_id: str
    node_id: str
    tenant: str
    device_class: str
    atoms: int
    window_start_ms: int | None  # None: from the placement
    window_end_ms: int | None  # None: open-ended
    placed_at_ms: int
    released_at_ms: int | None = None

    @property
    def usage_start_ms(self) -> int:
        return self.placed_at_ms if self.window_start_ms is None else max(self.window_start_ms, self.placed_at_ms)

    @property
    def usage_end_ms(self) -> int | None:
        ends = [t for t in (self.window_end_ms, self.released_at_ms) if t is not None]
        return min(ends) if ends else None

    def used_ms(self, now_ms: int) -> int:
        """Milliseconds of use up to `now_ms` (per atom)."""
        end = now_ms if self.usage_end_ms is None else min(self.usage_end_ms, now_ms)
        return max(0, end - self.usage_start_ms)


@dataclass(frozen=True)
class UsageWindow:
    reservation_id: str
    node_id: str
    tenant: str
    device_class: str
    atoms: int
    start_ms: int
    end_ms: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.reservation_id, self.start_ms)

    @property
    def atom_ms(self) -> int:
        return self.atoms * (self.end_ms - self.start_ms)


def _window(span: Span, start_ms: int, end_ms: int) -> UsageWindow:
    return UsageWindow(span.reservation_id, span.node_id, span.tenant, span.device_class, span.atoms, start_ms, end_ms)


def _next_cut(t: int, end: int | None) -> int:
    hour = (t // HOUR_MS + 1) * HOUR_MS
    return hour if end is None else min(hour, end)


def windows_to_flush(span: Span, last_flushed_end_ms: int | None, now_ms: int) -> list[UsageWindow]:
    """The closed windows not yet flushed: from the last committed window end (or the usage start) to now.

    A window closes at a whole hour or at the usage end, whichever comes first, and only once `now_ms` has
    reached it; the same arguments always give the same windows, which is what makes a retried flush safe.
    """
    start = span.usage_start_ms if last_flushed_end_ms is None else max(last_flushed_end_ms, span.usage_start_ms)
    end = span.usage_end_ms
    out: list[UsageWindow] = []
    while end is None or start < end:
        cut = _next_cut(start, end)
        if cut > now_ms:
            break
        out.append(_window(span, start, cut))
        start = cut
    return out


def open_window(span: Span, last_flushed_end_ms: int | None, now_ms: int) -> UsageWindow | None:
    """The use since the last flushed window that no flush has written yet, up to now (None when there is none)."""
    start = span.usage_start_ms if last_flushed_end_ms is None else max(last_flushed_end_ms, span.usage_start_ms)
    end = now_ms if span.usage_end_ms is None else min(span.usage_end_ms, now_ms)
    return _window(span, start, end) if end > start else None


@dataclass(frozen=True)
class UsageRow:
    """One line of `bc usage`: a reservation, tenant or node, and what it used in the range."""

    key: str
    atom_ms: int
    windows: int

    @property
    def atom_seconds(self) -> float:
        return self.atom_ms / 1000


def aggregate(
    windows: Iterable[UsageWindow], since_ms: int | None, until_ms: int | None, by: str = "reservation"
) -> list[UsageRow]:
    """Sum windows by reservation, tenant or node, counting only the part of each inside `[since, until)`.

    Pass the flushed windows and each active hold's `open_window` up to now: that is how an open window is
    counted. A window that straddles `since` or `until` counts prorated to the millisecond, so usage over
    consecutive ranges adds up to usage over their union. Rows come sorted by key.
    """
    if by not in BY:
        raise ValueError(f"usage is grouped by {', '.join(BY)}, not {by!r}")
    sums: dict[str, tuple[int, int]] = {}
    for w in windows:
        lo = w.start_ms if since_ms is None else max(w.start_ms, since_ms)
        hi = w.end_ms if until_ms is None else min(w.end_ms, until_ms)
        if hi <= lo:
            continue
        key = {"reservation": w.reservation_id, "tenant": w.tenant, "node": w.node_id}[by]
        ms, n = sums.get(key, (0, 0))
        sums[key] = (ms + w.atoms * (hi - lo), n + 1)
    return [UsageRow(k, ms, n) for k, (ms, n) in sorted(sums.items())]


def last_flushed_end(windows: Sequence[UsageWindow], reservation_id: str) -> int | None:
    """Where a flush for the reservation resumes: the end of its last committed window."""
    return max((w.end_ms for w in windows if w.reservation_id == reservation_id), default=None)


__all__ = [
    "HOUR_MS",
    "Span",
    "UsageRow",
    "UsageWindow",
    "aggregate",
    "last_flushed_end",
    "open_window",
    "windows_to_flush",
]
