"""Both SQLite drivers, on tmp files and a settable clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bc.store import Store
from bc.store.sqlite import InlineSqliteStore, SqliteStore
from bc.testing import FakeClock

MakeStore = Callable[[], Store]

DRIVERS: dict[str, Callable[[Path, FakeClock], Store]] = {
    "aiosqlite": lambda tmp, clock: SqliteStore(tmp / "a.db", clock),
    "inline": lambda tmp, clock: InlineSqliteStore(tmp / "b.db", clock),
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=sorted(DRIVERS))
def make_store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> MakeStore:
    """A factory for unopened stores on the same file (to reopen it)."""
    factory = DRIVERS[request.param]
    return lambda: factory(tmp_path, clock)


@pytest.fixture
async def store(make_store: MakeStore) -> AsyncIterator[Store]:
    s = make_store()
    await s.open()
    try:
        yield s
    finally:
        await s.close()
