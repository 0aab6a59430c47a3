"""The SQLite drivers: migrations, transactions, on-commit callbacks, the clock, leases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from bc.seams.clock import LoopClock
from bc.store import Store, StoreError
from bc.store import leases as leases_sql
from bc.store.catalog import table_names
from bc.store.migrate import migrations
from bc.testing import advance

MakeStore = Callable[[], Store]

TABLES = {
    "nodes",
    "node_sessions",
    "node_certs",
    "join_tokens",
    "leases",
    "node_events",
    "reservations",
    "device_bookings",
    "events",
    "settings",
    "schema_version",
}


async def tables(store: Store) -> set[str]:
    return set(await table_names(store))


async def schema_versions(store: Store) -> list[int]:
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT version FROM schema_version ORDER BY version")
    return [int(r["version"]) for r in rows]


async def count_settings(store: Store) -> int:
    async with store.transaction(write=False) as tx:
        return int(await tx.fetchval("SELECT COUNT(*) FROM settings") or 0)


# -- migrations ---------------------------------------------------------------------


async def test_migrations_create_the_tables(store: Store) -> None:
    assert await tables(store) >= TABLES
    assert await schema_versions(store) == [v for v, _, _ in migrations()]


async def test_reopening_applies_nothing_twice(make_store: MakeStore) -> None:
    first = make_store()
    await first.open()
    try:
        async with first.transaction() as tx:
            await tx.execute("INSERT INTO settings (key, value) VALUES ('k', 'v')")
    finally:
        await first.close()
    for _ in range(2):
        again = make_store()
        await again.open()
        try:
            versions = await schema_versions(again)
            assert versions == [v for v, _, _ in migrations()]
            assert len(versions) == len(set(versions))
            assert await count_settings(again) == 1, "data survives a reopen"
        finally:
            await again.close()


async def test_a_store_newer_than_this_bc_refuses_to_open(make_store: MakeStore) -> None:
    first = make_store()
    await first.open()
    latest = max(v for v, _, _ in migrations())
    try:
        async with first.transaction() as tx:
            await tx.execute(
                "INSERT INTO schema_version (version, name, applied_at_ms) VALUES (:v, 'from_the_future', 0)",
                {"v": latest + 1},
            )
    finally:
        await first.close()
    newer = make_store()
    try:
        with pytest.raises(StoreError, match="newer"):
            await newer.open()
    finally:
        await newer.close()


# -- transactions -----------------------------------------------------------------------


async def test_a_transaction_that_raises_rolls_back(store: Store) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with store.transaction() as tx:
            await tx.execute("INSERT INTO settings (key, value) VALUES ('a', '1')")
            assert await tx.fetchval("SELECT value FROM settings WHERE key = 'a'") == "1"
            raise RuntimeError("boom")
    assert await count_settings(store) == 0
    async with store.transaction() as tx:  # the store is usable afterwards
        await tx.execute("INSERT INTO settings (key, value) VALUES ('b', '2')")
    assert await count_settings(store) == 1


async def test_a_failing_statement_is_a_store_error_and_rolls_back(store: Store) -> None:
    with pytest.raises(StoreError):
        async with store.transaction() as tx:
            await tx.execute("INSERT INTO settings (key, value) VALUES ('a', '1')")
            await tx.execute("INSERT INTO settings (key, value) VALUES ('a', '2')")  # primary key
    assert await count_settings(store) == 0


async def test_execute_returns_the_rows_changed(store: Store) -> None:
    async with store.transaction() as tx:
        assert await tx.execute("INSERT INTO settings (key, value) VALUES ('a', '1'), ('b', '1')") == 2
        assert await tx.execute("UPDATE settings SET value = '2' WHERE value = '1'") == 2
        assert await tx.execute("UPDATE settings SET value = '3' WHERE key = 'zzz'") == 0
        assert await tx.fetchone("SELECT * FROM settings WHERE key = 'zzz'") is None
        assert await tx.fetchall("SELECT key FROM settings ORDER BY key") == [{"key": "a"}, {"key": "b"}]


async def test_fetchtuples_gives_the_rows_fetchall_gives_in_column_order(store: Store) -> None:
    query = "SELECT value, key, NULL AS absent FROM settings ORDER BY key"
    async with store.transaction() as tx:  # a write transaction (inline on the threaded SQLite store)
        await tx.execute("INSERT INTO settings (key, value) VALUES ('a', '1'), ('b', '2')")
        assert await tx.fetchtuples(query) == [("1", "a", None), ("2", "b", None)]
        assert await tx.fetchtuples("UPDATE settings SET value = '3' WHERE key = 'zzz'") == []
    async with store.transaction(write=False) as tx:  # a read (the threaded store's thread)
        assert await tx.fetchtuples(query) == [tuple(r.values()) for r in await tx.fetchall(query)]
        assert await tx.fetchtuples("SELECT key FROM settings WHERE key > :k", {"k": "a"}) == [("b",)]
    with pytest.raises(StoreError):
        async with store.transaction(write=False) as tx:
            await tx.fetchtuples("SELECT nope FROM settings")


async def test_on_commit_runs_after_commit_and_never_after_rollback(store: Store) -> None:
    calls: list[str] = []
    async with store.transaction() as tx:
        await tx.execute("INSERT INTO settings (key, value) VALUES ('a', '1')")
        tx.on_commit(lambda: calls.append("first"))
        tx.on_commit(lambda: calls.append("second"))
        assert calls == []
    assert calls == ["first", "second"]
    assert await count_settings(store) == 1

    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await tx.execute("INSERT INTO settings (key, value) VALUES ('b', '1')")
            tx.on_commit(lambda: calls.append("rolled-back"))
            raise RuntimeError("boom")
    assert calls == ["first", "second"]
    assert await count_settings(store) == 1


async def test_on_commit_runs_once_the_data_is_visible_to_other_transactions(store: Store) -> None:
    """A poke after commit must find the data when the woken side re-reads the store."""
    seen: list[int] = []
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []

    async def reread() -> None:
        seen.append(await count_settings(store))

    async with store.transaction() as tx:
        await tx.execute("INSERT INTO settings (key, value) VALUES ('a', '1')")
        tx.on_commit(lambda: tasks.append(loop.create_task(reread())))
    await asyncio.gather(*tasks)
    assert seen == [1]


# -- the clock ---------------------------------------------------------------------------


async def test_now_follows_the_injected_clock(store: Store, clock: LoopClock) -> None:
    t0 = await store.now()
    assert t0 == clock.now()
    assert await store.now_ms() == round(clock.now() * 1000)
    await advance(12.5)
    assert await store.now() == t0 + 12.5
    assert await store.now_ms() == round((t0 + 12.5) * 1000)


# -- leases -------------------------------------------------------------------------------


async def acquire(store: Store, holder: str, ttl_ms: int = 10_000) -> bool:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await leases_sql.acquire(tx, "worker:test", holder, now_ms, ttl_ms)


async def lease_row(store: Store) -> tuple[str, int]:
    async with store.transaction(write=False) as tx:
        row = await tx.fetchone("SELECT holder, expires_at_ms FROM leases WHERE name = 'worker:test'")
    assert row is not None
    return str(row["holder"]), int(row["expires_at_ms"])


async def test_a_lease_is_taken_renewed_refused_and_taken_over(store: Store, clock: LoopClock) -> None:
    assert await acquire(store, "a")
    _, expires = await lease_row(store)
    assert expires == await store.now_ms() + 10_000

    await advance(5)
    assert await acquire(store, "a"), "the holder renews"
    _, renewed = await lease_row(store)
    assert renewed == await store.now_ms() + 10_000
    assert renewed > expires

    await advance(9)
    assert not await acquire(store, "b"), "another holder is refused before expiry"
    assert await lease_row(store) == ("a", renewed)

    await advance(2)  # past the renewed expiry
    assert await acquire(store, "b"), "after expiry another holder takes over"
    holder, _ = await lease_row(store)
    assert holder == "b"
    assert not await acquire(store, "a"), "the old holder cannot take it back while b holds it"


async def test_a_released_lease_is_free(store: Store) -> None:
    assert await acquire(store, "a")
    async with store.transaction() as tx:
        await leases_sql.release(tx, "worker:test", "b")  # not b's to release
    assert not await acquire(store, "b")
    async with store.transaction() as tx:
        await leases_sql.release(tx, "worker:test", "a")
    assert await acquire(store, "b")
