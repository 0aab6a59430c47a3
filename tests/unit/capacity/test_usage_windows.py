"""Usage windows: where they are cut, that a retried or resumed flush counts nothing twice, and `bc usage` sums."""

from __future__ import annotations

import pytest

from bc.control.capacity.invariants import check_billing_conservation
from bc.control.capacity.usage_windows import (
    HOUR_MS,
    Span,
    UsageWindow,
    aggregate,
    last_flushed_end,
    open_window,
    windows_to_flush,
)

H = HOUR_MS
T0 = 1_800_000_000_000  # on a whole hour
S = 1000


def span(rid: str = "r1", *, atoms: int = 2, start: int | None = None, end: int | None = None, **kw: object) -> Span:
    fields: dict[str, object] = {"placed_at_ms": T0 + 10 * 60 * S, "node_id": "n1", "tenant": "t1"}
    fields.update(kw)
    return Span(rid, device_class="gpu", atoms=atoms, window_start_ms=start, window_end_ms=end, **fields)  # type: ignore[arg-type]


def bounds(ws: list[UsageWindow]) -> list[tuple[int, int]]:
    return [(w.start_ms - T0, w.end_ms - T0) for w in ws]


def test_usage_runs_from_the_later_of_window_start_and_placement_to_the_earlier_of_end_and_release() -> None:
    s = span(start=T0 + 5 * 60 * S, end=T0 + 3 * H, released_at_ms=T0 + 2 * H + 30 * S)
    assert (s.usage_start_ms, s.usage_end_ms) == (T0 + 10 * 60 * S, T0 + 2 * H + 30 * S)
    booked_before = span(start=T0 + H, placed_at_ms=T0)
    assert (booked_before.usage_start_ms, booked_before.usage_end_ms) == (T0 + H, None)


def test_windows_close_at_every_hour_and_at_the_end_and_only_once_reached() -> None:
    s = span(released_at_ms=T0 + 2 * H + 30 * S)
    assert windows_to_flush(s, None, T0 + 59 * 60 * S) == []  # the first hour is still open
    assert bounds(windows_to_flush(s, None, T0 + H)) == [(10 * 60 * S, H)]
    assert bounds(windows_to_flush(s, None, T0 + 5 * H)) == [(10 * 60 * S, H), (H, 2 * H), (2 * H, 2 * H + 30 * S)]
    assert open_window(s, T0 + H, T0 + H + 5 * S) == UsageWindow("r1", "n1", "t1", "gpu", 2, T0 + H, T0 + H + 5 * S)
    assert open_window(s, T0 + 2 * H + 30 * S, T0 + 5 * H) is None


def test_a_retried_flush_writes_the_same_keys_and_a_resumed_one_starts_at_the_last_committed_end() -> None:
    s = span()
    first = windows_to_flush(s, None, T0 + 3 * H)
    assert windows_to_flush(s, None, T0 + 3 * H) == first  # a retry after an unknown commit: same rows, same keys
    committed = first[:1]  # the crash lost the second window's commit
    resumed = windows_to_flush(s, last_flushed_end(committed, "r1"), T0 + 3 * H + 5)
    assert committed + resumed == first
    store = {w.key: w for w in [*first, *resumed]}  # insert ... on conflict do nothing
    assert check_billing_conservation([s], list(store.values()), T0 + 3 * H) is None


def test_a_window_not_started_or_released_before_it_starts_uses_nothing() -> None:
    later = span(start=T0 + 5 * H)
    assert windows_to_flush(later, None, T0 + 2 * H) == [] and open_window(later, None, T0 + 2 * H) is None
    cancelled = span(start=T0 + 5 * H, released_at_ms=T0 + H)
    assert windows_to_flush(cancelled, None, T0 + 9 * H) == [] and cancelled.used_ms(T0 + 9 * H) == 0


def test_aggregate_prorates_to_the_range_counts_open_windows_and_groups() -> None:
    a = span("a", atoms=2, tenant="t1")
    b = span("b", atoms=1, tenant="t2", node_id="n2", placed_at_ms=T0)
    now = T0 + 2 * H + 30 * 60 * S
    ws = [*windows_to_flush(a, None, now), *windows_to_flush(b, None, now)]
    ws += [w for s in (a, b) if (w := open_window(s, last_flushed_end(ws, s.reservation_id), now)) is not None]
    rows = aggregate(ws, None, None, "reservation")
    assert [(r.key, r.atom_seconds) for r in rows] == [("a", 2 * (now - a.usage_start_ms) / S), ("b", 9000.0)]
    assert [r.key for r in aggregate(ws, None, None, "node")] == ["n1", "n2"]
    by_tenant = {r.key: r.atom_ms for r in aggregate(ws, None, None, "tenant")}
    assert by_tenant == {"t1": rows[0].atom_ms, "t2": rows[1].atom_ms}
    # Consecutive ranges add up to their union, to the millisecond.
    cut = T0 + H + 1234
    parts = [aggregate(ws, T0, cut, "tenant"), aggregate(ws, cut, now, "tenant")]
    assert sum(r.atom_ms for p in parts for r in p) == sum(by_tenant.values())
    with pytest.raises(ValueError, match="grouped by"):
        aggregate(ws, None, None, "gpu")
