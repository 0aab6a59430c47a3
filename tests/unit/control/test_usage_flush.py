"""Usage wired to the store: windows flushed hourly, at release and at window end, never twice; `usage`
adds flushed and open windows, and I8 holds over the rows (`check_billing_conservation`)."""

from __future__ import annotations

import random

from bc.control.base.bus import Bus
from bc.control.capacity.invariants import check_billing_conservation
from bc.control.capacity.placement_pass import PlacementPass, flush_usage, span_of
from bc.control.capacity.reservations import ReserveRequest, release, reserve
from bc.control.capacity.usage_windows import HOUR_MS, open_window
from bc.control.capacity.views import usage, window_of
from bc.control.signing.signer import NullSigner
from bc.store import capacity as cap_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance
from tests.unit.control.conftest import AddNode, Count

SIGNER = NullSigner()
RNG = random.Random(3)


async def conservation(store: InlineSqliteStore) -> None:
    """I8 over what is stored: every booked span against its flushed windows plus its open one."""
    now = await store.now_ms()
    async with store.transaction(write=False) as tx:
        windows = [window_of(r) for r in await cap_sql.usage_windows(tx, None, None)]
        rows = await cap_sql.billing_spans(tx)
    spans = [span_of(r) for r in rows]
    for s, r in zip(spans, rows, strict=True):
        w = open_window(s, None if r["flushed_ms"] is None else int(r["flushed_ms"]), now)
        if w is not None:
            windows.append(w)
    assert check_billing_conservation(spans, windows, now) is None


async def test_usage_is_flushed_hourly_at_release_and_at_window_end_and_adds_up(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count
) -> None:
    await add_node("n1")
    p = PlacementPass(store, bus, SIGNER, RNG, holder="w-1")
    t0 = await store.now_ms()
    held = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, tenant="acme"), RNG)
    window = await reserve(
        store, bus, SIGNER, ReserveRequest(gpus=1, start_ms=t0 + 1_800_000, duration_ms=2 * HOUR_MS, tenant="lab"), RNG
    )
    await p.pass_once()
    assert p.next_wake_ms is not None and p.next_wake_ms <= (t0 // HOUR_MS + 1) * HOUR_MS
    await conservation(store)
    for _ in range(3):  # three hours, a pass every half hour
        await advance(1800)
        await p.pass_once()
        await conservation(store)
    assert await count("usage_windows") >= 2  # an hour boundary passed for each
    await release(store, bus, SIGNER, str(held["id"]))  # flushed inline to the release commit
    await advance(3600)
    result = await p.pass_once()  # the window ended at t0 + 2.5 h: ended, flushed to its end
    assert result is not None and result.ended == (str(window["id"]),)
    await conservation(store)
    before = await count("usage_windows")
    now = await store.now_ms()
    async with store.transaction() as tx:  # a retried flush writes nothing more
        await flush_usage(tx, now)
    assert await count("usage_windows") == before

    t_rel = int((await store.now_ms()) - 3_600_000)
    rows, _ = await usage(store, None, None, "tenant")
    totals = {r.key: r.atom_ms for r in rows}
    assert totals["lab"] == 1 * 2 * HOUR_MS  # the whole window, to the millisecond
    assert totals["acme"] == 2 * (t_rel - t0)  # from the placement commit to the release commit
    by_res, _ = await usage(store, None, None, "reservation")
    assert {r.key for r in by_res} == {str(held["id"]), str(window["id"])}
    # Consecutive ranges add up to their union.
    mid = t0 + HOUR_MS + 123
    (a,), _ = await usage(store, t0, mid, "node")
    (b,), _ = await usage(store, mid, None, "node")
    (whole,), _ = await usage(store, None, None, "node")
    assert a.atom_ms + b.atom_ms == whole.atom_ms


async def test_an_active_holds_open_window_counts_up_to_now(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    t0 = await store.now_ms()
    await reserve(store, bus, SIGNER, ReserveRequest(gpus=4), RNG)
    await advance(90)
    (row,), now = await usage(store, None, None, "node")
    assert (row.key, row.atom_ms) == ("n1", 4 * (now - t0))


async def test_a_window_released_before_it_starts_bills_nothing_and_leaves_the_usage_scan(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    t0 = await store.now_ms()
    later = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, start_ms=t0 + HOUR_MS, duration_ms=HOUR_MS), RNG)
    assert later["node_id"] == "n1"  # booked at submit, pending until its start
    await release(store, bus, SIGNER, str(later["id"]))
    async with store.transaction(write=False) as tx:
        assert await cap_sql.unflushed_spans(tx) == []  # nothing to flush, now or ever: not scanned each pass
    await conservation(store)
    rows, _ = await usage(store, None, None, "reservation")
    assert [r for r in rows if r.key == later["id"] and r.atom_ms] == []
