"""Group commit (`bc.store.group_commit`) on every driver: batches form on their own, a caller is answered
only after its write committed, and one failing member costs the others nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from bc.store import Store, StoreError, Tx
from bc.store import events as events_sql
from bc.store import settings as settings_sql
from bc.store.group_commit import GroupCommit


async def setting(store: Store, key: str) -> str | None:
    async with store.transaction(write=False) as tx:
        return await settings_sql.get(tx, key)


def put(key: str, value: str) -> Callable[[Tx], Awaitable[str]]:
    async def work(tx: Tx) -> str:
        await settings_sql.put(tx, key, value)
        await events_sql.publish(tx, "test.put", key, {"value": value}, 0)
        return value

    return work


async def test_concurrent_callers_share_transactions_and_each_reads_its_write_once_answered(store: Store) -> None:
    group = GroupCommit(store)
    committed: list[str] = []

    async def caller(i: int) -> None:
        value = await group.run(put(f"k{i}", f"v{i}"))
        assert value == f"v{i}"
        assert await setting(store, f"k{i}") == f"v{i}", "answered before its write was durable"
        committed.append(value)

    await asyncio.gather(*(caller(i) for i in range(50)))
    assert len(committed) == 50
    assert group.stats.transactions >= 1 and group.stats.members >= 2, "no batch formed"
    assert group.stats.transactions < 50
    async with store.transaction(write=False) as tx:
        events = await events_sql.list_events(tx, 0, 100, "test.put")
    assert sorted(str(e["subject"]) for e in events) == sorted(f"k{i}" for i in range(50))


async def test_a_member_that_raises_gets_its_error_and_the_others_commit_without_its_writes(store: Store) -> None:
    group = GroupCommit(store)

    async def bad(tx: Tx) -> None:
        await settings_sql.put(tx, "bad", "written before the error")
        await events_sql.publish(tx, "test.put", "bad", {}, 0)
        raise ValueError("a handler bug")

    results = await asyncio.gather(
        group.run(put("a", "1")),
        group.run(bad),
        group.run(put("b", "2")),
        return_exceptions=True,
    )
    assert results[0] == "1" and results[2] == "2"
    assert isinstance(results[1], ValueError)
    assert group.stats.split == 1
    assert (await setting(store, "a"), await setting(store, "b"), await setting(store, "bad")) == ("1", "2", None)
    async with store.transaction(write=False) as tx:
        subjects = [str(e["subject"]) for e in await events_sql.list_events(tx, 0, 100, "test.put")]
    assert sorted(subjects) == ["a", "b"], "a rolled-back member's event was appended"


class FailingCommits(Store):
    """The store, whose next `fail` transactions fail as a lost connection fails a COMMIT: after the work ran."""

    def __init__(self, inner: Store, fail: int) -> None:
        self.inner, self.fail, self.dialect = inner, fail, inner.dialect
        self.committed_batches: list[int] = []

    async def open(self, *, migrate: bool = True) -> None:
        del migrate

    async def close(self) -> None:
        pass

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        async with self.inner._begin(write) as tx:
            yield tx
            if self.fail:
                self.fail -= 1
                raise StoreError("the store is unreachable: connection lost in COMMIT")

    async def now(self) -> float:
        return await self.inner.now()

    @property
    def description(self) -> str:
        return f"{self.inner.description} (failing commits)"


async def test_a_failed_commit_answers_no_member_as_written_and_each_is_retried_alone(store: Store) -> None:
    failing = FailingCommits(store, fail=2)  # the batch's commit, then the first member's own
    group = GroupCommit(failing)
    results = await asyncio.gather(
        *(group.run(put(f"k{i}", f"v{i}")) for i in range(3)),
        return_exceptions=True,
    )
    assert isinstance(results[0], StoreError)
    assert results[1:] == ["v1", "v2"]
    assert group.stats.split == 1 and group.stats.transactions == 0
    assert [await setting(store, f"k{i}") for i in range(3)] == [None, "v1", "v2"]


async def test_a_cancelled_caller_leaves_its_write_to_happen_and_the_rest_are_answered(store: Store) -> None:
    group = GroupCommit(store)
    gone = asyncio.ensure_future(group.run(put("gone", "x")))
    stays = asyncio.ensure_future(group.run(put("stays", "y")))
    await asyncio.sleep(0)
    gone.cancel()
    assert await stays == "y"
    with pytest.raises(asyncio.CancelledError):
        await gone
    await group.wait_idle()
    assert await setting(store, "gone") == "x", "a cancelled caller's write is unknown to it, not undone"
