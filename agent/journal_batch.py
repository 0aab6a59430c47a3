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

The shape is `bc.runtime.group_commit`'s, shared with the server's store (`bc.store.group_commit`); two rules
differ, for what the journal promises:

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
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from bc.runtime import group_commit
from bc.runtime.group_commit import MAX_BATCH

log = logging.getLogger("agent.journal")


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


@contextlib.asynccontextmanager
async def one_transaction(steps: TxSteps) -> AsyncIterator[None]:
    """One fsynced transaction: committed when the block ends, rolled back when it raises (the caller holds
    the journal's lock)."""
    await steps.begin()
    try:
        yield
    except BaseException:
        await steps.rollback()
        raise
    await commit_or_abandon(steps)


class CommitGroups(group_commit.GroupCommit[None]):
    """Eager batches (a write that finds no commit in flight runs at once); a failed COMMIT fails every member."""

    def __init__(self, lock: asyncio.Lock, steps: TxSteps, *, max_batch: int = MAX_BATCH) -> None:
        """`lock` is the journal's: held for each transaction, so no other unit of work joins it."""

        @contextlib.asynccontextmanager
        async def transaction() -> AsyncIterator[None]:
            async with lock, one_transaction(steps):
                yield

        super().__init__(
            transaction,
            eager=True,
            split_failed_commit=False,
            log=log,
            event="journal.group-commit",
            max_batch=max_batch,
        )
