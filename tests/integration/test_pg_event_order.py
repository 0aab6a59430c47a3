"""Events are numbered in commit order across processes (PostgreSQL only).

Watch, `bc jobs watch` and ListEvents follow the log with `seq > after`. With several `bc serve`
processes on one database, a number drawn in the middle of a transaction can commit after a higher
one: a follower that read 11 and moved its cursor there would never see 10. Each store here is a
process of its own (its own pool and write lock), the two transactions interleave the way that lost
events, and a follower must still see every event exactly once, in the order they committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bc.store import events
from bc.store.postgres import PostgresStore
from tests.pg import recycled_schema, schema_url

pytestmark = pytest.mark.postgres


@pytest.fixture
async def two() -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    async with recycled_schema() as (url, schema):
        a = PostgresStore(schema_url(url, schema), pool_max=2)
        b = PostgresStore(schema_url(url, schema), pool_max=2)
        await a.open(migrate=False)
        await b.open(migrate=False)
        try:
            yield a, b
        finally:
            await a.close()
            await b.close()


async def follow(store: PostgresStore, after: int) -> list[tuple[int, str]]:
    async with store.transaction(write=False) as tx:
        return [(int(r["seq"]), str(r["subject"])) for r in await events.list_events(tx, after, 100)]


async def test_an_event_published_first_and_committed_last_is_not_skipped_by_a_follower(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    start = await follow(a, 0)
    cursor = start[-1][0] if start else 0
    published = asyncio.Event()
    commit_a = asyncio.Event()

    async def slow() -> None:
        async with a.transaction() as tx:
            await events.publish(tx, "test.order", "first-published", {}, 1)
            await tx.execute("SELECT 1")  # the transaction goes on after publishing
            published.set()
            await commit_a.wait()

    task = asyncio.create_task(slow())
    await published.wait()
    async with b.transaction() as tx:
        await events.publish(tx, "test.order", "second-published", {}, 2)

    seen = await follow(b, cursor)
    assert [s for _, s in seen] == ["second-published"]
    cursor = seen[-1][0]
    commit_a.set()
    await task
    later = await follow(b, cursor)
    assert [s for _, s in later] == ["first-published"], "the follower's cursor had passed it"
    assert later[0][0] > cursor


async def test_many_writers_in_two_processes_and_a_follower_see_every_event_once(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    start = await follow(a, 0)
    cursor = start[-1][0] if start else 0
    per_writer = 40
    done = asyncio.Event()

    async def writer(store: PostgresStore, name: str) -> None:
        for i in range(per_writer):
            async with store.transaction() as tx:
                await events.publish(tx, "test.order", f"{name}-{i}", {}, i)
                await tx.execute("SELECT pg_sleep(0.001)")

    seen: list[str] = []

    async def follower() -> None:
        nonlocal cursor
        while True:
            finished = done.is_set()
            for seq, subject in await follow(b, cursor):
                seen.append(subject)
                cursor = seq
            if finished:
                return
            await asyncio.sleep(0)

    f = asyncio.create_task(follower())
    await asyncio.gather(*(writer(s, f"{s_name}{w}") for s, s_name in ((a, "a"), (b, "b")) for w in range(2)))
    done.set()
    await f
    assert len(seen) == len(set(seen)) == 4 * per_writer
