"""Group commit for the journal: concurrent commands' writes share one fsynced transaction.

An agent running a fan-out has many commands between `accepted` and `done` at once (every lane's workers,
the session's acks), and each write used to be a transaction of its own: one fsync, and one trip to the
connection's thread, apiece. `CommitGroups.run(work)` runs `work` (a few statements of one journal write)
inside a transaction and returns its result only once that transaction has committed, so `accepted` is
still on the disk before the side effect starts and a result is acked only once it is durable.

Batches form on their own, with no timer: a write that finds no commit in flight runs at once, in a
transaction of its own, exactly as before; writes that arrive while a commit is in flight (the fsync is on
the connection's thread) queue, and the next transaction takes them all (up to `max_batch`). A connection
whose commit never suspends (the simulator's inline one) therefore never forms a batch: every write runs
where it was issued and nothing suspends that did not before, so a run stays a function of its seed.

The server's `bc.store.group_commit` has the same shape; two rules differ, for what the journal promises:

* a member whose work raises (a transition the rules refuse, an unknown command) costs the others
  nothing: the batch is rolled back and each member runs again alone, answered with its own outcome; its
  work must therefore change nothing outside the transaction;
* a commit that fails fails every member, as a single write's failed commit fails its caller, and none is
  run again: a commit that reported failure may still have reached the disk, and re-running `accept` over
  its own entry would be a conflict, not a retry.

Caller cancelled while queued: its member stays queued and the write happens or not as if it were still
there; only the answer is lost, as with a cancelled commit of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bc.aio import answer

log = logging.getLogger("agent.journal")

T = TypeVar("T")
Work = Callable[[], Awaitable[T]]

MAX_BATCH = 256
"""Members per transaction: bounds how long one transaction holds the journal's lock from its readers."""


@dataclass
class _Member(Generic[T]):
    work: Work[T]
    done: asyncio.Future[T]


@dataclass
class BatchStats:
    transactions: int = 0
    """Transactions committed for batches of more than one member."""
    members: int = 0
    """Members committed in those batched transactions."""
    split: int = 0
    """Batches rolled back and re-run member by member because a member raised."""
    failed: int = 0
    """Batched commits that failed, failing every member."""


@dataclass(frozen=True)
class TxSteps:
    """How to open, commit and abandon one transaction on the journal's connection."""

    begin: Callable[[], Awaitable[None]]
    commit: Callable[[], Awaitable[None]]
    rollback: Callable[[], Awaitable[None]]
    """Safe to call whether or not a transaction is still open (a failed COMMIT may have ended it)."""


async def commit_or_abandon(steps: TxSteps) -> None:
    """COMMIT; if it fails, roll back what it left open (a failed COMMIT may leave the transaction open)."""
    try:
        await steps.commit()
    except asyncio.CancelledError:
        raise  # the COMMIT still runs on the connection's thread: its outcome is unknown, never rolled back
    except BaseException:
        await steps.rollback()
        raise


class CommitGroups:
    def __init__(self, lock: asyncio.Lock, steps: TxSteps, *, max_batch: int = MAX_BATCH) -> None:
        """`lock` is the journal's: held for each transaction, so no other unit of work joins it."""
        self._lock, self._steps, self.max_batch = lock, steps, max_batch
        self.stats = BatchStats()
        self._queue: list[_Member[Any]] = []
        self._busy = False  # a write is in its transaction, or the flusher is draining the queue
        self._flusher: asyncio.Task[None] | None = None

    async def run(self, work: Work[T]) -> T:
        """`work()`'s result once the transaction that ran it has committed; its exception if it raised."""
        if self._busy:
            # Awaited bare, not shielded: a caller cancelled here cancels its future, so its answer is
            # dropped (`answer` skips a done future) and no exception is left unread, at no cost per write.
            fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            self._queue.append(_Member(work, fut))
            return await fut
        self._busy = True
        try:
            async with self._lock:
                return await self._alone(work)
        finally:
            if self._queue:  # they arrived during this commit: the next transaction takes them all
                self._flusher = asyncio.create_task(self._drain(), name="journal-group-commit")
            else:
                self._busy = False

    async def wait_idle(self) -> None:
        """Until every queued write is answered (before the connection closes)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _drain(self) -> None:
        batch: list[_Member[Any]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                async with self._lock:  # released between batches, so reads are not starved
                    await self._commit(batch)
                batch = []
        except BaseException as e:
            # Cancelled, or a BEGIN that failed: nobody may be left waiting (those answered are skipped).
            queued, self._queue = batch + self._queue, []
            for m in queued:
                answer(m.done, exc=e if isinstance(e, Exception) else asyncio.CancelledError())
            if not isinstance(e, Exception):
                raise
            log.error("event=journal.batch-failed members=%d error=%s", len(queued), e)
        finally:
            self._busy = False

    async def _alone(self, work: Work[T]) -> T:
        await self._steps.begin()
        try:
            result = await work()
        except BaseException:
            await self._steps.rollback()
            raise
        await commit_or_abandon(self._steps)
        return result

    async def _commit(self, batch: list[_Member[Any]]) -> None:
        if len(batch) == 1:
            return await self._answer_alone(batch[0])
        await self._steps.begin()
        results: list[Any] = []
        try:
            for m in batch:
                results.append(await m.work())
        except asyncio.CancelledError:
            await self._steps.rollback()
            for m in batch:
                answer(m.done, exc=asyncio.CancelledError())
            raise
        except Exception as e:
            await self._steps.rollback()
            self.stats.split += 1
            log.info("event=journal.batch-split members=%d error=%s", len(batch), e)
            for m in batch:
                await self._answer_alone(m)
            return None
        try:
            await commit_or_abandon(self._steps)
        except BaseException as e:
            self.stats.failed += 1
            log.error("event=journal.batch-commit-failed members=%d error=%s", len(batch), e)
            for m in batch:
                answer(m.done, exc=e)
            if isinstance(e, asyncio.CancelledError):
                raise
            return None
        self.stats.transactions += 1
        self.stats.members += len(batch)
        for m, r in zip(batch, results, strict=True):
            answer(m.done, result=r)
        return None

    async def _answer_alone(self, m: _Member[Any]) -> None:
        try:
            r = await self._alone(m.work)
        except asyncio.CancelledError:
            answer(m.done, exc=asyncio.CancelledError())
            raise
        except Exception as e:
            answer(m.done, exc=e)
            return
        answer(m.done, result=r)
