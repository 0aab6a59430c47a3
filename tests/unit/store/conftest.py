"""Every driver: both SQLite drivers on tmp files, and PostgreSQL (a schema per test) when
`BC_TEST_POSTGRES` names a database; all on the virtual loop's clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bc.seams.clock import LoopClock
from bc.store import Store
from bc.store.postgres import PostgresStore
from bc.store.sqlite import InlineSqliteStore, SqliteStore
from bc.testing import virtual_clock
from tests.pg import fresh_schema

MakeStore = Callable[[], Store]

DRIVERS: dict[str, Callable[[Path, LoopClock], Store]] = {
    "aiosqlite": lambda tmp, clock: SqliteStore(tmp / "a.db", clock),
    "inline": lambda tmp, clock: InlineSqliteStore(tmp / "b.db", clock),
}


@pytest.fixture
def clock() -> LoopClock:
    return virtual_clock()


@pytest.fixture(params=[*sorted(DRIVERS), pytest.param("postgres", marks=pytest.mark.postgres)])
async def make_store(request: pytest.FixtureRequest, tmp_path: Path, clock: LoopClock) -> AsyncIterator[MakeStore]:
    """A factory for unopened stores on the same file or schema (to reopen it)."""
    if request.param == "postgres":
        async with fresh_schema() as (url, schema):
            yield lambda: PostgresStore(url, clock, schema=schema, db_clock=False)
        return
    factory = DRIVERS[request.param]
    yield lambda: factory(tmp_path, clock)


@pytest.fixture
async def store(make_store: MakeStore) -> AsyncIterator[Store]:
    s = make_store()
    await s.open()
    try:
        yield s
    finally:
        await s.close()
