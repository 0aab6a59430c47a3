"""The agent's real SQLite journal file, driven inline on the simulator's loop (`bc sim --journal-files`).

`agent.journal.Journal` talks to its file through aiosqlite, whose worker thread the virtual-time loop
cannot see: the loop would jump to the next timer while a statement runs, and a run would stop being a
function of its seed. `open_inline` opens the same `Journal` (its schema, its WAL and `synchronous=FULL`
fsyncs, its rules) over `InlineConnection`, which runs each statement at once on the loop's thread, and
makes its file private inline too. Nothing suspends that the memory journal would not, so a run on
journal files interleaves its tasks exactly as one on memory journals and writes the same events log.
The statements are the journal's own; nothing here holds SQL.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Awaitable, Generator, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import aiosqlite

from agent.journal import Journal
from agent.offload import inline


class InlineCursor:
    """aiosqlite's cursor surface that `Journal` uses, over a finished sqlite3 cursor."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self._cur = cur
        self.rowcount = cur.rowcount

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    async def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    async def close(self) -> None:
        self._cur.close()


class _Result:
    """What `execute` returns: awaited, the cursor; `async with`, the cursor, closed after."""

    def __init__(self, cur: InlineCursor) -> None:
        self._cur = cur

    def __await__(self) -> Generator[Any, None, InlineCursor]:
        return self._done().__await__()

    async def _done(self) -> InlineCursor:
        return self._cur

    async def __aenter__(self) -> InlineCursor:
        return self._cur

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._cur.close()


class InlineConnection:
    """aiosqlite's connection surface that `Journal` uses, each statement run at once on this thread."""

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Result:
        return _Result(InlineCursor(self._conn.execute(sql, params)))

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> _Result:
        return _Result(InlineCursor(self._conn.executemany(sql, params)))

    async def close(self) -> None:
        self._conn.close()


def connect_inline(path: str) -> Awaitable[aiosqlite.Connection]:
    """`Journal.open`'s `connect`: an `InlineConnection` where aiosqlite's would be (same surface)."""

    async def opened() -> aiosqlite.Connection:
        return cast(aiosqlite.Connection, InlineConnection(path))

    return opened()


async def open_inline(path: Path, node_id: str, rng: random.Random) -> Journal:
    """The node's journal file, opened (or created, with a journal id from `rng`) over an inline connection."""
    return await Journal.open(path, node_id, rng=rng, connect=connect_inline, offload=inline)
