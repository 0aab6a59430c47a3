"""PostgreSQL for the tests: a schema of its own per test in the database `BC_TEST_POSTGRES` names.

`.ci/run` and `make test` set `BC_TEST_POSTGRES` to the machine's local database; without it the
PostgreSQL cases are skipped with that reason (a developer's laptop), never silently passed.

Migrating a fresh schema costs about half a second of server-side DDL, which hundreds of tests
cannot each pay. So a process migrates one template schema once, and `recycled_schema()` hands out
migrated schemas from a free list: after a test its schema is emptied (DELETE, sequences restarted)
and refilled with the rows the migrations seed, copied from the template, in one round trip. Tests
of migrations themselves take `fresh_schema()`. Schemas are named `bct_<pid>_<n>`; a process drops
its own at exit, and the first to start drops those of processes that are gone.
"""

from __future__ import annotations

import atexit
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import psycopg
import pytest
from psycopg import sql

from bc.store.postgres import PostgresStore, drop_schema

ENV = "BC_TEST_POSTGRES"
PREFIX = "bct_"

_numbers = itertools.count()
_free: list[str] = []
_mine: list[str] = []
_template: dict[str, list[str]] = {}  # template schema -> the tables migrations seeded


def postgres_url() -> str:
    url = os.environ.get(ENV, "")
    if not url:
        pytest.skip(f"{ENV} is not set (a PostgreSQL URL, e.g. postgresql://postgres@127.0.0.1/test)")
    return url


def schema_url(url: str, schema: str) -> str:
    """The store URL `bc serve --store` takes for `schema` of the database at `url`."""
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def _name() -> str:
    name = f"{PREFIX}{os.getpid()}_{next(_numbers)}"
    _mine.append(name)
    return name


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_dead(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (PREFIX.replace("_", r"\_") + "%",)
        ).fetchall()
        for (name,) in rows:
            pid = name[len(PREFIX) :].split("_", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _drop_mine(url: str) -> None:
    if not _mine:
        return
    with psycopg.connect(url, autocommit=True) as conn:
        for name in _mine:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def _ensure_template(url: str) -> str:
    if _template:
        return next(iter(_template))
    _sweep_dead(url)
    atexit.register(_drop_mine, url)
    name = _name()
    store = PostgresStore(url, schema=name)
    await store.open()
    await store.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        tables = [str(r[0]) for r in await (await conn.execute(_TABLES, (name,))).fetchall()]
        seeded = []
        for t in tables:
            q = sql.SQL("SELECT EXISTS (SELECT 1 FROM {}.{})").format(sql.Identifier(name), sql.Identifier(t))
            if t != "schema_version" and (await (await conn.execute(q)).fetchone() or (False,))[0]:
                seeded.append(t)
    _template[name] = seeded
    return name


_TABLES = (
    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'"
    " ORDER BY table_name"
)


async def _reset(url: str, schema: str, template: str) -> None:
    """Empty every table but schema_version and copy the template's seeded rows back, in one round trip.

    DELETE, not TRUNCATE: TRUNCATE gives each of forty small tables new files, ten times slower.
    Foreign keys are not checked meanwhile (`session_replication_role = replica`), so the order
    of the tables does not matter; every sequence restarts at 1.
    """
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        tables = [str(r[0]) for r in await (await conn.execute(_TABLES, (schema,))).fetchall()]
        seqs = [str(r[0]) for r in await (await conn.execute(_SEQUENCES, (schema,))).fetchall()]
        script = [sql.SQL("SET LOCAL session_replication_role = replica"), sql.SQL("SET LOCAL lock_timeout = '10s'")]
        for t in tables:
            if t != "schema_version":
                script.append(sql.SQL("DELETE FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(t)))
        for t in _template[template]:
            script.append(
                sql.SQL("INSERT INTO {}.{} SELECT * FROM {}.{}").format(
                    sql.Identifier(schema), sql.Identifier(t), sql.Identifier(template), sql.Identifier(t)
                )
            )
        for q in seqs:
            script.append(sql.SQL("SELECT setval({}, 1, false)").format(sql.Literal(f'"{schema}"."{q}"')))
        async with conn.transaction():
            await conn.execute(sql.SQL("; ").join(script))


_SEQUENCES = "SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = %s"


async def _holders(url: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pid, state, application_name, left(query, 120) FROM pg_stat_activity"
            " WHERE datname = current_database() AND state LIKE 'idle in transaction%%'"
        )
        return list(await cur.fetchall())


@asynccontextmanager
async def recycled_schema() -> AsyncIterator[tuple[str, str]]:
    """(url, schema) of a migrated schema holding only what the migrations seed; reused after the test."""
    url = postgres_url()
    template = await _ensure_template(url)
    if _free:
        schema = _free.pop()
    else:
        schema = _name()
        store = PostgresStore(url, schema=schema)
        await store.open()
        await store.close()
    try:
        yield url, schema
    finally:
        try:
            await _reset(url, schema, template)
        except psycopg.errors.LockNotAvailable:
            # Something the test left holds a lock in this schema (a connection idle in a transaction):
            # say who, and retire the schema instead of handing it on.
            raise AssertionError(f"a lock in {schema} outlived the test: {await _holders(url)}") from None
        _free.append(schema)


@contextmanager
def fresh_schema_sync() -> Iterator[tuple[str, str]]:
    """`fresh_schema()` for a test that drives processes and has no loop of its own."""
    url = postgres_url()
    schema = _name()
    try:
        yield url, schema
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[tuple[str, str]]:
    """(url, schema) of a new, empty schema (no migrations applied), dropped afterwards."""
    url = postgres_url()
    schema = _name()
    try:
        yield url, schema
    finally:
        await drop_schema(url, schema)
