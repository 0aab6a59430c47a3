"""The PostgreSQL driver: psycopg 3, async, over a small connection pool.

Callers write SQL once with `:name` parameters (bc/store/base.py); this
driver rewrites each statement once to psycopg's `%(name)s` style and caches
the result. Transactions run at READ COMMITTED, the engine's default and what
the reference's dispatch query (`FOR UPDATE OF c SKIP LOCKED`) is written
for; writes that other processes may race carry their own row locks or
fences in SQL.

Within one process, write transactions take an asyncio lock, as they do on
SQLite: the control code was written against a store with one writer, and
read-modify-write sequences inside one process stay serial whatever the
engine. Reads take a pool connection of their own and run beside writes.

`now()` is the database's clock (the reference's `compute_now()`), so every
process of a fleet agrees on business time: the offset between the
database's clock and this process's is sampled every `CLOCK_RESYNC_S` and
applied to the local clock in between, so asking the time costs no round
trip. Tests on a virtual clock pass `db_clock=False` and get that clock.

A connection that dies mid-transaction (a restart, a failover,
`pg_terminate_backend`) fails that transaction with a `StoreError`; the pool
discards the broken connection and the next transaction opens a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from bc.runtime.aio import outside_world
from bc.seams.clock import Clock, SystemClock
from bc.store.base import Params, Row, Store, StoreError, StoreUnreachable, Tx
from bc.store.migrate import apply_migrations

CLOCK_RESYNC_S = 5.0
POOL_MIN = 1
POOL_MAX = 8
PREPARE_THRESHOLD = 0  # every statement server-side prepared on first use (bench.pg_drivers)
CONNECT_TIMEOUT_S = 10
IDLE_IN_TRANSACTION_S = 30
"""A transaction whose process went quiet mid-way (paused, a VM migrated, hung) is ended by the server after
this long, with its locks: a gateway frozen inside its lease renewal must not hold the `leases` row its
successor takes over (or any row another process needs) for as long as it stays frozen. Our transactions
run their statements back to back in milliseconds; when the paused process wakes, its next statement fails
with `StoreError` and its loop tries again."""

_TOKEN = re.compile(r"'(?:[^']|'')*'|::|%|(?<![\w:]):([A-Za-z_]\w*)")


@functools.lru_cache(maxsize=4096)
def to_psycopg(sql: str) -> str:
    """`:name` → `%(name)s`, every other `%` doubled; string literals and `::type` casts left alone."""

    def sub(m: re.Match[str]) -> str:
        tok = m.group(0)
        if m.group(1):
            return f"%({m.group(1)})s"
        if tok == "%":
            return "%%"
        if tok.startswith("'"):
            return tok.replace("%", "%%")
        return tok

    return _TOKEN.sub(sub, sql)


def application_name(schema: str | None) -> str:
    """How bc's connections name themselves to the server (pg_stat_activity): `bc`, or `bc:<schema>`."""
    return f"bc:{schema}"[:63] if schema else "bc"


def redact(url: str) -> str:
    """The URL without its password, for logs and `bc doctor`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def split_schema(url: str) -> tuple[str, str | None]:
    """A `?schema=NAME` query parameter (bc's, not libpq's) taken off the URL."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), None)
    rest = [(k, v) for k, v in query if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


class _PgTx(Tx):
    def __init__(self, conn: psycopg.AsyncConnection[Row]) -> None:
        super().__init__()
        self._conn = conn

    async def execute(self, sql: str, params: Params | None = None) -> int:
        cur = await _run(self._conn, sql, params)
        return cur.rowcount

    async def fetchall(self, sql: str, params: Params | None = None) -> list[Row]:
        cur = await _run(self._conn, sql, params)
        return list(await cur.fetchall()) if cur.description else []

    async def fetchtuples(self, sql: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        try:
            with outside_world():
                cur = self._conn.cursor(row_factory=tuple_row)  # as `_run`'s execute, with tuples for rows
                await cur.execute(to_psycopg(sql), dict(params) if params else None)
                return await cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            raise StoreError(f"{_first_line(e)} in: {sql.strip()[:120]}") from e

    async def _order_appends(self) -> None:
        # One lock per schema (each test, each fleet sharing a database has its own log), held to the commit.
        await self.execute("SELECT pg_advisory_xact_lock(hashtext('bc.events:' || current_schema()))")


async def _run(conn: psycopg.AsyncConnection[Row], sql: str, params: Params | None) -> psycopg.AsyncCursor[Row]:
    try:
        with outside_world():
            return await conn.execute(to_psycopg(sql), dict(params) if params else None)
    except psycopg.Error as e:
        raise StoreError(f"{_first_line(e)} in: {sql.strip()[:120]}") from e


def _unreachable(e: psycopg.OperationalError) -> bool:
    """A connection that never reached a server that could answer (libpq says so in words, no SQLSTATE):
    refused, no route, timed out, the server starting up or shutting down."""
    if e.sqlstate is not None:
        return e.sqlstate.startswith("57P")  # admin shutdown, crash shutdown, cannot connect now (starting up)
    text = str(e).lower()
    return any(
        w in text
        for w in ("connection refused", "timeout expired", "timed out", "no route to host", "could not connect")
    )


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


class PostgresStore(Store):
    """`bc serve --store postgresql://…`: the fleet's store, shared by every bc serve process."""

    dialect = "postgres"

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        schema: str | None = None,
        pool_max: int = POOL_MAX,
        db_clock: bool = True,
    ) -> None:
        self.url, url_schema = split_schema(url)
        self.schema = schema or url_schema
        self._db_clock = db_clock
        self.clock: Clock = clock or SystemClock()
        self._pool_max = pool_max
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] | None = None
        self._write_lock = asyncio.Lock()
        self._urgent_lock = asyncio.Lock()
        self._urgent_conn: psycopg.AsyncConnection[Row] | None = None
        self._offset = 0.0
        self._synced_at: float | None = None

    @property
    def description(self) -> str:
        where = redact(self.url)
        return f"{where} (schema {self.schema})" if self.schema else where

    async def _configure(self, conn: psycopg.AsyncConnection[Row]) -> None:
        await conn.execute(
            pgsql.SQL("SET idle_in_transaction_session_timeout = {}").format(
                pgsql.Literal(f"{int(IDLE_IN_TRANSACTION_S * 1000)}ms")
            )
        )
        if self.schema:
            await conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(self.schema)))

    async def open(self, *, migrate: bool = True) -> None:
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] | None = None
        try:
            # One connection of its own first, schema or not: the pool retries a refused connection in the
            # background and ends in a PoolTimeout that no longer says why (a wrong password, a missing database).
            with outside_world():
                async with await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                ) as conn:
                    if self.schema:
                        await conn.execute(
                            pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(self.schema))
                        )
            pool = AsyncConnectionPool(
                self.url,
                min_size=POOL_MIN,
                max_size=self._pool_max,
                kwargs={
                    "application_name": application_name(self.schema),
                    "autocommit": True,
                    "row_factory": dict_row,
                    "connect_timeout": CONNECT_TIMEOUT_S,
                    "prepare_threshold": PREPARE_THRESHOLD,
                },
                configure=self._configure,
                open=False,
                timeout=CONNECT_TIMEOUT_S,
            )
            with outside_world():
                await pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
            self._pool = pool
        except Exception as e:  # psycopg's errors, OSError, TimeoutError, the pool's own PoolTimeout and friends
            if pool is not None:  # its workers would go on dialling: a start that tries again opens a new one
                with outside_world(), contextlib.suppress(Exception):
                    await pool.close()
            # Not reached (refused, timed out, the server starting or failing over) is worth waiting for; a
            # server that answered with a refusal (a missing database, a wrong password) is said and ends.
            unreachable = isinstance(e, OSError | TimeoutError | PoolTimeout) or (
                isinstance(e, psycopg.OperationalError) and _unreachable(e)
            )
            error = StoreUnreachable if unreachable else StoreError
            raise error(f"cannot open the store {self.description}: {_first_line(e)}") from e
        if not migrate:
            return
        try:
            await apply_migrations(self)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        urgent, self._urgent_conn = self._urgent_conn, None
        with outside_world():
            if urgent is not None:
                await urgent.close()
            if pool is not None:
                await pool.close()

    @asynccontextmanager
    async def urgent_transaction(self) -> AsyncIterator[Tx]:
        """On a connection of its own, outside the pool and the write lock: a reconnect storm can fill both
        (64 Hellos, status and liveness flushes), and a gateway whose lease renewal queued behind them would
        fence itself in the middle of the storm it is serving."""
        if self._pool is None:
            raise StoreError("the store is not open")
        async with self._urgent_lock:
            conn = self._urgent_conn
            if conn is None or conn.broken or conn.closed:
                try:
                    with outside_world():
                        conn = await psycopg.AsyncConnection.connect(
                            self.url,
                            autocommit=True,
                            row_factory=dict_row,
                            application_name=application_name(self.schema),
                            connect_timeout=CONNECT_TIMEOUT_S,
                        )
                        await self._configure(conn)
                except (psycopg.Error, OSError) as e:
                    raise StoreError(f"the store is unreachable: {_first_line(e)}") from e
                self._urgent_conn = conn
            await _run(conn, "BEGIN", None)
            async with _committed(conn) as tx:
                yield tx
        tx._run_on_commit()

    @asynccontextmanager
    async def _begin(self, write: bool) -> AsyncIterator[Tx]:
        if self._pool is None:
            raise StoreError("the store is not open")
        if write:
            async with self._write_lock, self._transaction() as tx:
                yield tx
        else:
            async with self._transaction() as tx:
                yield tx

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Tx]:
        assert self._pool is not None
        conn_cm, conn = await self._begun()
        try:
            async with _committed(conn) as tx:
                yield tx
        finally:
            # A connection left mid-transaction (a cancelled COMMIT) goes back to the pool, which rolls it back.
            with outside_world():
                await conn_cm.__aexit__(None, None, None)

    async def _begun(self) -> tuple[Any, psycopg.AsyncConnection[Row]]:
        """A pool connection with a transaction begun on it.

        After a restart or a failover every idle connection in the pool is dead, and each would fail one
        caller's transaction. Nothing has run at BEGIN, so a connection found dead there is dropped and the
        next one tried (up to the pool's size, then a fresh one): callers see a failure only when the
        store is really unreachable, or when it went away in the middle of their transaction.
        """
        assert self._pool is not None
        task = asyncio.current_task()
        for attempt in range(self._pool_max + 1):
            cancels = task.cancelling() if task is not None else 0
            try:
                with outside_world():
                    conn_cm = self._pool.connection()
                    conn = await conn_cm.__aenter__()
            except psycopg.Error as e:
                raise StoreError(f"the store is unreachable: {_first_line(e)}") from e
            except Exception as e:  # PoolTimeout
                raise StoreError(f"the store is unreachable: {_first_line(e)}") from e
            if task is not None and task.cancelling() > cancels:
                # The pool waits for a free connection with Python 3.11's `asyncio.wait_for`, which returns the
                # connection and drops a cancellation that lands in the step the connection is handed over
                # (CPython gh-86296, fixed in 3.12). A loop that then went on would never stop: deliver it.
                with outside_world():
                    await conn_cm.__aexit__(None, None, None)
                raise asyncio.CancelledError()
            try:
                await _run(conn, "BEGIN", None)
            except StoreError:
                broken = conn.broken
                with outside_world():
                    await conn_cm.__aexit__(None, None, None)  # a broken connection leaves the pool here
                if broken and attempt < self._pool_max:
                    continue
                raise
            except BaseException:
                with outside_world():
                    await conn_cm.__aexit__(None, None, None)
                raise
            return conn_cm, conn
        raise AssertionError("unreachable")

    async def now(self) -> float:
        if not self._db_clock:
            return self.clock.now()
        mono = self.clock.monotonic()
        if self._synced_at is None or mono - self._synced_at >= CLOCK_RESYNC_S:
            await self._resync(mono)
        return self.clock.now() + self._offset

    async def _resync(self, mono: float) -> None:
        async with self.urgent_transaction() as tx:  # a clock sample must not wait for a busy pool either
            before = self.clock.now()
            db = float(await tx.fetchval("SELECT EXTRACT(EPOCH FROM clock_timestamp())"))
            after = self.clock.now()
        self._offset = db - (before + after) / 2
        self._synced_at = mono

    def for_update(self) -> str:
        return " FOR UPDATE SKIP LOCKED"


@asynccontextmanager
async def _committed(conn: psycopg.AsyncConnection[Row]) -> AsyncIterator[_PgTx]:
    """The body of a transaction begun on `conn`: committed if it returns, rolled back if it raises."""
    tx = _PgTx(conn)
    try:
        yield tx
        await tx._flush_appends()
    except BaseException:
        if not conn.broken:
            await _finish(conn, "ROLLBACK")
        raise
    await _run(conn, "COMMIT", None)


async def _finish(conn: psycopg.AsyncConnection[Row], stmt: str) -> None:
    try:
        await _run(conn, stmt, None)
    except StoreError:
        pass  # the connection is gone; the pool will discard it


async def drop_schema(url: str, schema: str) -> None:
    """Remove a schema and everything in it (tests; `bc store` never calls this)."""
    with outside_world():
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)))
