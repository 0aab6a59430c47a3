"""The Store interface: one async API over SQLite and PostgreSQL.

Callers write SQL once, in the subset both engines share (`ON CONFLICT`,
`RETURNING`, named parameters `:name`), inside `bc.store` only. A driver
translates the parameter style and supplies the dialect hooks where the
engines differ (`for_update()`: `FOR UPDATE SKIP LOCKED` on PostgreSQL,
nothing on SQLite, which has one writer).

`transaction()` is the only way to touch data. A write transaction on SQLite
is `BEGIN IMMEDIATE`, so it holds the write lock from its first statement
and never fails half-way on a lock upgrade. Callbacks registered with
`Tx.on_commit()` run after a successful commit (pokes to gateways), never
after a rollback.

`now()` is the store's clock (the reference's `compute_now()`): business time
for the control plane. For the embedded store it is the injected Clock of the
one process; for PostgreSQL it is the database's clock.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from bc.errors import Unavailable

Row = dict[str, Any]
Params = Mapping[str, Any]


class StoreError(Unavailable):
    """The store failed (unreachable, a connection lost mid-transaction, a constraint broken); the message
    says which. An `Unavailable`: an Admin call that meets it answers UNAVAILABLE in one sentence, and
    the CLI exits 5, instead of an internal error."""


class StoreUnreachable(StoreError):
    """The store could not be reached as it was opened (refused, timed out, failing over): a process starting
    now may wait for it (`bc serve` does, saying why at each attempt). A store that answered and refused
    (a corrupt file, a failed migration) is a plain `StoreError`: waiting would not change it."""


APPEND_ROWS_PER_INSERT = 200
"""Rows a multi-row INSERT of `Tx.append_at_commit` carries at most (SQLite's bound on a statement's
parameters is 32,766; an event row has four)."""


def insert_rows(table: str, columns: tuple[str, ...], rows: list[Params]) -> tuple[str, dict[str, Any]]:
    """One INSERT of `rows` (each a mapping of `columns`), its parameters named `<column>_<row>`."""
    if not table.isidentifier() or not all(c.isidentifier() for c in columns):
        raise ValueError(f"not a table or column name: {table!r} {columns!r}")
    values = ", ".join("(" + ", ".join(f":{c}_{k}" for c in columns) + ")" for k in range(len(rows)))
    params = {f"{c}_{k}": row[c] for k, row in enumerate(rows) for c in columns}
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES {values}", params


def id_range(column: str, after: str | None, through: str | None) -> tuple[str, dict[str, str]]:
    """` AND` clauses bounding `column` to (after, through], and their parameters."""
    sql, params = "", {}  # the names are fixed, the values parameters: nothing of the caller's is spliced in
    if after is not None:
        sql, params["after"] = f" AND {column} > :after", after
    if through is not None:
        sql, params["through"] = f"{sql} AND {column} <= :through", through
    return sql, params


class Tx(abc.ABC):
    """One transaction. Statements use named parameters (`:name`)."""

    def __init__(self) -> None:
        self._on_commit: list[Callable[[], None]] = []
        self._appends: list[tuple[str, Params]] = []
        self.memo: dict[str, Any] = {}
        """Reads a transaction may take once for many writers in it (a group commit's members), keyed by
        what was read; only for rows the transaction has locked or that only it can write."""

    @abc.abstractmethod
    async def execute(self, sql: str, params: Params | None = None) -> int:
        """Run a statement; returns the number of rows it changed."""

    @abc.abstractmethod
    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]: ...

    async def fetchtuples(self, sql: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        """`fetchall`'s rows as tuples, in the order the statement names its columns: for a read of thousands
        of rows whose caller unpacks them by position (the fleet listing), where making a dict of each row
        was a tenth of the read. The drivers read them as tuples outright; this is the meaning."""
        return [tuple(row.values()) for row in await self.fetchall(sql, params)]

    async def fetchone(self, sql: str, params: Params | None = None) -> Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, params: Params | None = None) -> Any:
        row = await self.fetchone(sql, params)
        return None if row is None else next(iter(row.values()))

    @asynccontextmanager
    async def savepoint(self, name: str) -> AsyncIterator[None]:
        """A nested part of the transaction: an exception rolls back only what ran inside it, and re-raises."""
        if not name.isidentifier():
            raise ValueError(f"not a savepoint name: {name!r}")
        await self.execute(f"SAVEPOINT {name}")
        appends = len(self._appends)
        try:
            yield
        except BaseException:
            del self._appends[appends:]  # what the rolled-back part appended goes with it
            await self.execute(f"ROLLBACK TO SAVEPOINT {name}")
            await self.execute(f"RELEASE SAVEPOINT {name}")
            raise
        await self.execute(f"RELEASE SAVEPOINT {name}")

    def on_commit(self, fn: Callable[[], None]) -> None:
        self._on_commit.append(fn)

    def append_at_commit(self, table: str, row: Params) -> None:
        """A row of a log that followers tail by its sequence number (the events), inserted as the
        transaction's last statements, in the engine's commit order (`_order_appends`).

        Why last: with several writers (PostgreSQL, several processes), numbers drawn mid-transaction
        commit out of order, and a follower that read 11 before 10 committed would skip 10 for good.
        Drawn under a lock held to the commit, the numbers are the commit order. Taken only at the end,
        after every row lock the transaction needs, that lock waits on nobody and so cannot deadlock.

        Consecutive rows of one table with the same columns go in one multi-row INSERT (a group commit's
        batch appends one or more events per member), in the order they were appended: both engines number
        a multi-row INSERT's rows in the order of its VALUES.
        """
        self._appends.append((table, row))

    async def _flush_appends(self) -> None:
        if not self._appends:
            return
        await self._order_appends()
        appends, self._appends = self._appends, []
        i = 0
        while i < len(appends):
            table, first = appends[i]
            columns = tuple(first)
            j = i + 1
            while (
                j < len(appends)
                and j - i < APPEND_ROWS_PER_INSERT
                and appends[j][0] == table
                and tuple(appends[j][1]) == columns
            ):
                j += 1
            await self.execute(*insert_rows(table, columns, [row for _, row in appends[i:j]]))
            i = j

    async def _order_appends(self) -> None:
        """Held from here to the commit: nothing (one writer commits in order on its own)."""
        return None

    def _run_on_commit(self) -> None:
        for fn in self._on_commit:
            fn()


class Store(abc.ABC):
    dialect: str = "sqlite"

    @abc.abstractmethod
    async def open(self, *, migrate: bool = True) -> None:
        """Connect and (unless `migrate=False`, for `bc store check` and a copy's source) apply pending migrations."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def _begin(self, write: bool) -> Any:
        """An async context manager yielding a Tx (driver-specific)."""

    @asynccontextmanager
    async def transaction(self, *, write: bool = True) -> AsyncIterator[Tx]:
        async with self._begin(write) as tx:
            yield tx
        tx._run_on_commit()

    def urgent_transaction(self) -> Any:
        """A short write that must not wait behind this process's queue of writes: a lease renewal.

        Only for statements that are atomic in SQL on their own (a conditional upsert), since it skips the
        in-process serialization that read-modify-write sequences rely on. A store with one writer (SQLite)
        has nothing to skip and queues it as any write.
        """
        return self.transaction()

    @abc.abstractmethod
    async def now(self) -> float:
        """The store's clock, in seconds since the epoch."""

    async def now_ms(self) -> int:
        return round(await self.now() * 1000)

    def for_update(self) -> str:
        """Row locking for claim queries; empty where the engine has one writer."""
        return ""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """Where the data lives, for logs and `bc doctor` (no secrets)."""
