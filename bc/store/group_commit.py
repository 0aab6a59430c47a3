"""Group commit for the store: the writes of many sessions in one transaction, each answered after that commit.

The shape is `bc.runtime.group_commit`'s (shared with the agent's journal); this is the store's policy of it.

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

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bc.runtime import group_commit
from bc.runtime.group_commit import MAX_BATCH
from bc.store.base import Store, Tx

log = logging.getLogger("bc.store.group_commit")

T = TypeVar("T")
Work = Callable[[Tx], Awaitable[T]]


class GroupCommit(group_commit.GroupCommit[Tx]):
    """Lazy batches (the first caller starts a flush); a failed COMMIT is split, each member run again alone."""

    def __init__(self, store: Store, *, max_batch: int = MAX_BATCH) -> None:
        super().__init__(
            store.transaction, eager=False, split_failed_commit=True, log=log, event="group-commit", max_batch=max_batch
        )
        self.store = store
