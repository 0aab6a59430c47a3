"""Both SQLite drivers, on tmp files and the virtual loop's clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bc.clock import LoopClock
from bc.store import Store
from bc.store.sqlite import InlineSqliteStore, SqliteStore
from bc.testing import virtual_clock

MakeStore = Callable[[], Store]

DRIVERS: dict[str, Callable[[Path, LoopClock], Store]] = {
    "aiosqlite": lambda tmp, clock: SqliteStore(tmp / "a.db", clock),
    "inline": lambda tmp, clock: InlineSqliteStore(tmp / "b.db", clock),
}


@pytest.fixture
def clock() -> LoopClock:
    return virtual_clock()


@pytest.fixture(params=sorted(DRIVERS))
def make_store(request: pytest.FixtureRequest, tmp_path: Path, clock: LoopClock) -> MakeStore:
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
