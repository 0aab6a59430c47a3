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

Row = dict[str, Any]
Params = Mapping[str, Any]


class StoreError(Exception):
    """The store failed (unreachable, constraint broken); the message says which."""


class Tx(abc.ABC):
    """One transaction. Statements use named parameters (`:name`)."""

    def __init__(self) -> None:
        self._on_commit: list[Callable[[], None]] = []

    @abc.abstractmethod
    async def execute(self, sql: str, params: Params | None = None) -> int:
        """Run a statement; returns the number of rows it changed."""

    @abc.abstractmethod
    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]: ...

    async def fetchone(self, sql: str, params: Params | None = None) -> Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, params: Params | None = None) -> Any:
        row = await self.fetchone(sql, params)
        return None if row is None else next(iter(row.values()))

    def on_commit(self, fn: Callable[[], None]) -> None:
        self._on_commit.append(fn)

    def _run_on_commit(self) -> None:
        for fn in self._on_commit:
            fn()


class Store(abc.ABC):
    dialect: str = "sqlite"

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and apply pending migrations."""

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
