"""The SQLite drivers: sqlite3 with a thread of its own for `bc serve`, inline sqlite3 for the simulator.

Both share the pragmas and the transaction discipline. WAL with
`synchronous=FULL` so a committed transaction survives a kill -9 and a power
cut; one connection with an asyncio lock serializes transactions (SQLite has
one writer anyway, and the lock keeps reads consistent with writes of the
same process). The inline driver runs sqlite3 on the loop's thread: blocking
for microseconds on a small lab database, but deterministic, which the
simulator needs.

The store holds join tokens, node certificates and signed intent, so its
files are 0600 whatever the umask or the data dir's mode: the database file
is created 0600 before SQLite opens it (SQLite gives its `-wal` and `-shm`
files the database file's mode), and files an older version left more open
are narrowed at every open.
"""

from __future__ import annotations

import abc
import asyncio
import math
import sqlite3
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bc.pki import keys
from bc.seams.clock import Clock, SystemClock
from bc.store.base import Params, Row, Store, StoreError, Tx
from bc.store.migrate import apply_migrations

T = TypeVar("T")

PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
    "PRAGMA busy_timeout=10000",
    "PRAGMA analysis_limit=400",  # `PRAGMA optimize` samples at most this many rows per index: milliseconds
)

READ_ONLY_PRAGMAS = ("PRAGMA busy_timeout=10000",)
"""A read-only store sets nothing in the file (journal_mode=WAL would write its header)."""

OPTIMIZE_EVERY_S = 60.0
"""How often `bc serve`'s store refreshes the query planner's statistics (`PRAGMA optimize`). Without them
SQLite picks the `(state, deadline)` index for the dispatch pass and sorts every pending command of the
fleet on each pass (90 ms at 7,000 pending against 14 ms with them, measured)."""


FILE_MODE = keys.PRIVATE_MODE
make_private = keys.make_private_sqlite


@dataclass(frozen=True)
class _Result:
    rowcount: int
    rows: list[Row]
    tuples: list[tuple[Any, ...]] = field(default_factory=list)
    """The rows as sqlite3 gives them, when the caller asked for tuples (`rows` is then empty)."""


class _SqliteTx(Tx):
    def __init__(self, store: _SqliteStoreBase) -> None:
        super().__init__()
        self._store = store

    async def execute(self, sql: str, params: Params | None = None) -> int:
        return (await self._store._run(sql, params, fetch=False)).rowcount

    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]:
        return (await self._store._run(sql, params, fetch=True)).rows

    async def fetchtuples(self, sql: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        return (await self._store._run(sql, params, fetch=True, tuples=True)).tuples


async def _to_completion(aw: Awaitable[object]) -> None:
    """Await a statement to its end even if this task is cancelled meanwhile, then re-raise the cancel.

    The store runs BEGIN and COMMIT in its thread: a BEGIN or COMMIT whose awaiting task was cancelled still
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


class _SqliteStoreBase(Store):
    """What both drivers share: pragmas, migrations, one lock, and the transaction discipline."""

    dialect = "sqlite"
    read_only = False

    def __init__(self, clock: Clock | None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._lock = asyncio.Lock()
        self._open = False

    # -- the driver's four operations -------------------------------------
    @abc.abstractmethod
    async def _connect(self) -> None: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...

    @abc.abstractmethod
    async def _statement(self, sql: str, params: dict[str, Any], fetch: bool, tuples: bool = False) -> _Result: ...

    @abc.abstractmethod
    def _in_transaction(self) -> bool: ...

    # -- shared ---------------------------------------------------------------
    async def _run(self, sql: str, params: Params | None, *, fetch: bool, tuples: bool = False) -> _Result:
        try:
            return await self._statement(sql, dict(params or {}), fetch, tuples)
        except sqlite3.Error as e:
            raise StoreError(f"{e} in: {sql.strip()[:120]}") from e

    async def open(self, *, migrate: bool = True) -> None:
        try:
            await self._connect()
            for p in READ_ONLY_PRAGMAS if self.read_only else PRAGMAS:
                await self._statement(p, {}, False)
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"cannot open the store {self.description}: {e}") from e
        self._open = True
        if not migrate:
            return
        try:
            await apply_migrations(self)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._open:
            self._open = False
            await self._close()

    # A driver whose statements run on the loop's thread, start to end, with no await inside: a
    # cancellation cannot land half-way, so they need no shielding (a task and a shield per statement).
    statements_inline = False

    async def _end(self, sql: str) -> None:
        if sql != "ROLLBACK" or self._in_transaction():
            await self._statement(sql, {}, False)

    async def _finish(self, aw: Awaitable[None]) -> None:
        if self.statements_inline:
            await aw
        else:
            await _to_completion(aw)

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        if not self._open:
            raise StoreError("the store is not open")
        async with self._lock:
            if self._in_transaction():
                await self._finish(self._end("ROLLBACK"))  # defensive: nothing should leave one open
            await self._finish(self._begin_statement(write))
            tx = _SqliteTx(self)
            try:
                yield tx
                await tx._flush_appends()
            except BaseException:
                await self._finish(self._end("ROLLBACK"))
                raise
            await self._finish(self._end("COMMIT"))

    async def _begin_statement(self, write: bool) -> None:
        await self._statement("BEGIN IMMEDIATE" if write else "BEGIN", {}, False)

    async def now(self) -> float:
        return self.clock.now()


class SqliteStore(_SqliteStoreBase):
    """The embedded store of `bc serve` (a file in the data dir): sqlite3 with a thread of its own.

    Where each statement runs is chosen by what it can wait on. BEGIN IMMEDIATE can wait for another
    process's write lock (up to `busy_timeout`) and COMMIT waits for the fsync (and runs WAL checkpoints):
    both go to the store's thread. Inside a write transaction this process holds SQLite's only write
    lock, so its statements wait on nothing but the CPU, on pages the OS caches: they run on the loop,
    start to end, about 8 µs each against 40–240 µs through a thread (`python -m bench.sqlite_hops`,
    docs/design.md "Throughput"), which is what bounds a gateway's commands per second. A read
    transaction may be a large scan (usage over a year of windows, a long list): its statements go to
    the thread, one trip each, so an Admin read never stalls the sessions.
    """

    def __init__(self, path: Path | str, clock: Clock | None = None, *, read_only: bool = False) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self.read_only = read_only
        """Opened `mode=ro` (`bc store copy`'s source): never created, initialised, migrated or chmodded."""
        self._conn: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._writing = False  # inside BEGIN IMMEDIATE … COMMIT: statements run on the loop
        # The first commit refreshes the planner's statistics, then every few minutes; a read-only store never.
        self._optimize_at = math.inf if read_only else 0.0

    @property
    def description(self) -> str:
        return f"sqlite:{self.path}"

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def _connect(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bc-sqlite")
        if self.read_only:
            self._conn = await self._in_thread(_connect_read_only, self.path)
            return
        await self._in_thread(make_private, self.path)
        self._conn = await self._in_thread(_connect, str(self.path))

    async def _close(self) -> None:
        conn, thread, self._conn, self._thread = self._conn, self._thread, None, None
        if conn is not None and thread is not None:
            await asyncio.get_running_loop().run_in_executor(thread, conn.close)
        if thread is not None:
            thread.shutdown(wait=False)

    async def _begin_statement(self, write: bool) -> None:
        await self._statement("BEGIN IMMEDIATE" if write else "BEGIN", {}, False)
        self._writing = write

    async def _end(self, sql: str) -> None:
        self._writing = False
        await super()._end(sql)
        if sql == "COMMIT" and self.clock.monotonic() >= self._optimize_at:
            self._optimize_at = self.clock.monotonic() + OPTIMIZE_EVERY_S
            await self._statement("PRAGMA optimize", {}, False)  # in the thread, still under the store's lock

    async def _statement(self, sql: str, params: dict[str, Any], fetch: bool, tuples: bool = False) -> _Result:
        assert self._conn is not None
        if self._writing:
            return _execute(self._conn, sql, params, fetch, tuples)
        return await self._in_thread(_execute, self._conn, sql, params, fetch, tuples)

    def _in_transaction(self) -> bool:
        return self._conn is not None and self._conn.in_transaction


def _connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """`mode=ro`: SQLite neither creates a missing file nor writes one; reading it proves it is a database."""
    uri = f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()  # "file is not a database" here, not later
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _execute(conn: sqlite3.Connection, sql: str, params: dict[str, Any], fetch: bool, tuples: bool = False) -> _Result:
    cur = conn.execute(sql, params)
    try:
        return _fetched(cur, fetch, tuples)
    finally:
        cur.close()


def _fetched(cur: sqlite3.Cursor, fetch: bool, tuples: bool) -> _Result:
    if not fetch:
        return _Result(cur.rowcount, [])
    if tuples:
        return _Result(cur.rowcount, [], cur.fetchall())
    return _Result(cur.rowcount, _rows(cur.description, cur.fetchall()))


class InlineSqliteStore(_SqliteStoreBase):
    """sqlite3 on the loop's thread: deterministic, for the simulator and fast tests."""

    statements_inline = True

    def __init__(self, path: Path | str = ":memory:", clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.path = str(path)
        self._conn: sqlite3.Connection | None = None

    @property
    def description(self) -> str:
        return f"sqlite-inline:{self.path}"

    async def _connect(self) -> None:
        if self.path != ":memory:" and not self.path.startswith("file:"):
            make_private(Path(self.path))  # inline by design: this driver never leaves the loop's thread
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)

    async def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _statement(self, sql: str, params: dict[str, Any], fetch: bool, tuples: bool = False) -> _Result:
        assert self._conn is not None
        return _fetched(self._conn.execute(sql, params), fetch, tuples)

    def _in_transaction(self) -> bool:
        return self._conn is not None and self._conn.in_transaction


def _rows(cur_description: Any, data: list[Any]) -> list[Row]:
    cols = [d[0] for d in cur_description or ()]
    return [dict(zip(cols, r, strict=True)) for r in data]
