"""`bc usage` sums the flushed windows in the store: the same numbers as the pure `aggregate`, for every
grouping and range (windows straddling either edge prorated to the millisecond)."""

from __future__ import annotations

import random

import pytest

from bc.control.capacity.usage_windows import BY, aggregate
from bc.control.capacity.views import window_of
from bc.store import capacity as cap_sql
from bc.store.sqlite import InlineSqliteStore

RANGES = [(None, None), (0, None), (None, 50_000_000), (3_600_000, 40_000_000), (10_000_001, 10_000_002)]


@pytest.mark.parametrize(("since", "until"), RANGES)
async def test_the_store_sums_what_aggregate_sums(
    store: InlineSqliteStore, since: int | None, until: int | None
) -> None:
    rng = random.Random(11)
    async with store.transaction() as tx:
        for i in range(40):
            await tx.execute(
                "INSERT INTO reservations (id, seq, allocation_id, device_class, gpus, state, created_at_ms)"
                " VALUES (:id, :seq, :a, 'gpu', 1, 'pending', 0)",
                {"id": f"r{i}", "seq": i + 1, "a": f"a{i}"},
            )
            t = rng.randrange(0, 20) * 3_600_000
            for _ in range(rng.randrange(1, 12)):
                length = rng.choice([3_600_000, 1_234_567, 1])
                await cap_sql.insert_usage_window(
                    tx,
                    reservation_id=f"r{i}",
                    start_ms=t,
                    end_ms=t + length,
                    node_id=f"n{i % 7}",
                    tenant=f"t{i % 3}",
                    device_class="gpu",
                    atoms=rng.choice([1, 2, 8]),
                )
                t += length
        windows = [window_of(r) for r in await cap_sql.usage_windows(tx, None, None)]
        for by in BY:
            stored = [
                (str(r["key"]), int(r["atom_ms"]), int(r["windows"]))
                for r in await cap_sql.usage_sums(tx, since, until, by)
            ]
            pure = [(u.key, u.atom_ms, u.windows) for u in aggregate(windows, since, until, by)]
            assert stored == pure, by
