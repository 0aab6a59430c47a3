"""A process paused inside a transaction does not hold its rows for as long as it stays paused (PostgreSQL).

A gateway frozen (SIGSTOP, a VM migration, a debugger) in the middle of its lease renewal held the `leases`
row locked: the gateway that took over its id, and anything else that touched the row, waited for as long
as the frozen one stayed frozen (seen as a hung CI run). The store's connections set
`idle_in_transaction_session_timeout` (`IDLE_IN_TRANSACTION_S`), so the server ends such a transaction and
its locks; the paused process's next statement then fails as a store error its loop handles.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from bc.store import StoreError, leases
from bc.store import postgres as pg
from bc.store.postgres import PostgresStore
from tests.pg import recycled_schema, schema_url

pytestmark = pytest.mark.postgres


@pytest.fixture
async def two_processes(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    monkeypatch.setattr(pg, "IDLE_IN_TRANSACTION_S", 1)
    async with recycled_schema() as (url, schema):
        a, b = PostgresStore(schema_url(url, schema)), PostgresStore(schema_url(url, schema))
        await a.open(migrate=False)
        await b.open(migrate=False)
        try:
            yield a, b
        finally:
            await a.close()
            await b.close()


async def test_a_transaction_paused_with_a_lease_row_locked_does_not_block_its_successor(
    two_processes: tuple[PostgresStore, PostgresStore],
) -> None:
    frozen, successor = two_processes
    locked, wake = asyncio.Event(), asyncio.Event()

    now_ms = await frozen.now_ms()
    async with frozen.urgent_transaction() as tx:  # the lease, held and committed
        assert await leases.acquire(tx, "gateway:gw-a", "gw-a@old", now_ms, 20_000)

    async def renew_then_freeze() -> None:
        async with frozen.urgent_transaction() as tx:
            await leases.acquire(tx, "gateway:gw-a", "gw-a@old", now_ms, 20_000)
            locked.set()
            await wake.wait()  # paused mid-transaction, the row still locked
            await leases.acquire(tx, "gateway:gw-a", "gw-a@old", now_ms, 20_000)

    paused = asyncio.create_task(renew_then_freeze())
    await locked.wait()
    t0 = time.monotonic()
    async with asyncio.timeout(20):  # without the server's timeout, this waits for as long as the pause lasts
        async with successor.urgent_transaction() as tx:
            await leases.release(tx, "gateway:gw-a", "gw-a@old")
    assert time.monotonic() - t0 < 15
    wake.set()
    with pytest.raises(StoreError):  # the paused one wakes to a store error, not to a lock it lost unseen
        await paused
