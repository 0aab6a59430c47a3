"""Migration 0007 rebuilds reservations and device_bookings for capacity: every row written at version 6 stays."""

from __future__ import annotations

from functools import partial

import pytest

from bc.store import StoreError
from bc.store.migrate import apply_migrations
from tests.unit.store.conftest import MakeStore


async def test_reservations_and_bookings_survive_the_rebuild(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for driver in ("bc.store.sqlite", "bc.store.postgres"):
        monkeypatch.setattr(f"{driver}.apply_migrations", partial(apply_migrations, upto=6))
    old = make_store()
    await old.open()
    async with old.transaction() as tx:
        await tx.execute("INSERT INTO nodes (node_id, role, created_at_ms) VALUES ('n1', 'node', 1)")
        for rid, alloc, state, created, released in (
            ("res-b", "alloc-b", "placed", 20, None),
            ("res-a", "alloc-a", "released", 10, 15),
        ):
            await tx.execute(  # as 0001 wrote them
                "INSERT INTO reservations (id, node_id, allocation_id, device_class, gpus, binding, state,"
                " created_at_ms, released_at_ms, generation) VALUES (:id, 'n1', :a, 'gpu', 1, 'hold', :s, :t, :r, 3)",
                {"id": rid, "a": alloc, "s": state, "t": created, "r": released},
            )
            await tx.execute(
                "INSERT INTO device_bookings (reservation_id, node_id, device_class, atom_id, gpu_uuid,"
                " booked_at_ms, released_at_ms) VALUES (:id, 'n1', 'gpu', 'GPU-0', 'GPU-0', :t, :r)",
                {"id": rid, "t": created, "r": released},
            )
    await old.close()
    monkeypatch.undo()

    new = make_store()
    await new.open()
    try:
        async with new.transaction() as tx:
            rows = await tx.fetchall(
                "SELECT id, seq, node_id, want_node_id, state, generation, start_ms, end_ms, placed_at_ms,"
                " ended_at_ms, tenant, selector, cpus FROM reservations ORDER BY seq"
            )
            assert [tuple(r.values()) for r in rows] == [
                ("res-a", 1, "n1", "n1", "released", 3, 10, None, 10, 15, "", "{}", 0),
                ("res-b", 2, "n1", "n1", "placed", 3, 20, None, 20, None, "", "{}", 0),
            ]
            books = await tx.fetchall(
                "SELECT reservation_id, start_ms, end_ms, released_at_ms FROM device_bookings ORDER BY reservation_id"
            )
            assert [tuple(b.values()) for b in books] == [("res-a", 10, 15, 15), ("res-b", 20, None, None)]
            # New: a pending reservation has no node yet, and two disjoint windows may book the same atom.
            await tx.execute(
                "INSERT INTO reservations (id, seq, allocation_id, device_class, gpus, state, created_at_ms,"
                " start_ms, end_ms) VALUES ('res-c', 3, 'alloc-c', 'gpu', 1, 'pending', 30, 100, 200)"
            )
            await tx.execute("UPDATE reservations SET node_id = 'n1' WHERE id = 'res-c'")
            await tx.execute(
                "INSERT INTO device_bookings (reservation_id, node_id, device_class, atom_id, gpu_uuid,"
                " booked_at_ms, start_ms, end_ms) VALUES ('res-c', 'n1', 'gpu', 'GPU-0', 'GPU-0', 30, 100, 200)"
            )
            for _ in range(2):  # a retried flush counts nothing twice
                await tx.execute(
                    "INSERT INTO usage_windows (reservation_id, start_ms, end_ms, node_id, device_class, atoms)"
                    " VALUES ('res-b', 20, 40, 'n1', 'gpu', 1) ON CONFLICT (reservation_id, start_ms) DO NOTHING"
                )
            assert await tx.fetchval("SELECT COUNT(*) FROM usage_windows") == 1
        with pytest.raises(StoreError):  # only a pending (or settled) reservation may lack a node
            async with new.transaction() as tx:
                await tx.execute(
                    "INSERT INTO reservations (id, seq, allocation_id, device_class, gpus, state, created_at_ms)"
                    " VALUES ('res-d', 4, 'alloc-d', 'gpu', 1, 'placed', 40)"
                )
        with pytest.raises(StoreError):
            async with new.transaction() as tx:
                await tx.execute("UPDATE reservations SET state = 'parked' WHERE id = 'res-b'")
    finally:
        await new.close()
