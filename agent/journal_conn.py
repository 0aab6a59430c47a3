"""The journal's connections to its SQLite file, all with the surface of aiosqlite's that `Journal` uses.

* `InlineConnection`: every statement at once on the loop's thread. The simulator's (`bc sim
  --journal-files`): the virtual-time loop cannot see another thread, and a run must stay a function of
  its seed.
* `CommitInThreadConnection`, the agent's: inside a transaction the journal holds SQLite's write lock and
  its statements wait on nothing but the CPU, on a file the OS caches, so they run on the loop, in
  microseconds; BEGIN IMMEDIATE (which can wait for a lock) and COMMIT (the fsync that makes `accepted`
  durable before a side effect starts) go to the connection's own thread, as does a read outside a
  transaction. A trip to a thread and back costs 40–90 µs, and aiosqlite makes three a statement: that, not
  the disk, bounded the journal's writes on a fast disk (docs/design.md "Throughput"). BEGIN IMMEDIATE is
  first tried on the loop without waiting (SQLite's busy timeout at 0 for it): the agent is the journal's
  only writer, so it nearly always gets the lock at once, and only when another connection holds it does
  BEGIN go to the thread to wait there. So a write is one trip, its COMMIT, and a batch of writes
  (`agent.journal_batch`) one trip for them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

import aiosqlite

log = logging.getLogger("agent.journal")

T = TypeVar("T")

_TO_THREAD = frozenset({"BEGIN", "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK"})
_BEGIN = "BEGIN IMMEDIATE"
BUSY_TIMEOUT_MS = 5000
"""How long a statement on the connection's thread waits for another connection's lock (sqlite3's default)."""


class InlineCursor:
    """aiosqlite's cursor surface that `Journal` uses, over a finished sqlite3 cursor (or the rows a thread
    already fetched from it)."""

    def __init__(self, cur: sqlite3.Cursor, rows: list[Any] | None = None) -> None:
        self._cur = cur
        self._rows = rows
        self.rowcount = cur.rowcount

    async def fetchone(self) -> Any:
        if self._rows is not None:
            return self._rows.pop(0) if self._rows else None
        return self._cur.fetchone()

    async def fetchall(self) -> list[Any]:
        if self._rows is not None:
            rows, self._rows = self._rows, []
            return rows
        return self._cur.fetchall()

    async def close(self) -> None:
        self._cur.close()


class _Result:
    """What `execute` returns: awaited, the cursor; `async with`, the cursor, closed after."""

    def __init__(self, cur: InlineCursor | Awaitable[InlineCursor]) -> None:
        self._cur = cur

    def __await__(self) -> Generator[Any, None, InlineCursor]:
        if isinstance(self._cur, InlineCursor):
            return _ready(self._cur)  # a statement that ran on the loop: no coroutine to make and step
        return self._done().__await__()

    async def _done(self) -> InlineCursor:
        if not isinstance(self._cur, InlineCursor):
            self._cur = await self._cur  # a statement sent to the connection's thread: awaited once
        return self._cur

    async def __aenter__(self) -> InlineCursor:
        return await self._done()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        cur = await self._done()
        await cur.close()


def _ready(cur: InlineCursor) -> Generator[Any, None, InlineCursor]:
    """An awaitable's iterator that is done at once with `cur`."""
    return cur
    yield  # a generator that never suspends


class InlineConnection:
    """aiosqlite's connection surface that `Journal` uses, each statement run at once on this thread."""

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Result:
        return _Result(InlineCursor(self._conn.execute(sql, params)))

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> _Result:
        return _Result(InlineCursor(self._conn.executemany(sql, params)))

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    async def close(self) -> None:
        self._conn.close()


class _Thread:
    """One thread that runs what it is given in order, each answer posted back to the caller's loop.

    Leaner than an executor's trip (no concurrent future to chain: about 20 % less a trip, measured), and it
    knows whether it is still running something, which a cancelled caller's future cannot tell: a caller
    cancelled while its COMMIT runs here sees its future done at once."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[[], Any]] | None]
        self._jobs = queue.SimpleQueue()
        self._given = 0  # written on the loop's thread only
        self._done = 0  # written on this thread only
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def idle(self) -> bool:
        return self._done == self._given

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._given += 1
        self._jobs.put((loop, fut, functools.partial(fn, *args)))
        return fut

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, fut, call = job
            result: Any = None
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as e:  # handed to the caller, whatever it is
                error = e
            self._done += 1
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for the answer
                loop.call_soon_threadsafe(_settle, fut, result, error)


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return  # its caller was cancelled
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class CommitInThreadConnection:
    """aiosqlite's connection surface: statements in a transaction on the loop, BEGIN, COMMIT, ROLLBACK and
    reads outside a transaction on the connection's own thread (one trip each). The journal's lock keeps
    one statement at a time on the connection, and the thread runs what it is given in order."""

    def __init__(self, conn: sqlite3.Connection, thread: _Thread) -> None:
        self._conn, self._thread = conn, thread

    @staticmethod
    async def open(path: str) -> CommitInThreadConnection:
        thread = _Thread("bc-journal")
        try:
            conn = await thread.run(_connect, path)
        except BaseException:
            thread.stop()
            raise
        return CommitInThreadConnection(conn, thread)

    def _in_thread(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return self._thread.run(fn, *args)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Result:
        if sql == _BEGIN:
            if self._thread.idle():
                # Nothing of ours is still on the thread (a cancelled caller's COMMIT would be): BEGIN may run here.
                cur = _begin_without_waiting(self._conn)
                if cur is not None:
                    return _Result(cur)
            return _Result(self._in_thread(_begin_waiting, self._conn))
        if sql in _TO_THREAD or not self._conn.in_transaction:
            return _Result(self._in_thread(_run, self._conn.execute, sql, params))
        return _Result(InlineCursor(self._conn.execute(sql, params)))

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> _Result:
        if not self._conn.in_transaction:
            return _Result(self._in_thread(_run, self._conn.executemany, sql, list(params)))
        return _Result(InlineCursor(self._conn.executemany(sql, params)))

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    async def close(self) -> None:
        try:
            await self._in_thread(self._conn.close)
        finally:
            self._thread.stop()


def _connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)


def _drop_leftover(conn: sqlite3.Connection) -> None:
    """Roll back a transaction nobody owns: a caller cancelled while its BEGIN or failed COMMIT ran on the
    thread. The journal issues BEGIN only under its lock, with every transaction of its own ended."""
    if conn.in_transaction:
        log.warning("event=journal.leftover-transaction action=rollback")
        conn.execute("ROLLBACK")


def _begin_waiting(conn: sqlite3.Connection) -> InlineCursor:
    """BEGIN IMMEDIATE on the connection's thread, waiting up to the busy timeout for another's lock."""
    _drop_leftover(conn)
    return _run(conn.execute, _BEGIN, ())


def _begin_without_waiting(conn: sqlite3.Connection) -> InlineCursor | None:
    """BEGIN IMMEDIATE if the write lock is free this instant, else None (the caller waits on the thread)."""
    _drop_leftover(conn)
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        return InlineCursor(conn.execute(_BEGIN))
    except sqlite3.OperationalError as e:
        if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # SQLITE_BUSY and its extended codes
            raise
        return None
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


def _run(call: Callable[[str, Any], sqlite3.Cursor], sql: str, params: Any) -> InlineCursor:
    """A statement run start to end (its rows fetched) on the connection's thread."""
    cur = call(sql, params)
    return InlineCursor(cur, rows=cur.fetchall())


def connect_inline(path: str) -> Awaitable[aiosqlite.Connection]:
    """`Journal.open`'s `connect` for the simulator: an `InlineConnection` where aiosqlite's would be."""

    async def opened() -> aiosqlite.Connection:
        return cast(aiosqlite.Connection, InlineConnection(path))

    return opened()


def connect_commit_in_thread(path: str) -> Awaitable[aiosqlite.Connection]:
    """`Journal.open`'s `connect` for the agent (see the module)."""

    async def opened() -> aiosqlite.Connection:
        return cast(aiosqlite.Connection, await CommitInThreadConnection.open(path))

    return opened()
