"""A lease renewal never queues behind this process's other work (PostgreSQL only).

During a reconnect storm a gateway's write lock has a queue (Hellos, status and liveness flushes) and
its pool's connections are all taken. A renewal that waited behind them would miss its 10 s and fence
the gateway in the middle of the storm it serves (seen at 1,000 nodes on a loaded machine). The
renewal runs on a connection of its own, outside both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from bc.store import StoreError, leases
from bc.store.postgres import PostgresStore
from tests.pg import recycled_schema, schema_url

pytestmark = pytest.mark.postgres


@pytest.fixture
async def store() -> AsyncIterator[PostgresStore]:
    async with recycled_schema() as (url, schema):
        s = PostgresStore(schema_url(url, schema), pool_max=2)
        await s.open(migrate=False)
        try:
            yield s
        finally:
            await s.close()


async def renew(store: PostgresStore) -> bool:
    now_ms = await store.now_ms()
    async with store.urgent_transaction() as tx:
        return await leases.acquire(tx, "gateway:gw-a", "gw-a", now_ms, 20_000)


async def test_a_renewal_runs_while_the_write_lock_and_every_pool_connection_are_taken(store: PostgresStore) -> None:
    release = asyncio.Event()
    holding = 0
    all_held = asyncio.Event()

    async def hold(write: bool) -> None:
        nonlocal holding
        async with store.transaction(write=write):
            holding += 1
            if holding == 2:
                all_held.set()
            await release.wait()

    holders = [asyncio.create_task(hold(True)), asyncio.create_task(hold(False))]  # the lock and both connections
    queued = asyncio.create_task(hold(True))  # and a write queued behind them
    try:
        await all_held.wait()
        async with asyncio.timeout(10):
            assert await renew(store)
            assert await renew(store)  # renewed again on the same connection
        assert not queued.done()  # the queue is still there: the renewal went around it
    finally:
        release.set()
        await asyncio.gather(*holders, queued)
    async with store.transaction(write=False) as tx:
        assert await leases.held(tx, "gateway:gw-a", "gw-a", await store.now_ms(), store.dialect)


async def test_a_renewal_on_a_dead_connection_fails_once_and_the_next_reconnects(store: PostgresStore) -> None:
    assert await renew(store)
    conn = store._urgent_conn
    assert conn is not None
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    with pytest.raises(StoreError):
        await renew(store)  # the dead connection fails this one renewal: the fence counts it as missed
    assert await renew(store)
