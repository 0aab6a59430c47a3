"""The SQLite drivers: aiosqlite for `bc serve`, inline sqlite3 for the simulator.

Both share the pragmas and the transaction discipline. WAL with
`synchronous=FULL` so a committed transaction survives a kill -9 and a power
cut; one connection with an asyncio lock serializes transactions (SQLite has
one writer anyway, and the lock keeps reads consistent with writes of the
same process). The inline driver runs sqlite3 on the loop's thread: blocking
for microseconds on a small lab database, but deterministic, which the
simulator needs.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from bc.clock import Clock, SystemClock
from bc.store.base import Params, Row, Store, StoreError, Tx
from bc.store.migrate import apply_migrations

PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
    "PRAGMA busy_timeout=10000",
)


def _rows(cur_description: Any, data: list[Any]) -> list[Row]:
    cols = [d[0] for d in cur_description or ()]
    return [dict(zip(cols, r, strict=True)) for r in data]


class _AioTx(Tx):
    def __init__(self, conn: aiosqlite.Connection) -> None:
        super().__init__()
        self._conn = conn

    async def execute(self, sql: str, params: Params | None = None) -> int:
        try:
            cur = await self._conn.execute(sql, dict(params or {}))
        except sqlite3.Error as e:
            raise StoreError(f"{e} in: {sql.strip()[:120]}") from e
        n = cur.rowcount
        await cur.close()
        return n

    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]:
        try:
            cur = await self._conn.execute(sql, dict(params or {}))
            data = await cur.fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"{e} in: {sql.strip()[:120]}") from e
        rows = _rows(cur.description, list(data))
        await cur.close()
        return rows


class _InlineTx(Tx):
    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__()
        self._conn = conn

    async def execute(self, sql: str, params: Params | None = None) -> int:
        try:
            return self._conn.execute(sql, dict(params or {})).rowcount
        except sqlite3.Error as e:
            raise StoreError(f"{e} in: {sql.strip()[:120]}") from e

    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]:
        try:
            cur = self._conn.execute(sql, dict(params or {}))
            return _rows(cur.description, cur.fetchall())
        except sqlite3.Error as e:
            raise StoreError(f"{e} in: {sql.strip()[:120]}") from e


async def _to_completion(aw: Awaitable[object]) -> None:
    """Await a statement to its end even if this task is cancelled meanwhile, then re-raise the cancel.

    aiosqlite runs statements in its thread: a BEGIN or COMMIT whose awaiting task was cancelled still
    runs. Releasing the store's lock before it has finished would let the next transaction find the
    connection in a state it did not expect ("cannot start a transaction within a transaction").
    """
    fut = asyncio.ensure_future(aw)
    cancelled = False
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not fut.cancelled():
            fut.exception()  # retrieved, so asyncio does not warn that it never was
        raise asyncio.CancelledError
    fut.result()


async def _rollback(conn: aiosqlite.Connection) -> None:
    if conn.in_transaction:
        await conn.execute("ROLLBACK")


class SqliteStore(Store):
    """aiosqlite: the embedded store of `bc serve` (a file in the data dir)."""

    dialect = "sqlite"

    def __init__(self, path: Path | str, clock: Clock | None = None) -> None:
        self.path = Path(path)
        self.clock: Clock = clock or SystemClock()
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    @property
    def description(self) -> str:
        return f"sqlite:{self.path}"

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = await aiosqlite.connect(str(self.path), isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the store {self.path}: {e}") from e
        for p in PRAGMAS:
            await conn.execute(p)
        self._conn = conn
        try:
            await apply_migrations(self)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        if self._conn is None:
            raise StoreError("the store is not open")
        async with self._lock:
            conn = self._conn
            if conn.in_transaction:
                await _to_completion(_rollback(conn))  # defensive: nothing should leave one open
            await _to_completion(conn.execute("BEGIN IMMEDIATE" if write else "BEGIN"))
            tx = _AioTx(conn)
            try:
                yield tx
            except BaseException:
                await _to_completion(_rollback(conn))
                raise
            await _to_completion(conn.execute("COMMIT"))

    async def now(self) -> float:
        return self.clock.now()


class InlineSqliteStore(Store):
    """sqlite3 on the loop's thread: deterministic, for the simulator and fast tests."""

    dialect = "sqlite"

    def __init__(self, path: Path | str = ":memory:", clock: Clock | None = None) -> None:
        self.path = str(path)
        self.clock: Clock = clock or SystemClock()
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    @property
    def description(self) -> str:
        return f"sqlite-inline:{self.path}"

    async def open(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the store {self.path}: {e}") from e
        for p in PRAGMAS:
            conn.execute(p)
        self._conn = conn
        try:
            await apply_migrations(self)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        if self._conn is None:
            raise StoreError("the store is not open")
        async with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            tx = _InlineTx(conn)
            try:
                yield tx
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    async def now(self) -> float:
        return self.clock.now()
