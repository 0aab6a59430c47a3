"""The events a transaction appends: one multi-row INSERT per run of rows, numbered in append order, on both
drivers; and the lease check a group commit's members share (`leases.held`, read once a transaction)."""

from __future__ import annotations

import json

from bc.store import Store
from bc.store import events as events_sql
from bc.store import leases as leases_sql
from bc.store.base import APPEND_ROWS_PER_INSERT, insert_rows

N = 2 * APPEND_ROWS_PER_INSERT + 37  # three INSERTs, the last a short one


async def test_a_transactions_events_are_numbered_in_the_order_they_were_appended(store: Store) -> None:
    async with store.transaction() as tx:
        await events_sql.publish(tx, "first", "n0", {}, 1)
    async with store.transaction() as tx:
        for i in range(N):
            await events_sql.publish(tx, f"t{i % 3}", f"n{i}", {"i": i}, 1000 + i)
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 10 * N, "")
    assert [str(r["type"]) for r in rows] == ["first"] + [f"t{i % 3}" for i in range(N)]
    assert [json.loads(str(r["data"])) for r in rows[1:]] == [{"i": i} for i in range(N)]
    assert [int(r["at_ms"]) for r in rows[1:]] == [1000 + i for i in range(N)]
    seqs = [int(r["seq"]) for r in rows]
    assert seqs == list(range(seqs[0], seqs[0] + N + 1))  # consecutive, in append order


async def test_a_rolled_back_savepoint_takes_its_appended_rows_with_it(store: Store) -> None:
    async with store.transaction() as tx:
        await events_sql.publish(tx, "kept-1", "n", {}, 1)
        try:
            async with tx.savepoint("part"):
                await events_sql.publish(tx, "dropped", "n", {}, 2)
                raise RuntimeError("undo this part")
        except RuntimeError:
            pass
        await events_sql.publish(tx, "kept-2", "n", {}, 3)
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 10, "")
    assert [str(r["type"]) for r in rows] == ["kept-1", "kept-2"]


def test_insert_rows_names_each_rows_parameters_and_refuses_odd_names() -> None:
    sql, params = insert_rows("events", ("type", "at_ms"), [{"type": "a", "at_ms": 1}, {"type": "b", "at_ms": 2}])
    assert sql == "INSERT INTO events (type, at_ms) VALUES (:type_0, :at_ms_0), (:type_1, :at_ms_1)"
    assert params == {"type_0": "a", "at_ms_0": 1, "type_1": "b", "at_ms_1": 2}
    for table, columns in (("events; DROP", ("type",)), ("events", ("type)",))):
        try:
            insert_rows(table, columns, [{}])
        except ValueError:
            continue
        raise AssertionError(f"{table!r} {columns!r} was accepted")


async def test_the_lease_is_read_once_a_transaction_and_judged_at_each_members_time(store: Store) -> None:
    async with store.transaction() as tx:
        assert await leases_sql.acquire(tx, "gateway:gw-a", "gw-a", 1_000, 20_000)
    async with store.transaction() as tx:
        assert await leases_sql.held(tx, "gateway:gw-a", "gw-a", 1_000, store.dialect)
        assert not await leases_sql.held(tx, "gateway:gw-a", "gw-b", 1_000, store.dialect)
        assert await leases_sql.held(tx, "gateway:gw-a", "gw-a", 20_999, store.dialect)
        assert not await leases_sql.held(tx, "gateway:gw-a", "gw-a", 21_000, store.dialect)  # expired by then
        await leases_sql.release(tx, "gateway:gw-a", "gw-a")
        assert not await leases_sql.held(tx, "gateway:gw-a", "gw-a", 1_000, store.dialect)  # read again
        assert await leases_sql.acquire(tx, "gateway:gw-a", "gw-b", 2_000, 20_000)
        assert await leases_sql.held(tx, "gateway:gw-a", "gw-b", 2_000, store.dialect)
