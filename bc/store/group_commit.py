"""Group commit: the writes of many sessions in one transaction, each caller answered after that commit.

The gateway's hot paths (a status report, a command update, a batch of node events) are each a short
transaction of a few statements, and one `bc serve` serves hundreds of sessions: a transaction apiece
spends its time in BEGIN, COMMIT and the commit's fsync, one at a time (SQLite has one writer; the
PostgreSQL driver serializes a process's writes). `GroupCommit.run(work)` queues `work`, a function of
a transaction, and returns its result once a transaction holding it has committed: so a caller that
acks what it wrote acks only what is durable.

Batches form on their own, with no timer and no added latency: the first caller starts a flush, every
caller that arrives while a transaction is being written waits for the next one, which takes them all
(up to `max_batch`). On an idle gateway a batch is one member.

One member's failure must not cost the others their writes, nor be hidden: a batch whose work raises,
or whose commit fails, is rolled back whole and then each member is run alone, in a transaction of its
own, and answered with its own result or exception. So `work` must be safe to run twice against a
rolled-back transaction: everything it changes is in the transaction, and what should happen after the
commit is registered with `tx.on_commit` (which a rolled-back transaction never runs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bc.aio import answer, retrieved
from bc.store.base import Store, Tx

log = logging.getLogger("bc.store.group_commit")

T = TypeVar("T")
Work = Callable[[Tx], Awaitable[T]]

MAX_BATCH = 256
"""Members per transaction: bounds how long one transaction holds the store's single writer."""


@dataclass
class _Member(Generic[T]):
    work: Work[T]
    done: asyncio.Future[T]


@dataclass
class GroupStats:
    transactions: int = 0
    """Transactions committed for batches of more than one member."""
    members: int = 0
    """Members committed in those batched transactions."""
    split: int = 0
    """Batches rolled back and re-run member by member (a member raised, or the commit failed)."""


class GroupCommit:
    def __init__(self, store: Store, *, max_batch: int = MAX_BATCH) -> None:
        self.store = store
        self.max_batch = max_batch
        self.stats = GroupStats()
        self._queue: list[_Member[Any]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def run(self, work: Work[T]) -> T:
        """`work(tx)`'s result, after the transaction that ran it committed; its exception if it raised.

        A caller cancelled while it waits leaves its member queued: the write happens (or not) as if the
        caller were still there, and only the answer is lost — which a caller must treat as "unknown",
        as it would a transaction of its own cancelled in its COMMIT.
        """
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(retrieved)  # a caller that was cancelled never reads its answer
        self._queue.append(_Member(work, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="group-commit")
        return await asyncio.shield(fut)

    async def wait_idle(self) -> None:
        """Until every queued member is answered (before the store closes)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)  # the callers already running this turn of the loop join the first batch
            while self._queue:
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                await self._commit(batch)
        except asyncio.CancelledError:
            queued, self._queue = self._queue, []
            for m in queued:
                answer(m.done, exc=asyncio.CancelledError())
            raise

    async def _commit(self, batch: list[_Member[Any]]) -> None:
        if len(batch) == 1:
            await self._alone(batch[0])
            return
        try:
            results: list[Any] = []
            async with self.store.transaction() as tx:
                for m in batch:
                    results.append(await m.work(tx))
        except asyncio.CancelledError:
            for m in batch:
                answer(m.done, exc=asyncio.CancelledError())
            raise
        except Exception as e:
            self.stats.split += 1
            log.info("event=group-commit.split members=%d error=%s", len(batch), e)
            for m in batch:
                await self._alone(m)
            return
        self.stats.transactions += 1
        self.stats.members += len(batch)
        for m, r in zip(batch, results, strict=True):
            answer(m.done, result=r)

    async def _alone(self, m: _Member[Any]) -> None:
        try:
            async with self.store.transaction() as tx:
                r = await m.work(tx)
        except asyncio.CancelledError:
            answer(m.done, exc=asyncio.CancelledError())
            raise
        except Exception as e:
            answer(m.done, exc=e)
            return
        answer(m.done, result=r)
