"""Group commit: the writes of many callers in one transaction, each caller answered after that commit.

One shape serves the server's store (`bc.store.group_commit`, a gateway's hundreds of sessions) and the
agent's journal (`agent.journal_batch`, a fan-out's many commands in flight): a transaction apiece spends its
time in BEGIN, COMMIT and the commit's fsync, one at a time. `GroupCommit.run(work)` queues `work`, a function
of a transaction, and returns its result once a transaction holding it has committed: so a caller that acks
what it wrote acks only what is durable.

Batches form on their own, with no timer and no added latency: every caller that arrives while a transaction
is being written waits for the next one, which takes them all (up to `max_batch`). Two ways to start:

* lazy (the store): the first caller starts a flush, which lets the loop turn once so the callers already
  running join it; on an idle store a batch is one member.
* eager (the journal): a caller that finds nothing in flight runs at once in a transaction of its own, and
  only writes that arrive during a commit queue. A transaction whose commit never suspends (the simulator's
  inline connection) therefore never forms a batch, and nothing suspends that did not before.

One member's failure must not cost the others their writes, nor be hidden: a batch whose work raises is rolled
back whole and then each member is run alone, in a transaction of its own, and answered with its own result
or exception. So `work` must be safe to run twice against a rolled-back transaction: everything it changes is
in the transaction (what should happen after the commit is registered with the store's `tx.on_commit`, which
a rolled-back transaction never runs). A failed COMMIT is the policy's choice (`split_failed_commit`): the
store runs each member again alone; the journal fails every member, because a commit that reported failure
may still have reached the disk, and re-running `accept` over its own entry would be a conflict, not a retry.

A caller cancelled while it waits leaves its member queued: the write happens (or not) as if the caller were
still there, and only the answer is lost, which a caller must treat as "unknown", as it would a transaction of
its own cancelled in its COMMIT.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bc.runtime.aio import answer, retrieved

T = TypeVar("T")
TxT = TypeVar("TxT")

MAX_BATCH = 256
"""Members per transaction: bounds how long one transaction holds the single writer (or the journal's lock)."""


@dataclass
class _Member(Generic[TxT, T]):
    work: Callable[[TxT], Awaitable[T]]
    done: asyncio.Future[T]


@dataclass
class GroupStats:
    transactions: int = 0
    """Transactions committed for batches of more than one member."""
    members: int = 0
    """Members committed in those batched transactions."""
    split: int = 0
    """Batches rolled back and re-run member by member (a member raised, or a split-policy commit failed)."""
    failed: int = 0
    """Batched commits that failed, failing every member (the fail policy)."""


class _CommitFailed(Exception):
    """Every member's work ran, then the transaction's end (COMMIT) raised `__cause__`."""


class GroupCommit(Generic[TxT]):
    def __init__(
        self,
        transaction: Callable[[], AbstractAsyncContextManager[TxT]],
        *,
        eager: bool,
        split_failed_commit: bool,
        log: logging.Logger,
        event: str,
        max_batch: int = MAX_BATCH,
    ) -> None:
        """`transaction()` opens one transaction (and holds whatever lock guards it), commits when its block
        ends, rolls back when the block raises. `event` names the log lines (`event=<event>.split` ...)."""
        self._transaction = transaction
        self._eager, self._split_failed_commit = eager, split_failed_commit
        self._log, self._event = log, event
        self.max_batch = max_batch
        self.stats = GroupStats()
        self._queue: list[_Member[TxT, Any]] = []
        self._busy = False  # eager: a write is in its transaction, or the flusher is draining the queue
        self._flusher: asyncio.Task[None] | None = None

    async def run(self, work: Callable[[TxT], Awaitable[T]]) -> T:
        """`work(tx)`'s result, after the transaction that ran it committed; its exception if it raised."""
        if self._eager and not self._busy:
            self._busy = True
            try:
                return await self._alone(work)
            finally:
                if self._queue:  # they arrived during this commit: the next transaction takes them all
                    self._flusher = asyncio.create_task(self._drain(first_turn=False), name=f"{self._event}-flush")
                else:
                    self._busy = False
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Member(work, fut))
        if not self._eager and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.create_task(self._drain(first_turn=True), name=f"{self._event}-flush")
        if self._eager:
            # Awaited bare, not shielded: a caller cancelled here cancels its future, so its answer is dropped
            # (`answer` skips a done future) and no exception is left unread; its member stays queued.
            return await fut
        fut.add_done_callback(retrieved)  # a caller that was cancelled never reads its answer
        return await asyncio.shield(fut)  # as the store always has: its wake-ups (and so a simulation's) unchanged

    async def wait_idle(self) -> None:
        """Until every queued member is answered (before the store or the connection closes)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _drain(self, *, first_turn: bool) -> None:
        batch: list[_Member[TxT, Any]] = []
        try:
            if first_turn:
                await asyncio.sleep(0)  # the callers already running this turn of the loop join the first batch
            while self._queue:
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                await self._commit(batch)
                batch = []
        except BaseException as e:
            # Cancelled, or a failure outside any member: nobody may be left waiting (those answered are skipped).
            queued, self._queue = batch + self._queue, []
            for m in queued:
                answer(m.done, exc=e if isinstance(e, Exception) else asyncio.CancelledError())
            if not isinstance(e, Exception):
                raise
            self._log.error("event=%s.failed members=%d error=%s", self._event, len(queued), e)
        finally:
            self._busy = False

    async def _alone(self, work: Callable[[TxT], Awaitable[T]]) -> T:
        async with self._transaction() as tx:
            return await work(tx)

    async def _commit(self, batch: list[_Member[TxT, Any]]) -> None:
        if len(batch) == 1:
            return await self._answer_alone(batch[0])
        results: list[Any] = []
        try:
            await self._batch(batch, results)
        except asyncio.CancelledError:
            for m in batch:
                answer(m.done, exc=asyncio.CancelledError())
            raise
        except _CommitFailed as failed:
            e = failed.__cause__ if isinstance(failed.__cause__, Exception) else failed
            if not self._split_failed_commit:
                self.stats.failed += 1
                self._log.error("event=%s.commit-failed members=%d error=%s", self._event, len(batch), e)
                for m in batch:
                    answer(m.done, exc=e)
                return None
            await self._split(batch, e)
            return None
        except Exception as e:
            await self._split(batch, e)
            return None
        self.stats.transactions += 1
        self.stats.members += len(batch)
        for m, r in zip(batch, results, strict=True):
            answer(m.done, result=r)
        return None

    async def _batch(self, batch: list[_Member[TxT, Any]], results: list[Any]) -> None:
        """Every member's work in one transaction; a failure of its end (COMMIT) comes out as `_CommitFailed`."""
        ran = False
        try:
            async with self._transaction() as tx:
                for m in batch:
                    results.append(await m.work(tx))
                ran = True
        except Exception as e:
            if ran:
                raise _CommitFailed() from e
            raise

    async def _split(self, batch: list[_Member[TxT, Any]], e: Exception) -> None:
        self.stats.split += 1
        self._log.info("event=%s.split members=%d error=%s", self._event, len(batch), e)
        for m in batch:
            await self._answer_alone(m)

    async def _answer_alone(self, m: _Member[TxT, Any]) -> None:
        try:
            r = await self._alone(m.work)
        except asyncio.CancelledError:
            answer(m.done, exc=asyncio.CancelledError())
            raise
        except Exception as e:
            answer(m.done, exc=e)
            return
        answer(m.done, result=r)
