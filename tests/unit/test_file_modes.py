"""Files that hold secrets are 0600 whatever the umask and the directory's mode.

The control plane's store (tokens, certificates) and the node's journal (results, specs, the time mark),
with their SQLite side files.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.journal import Journal
from bc.protocol.pb import session_pb2
from bc.store import Store, settings
from bc.store.sqlite import InlineSqliteStore, SqliteStore
from bc.testing import virtual_clock

DRIVERS: dict[str, Callable[[Path], Store]] = {
    "aiosqlite": lambda path: SqliteStore(path, virtual_clock()),
    "inline": lambda path: InlineSqliteStore(path, virtual_clock()),
}


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 0: every file a process creates is as open as its creator asks."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def open_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    d.chmod(0o777)
    return d


def modes(directory: Path) -> dict[str, str]:
    return {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in sorted(directory.iterdir())}


async def write_something(store: Store) -> None:
    async with store.transaction() as tx:
        await settings.put(tx, "file-mode-test", "x")


@pytest.mark.usefixtures("open_umask")
@pytest.mark.parametrize("driver", sorted(DRIVERS))
async def test_a_new_store_and_its_wal_are_0600(open_dir: Path, driver: str) -> None:
    store = DRIVERS[driver](open_dir / "bc.db")
    await store.open()
    try:
        await write_something(store)
        seen = modes(open_dir)
    finally:
        await store.close()
    assert {"bc.db", "bc.db-wal", "bc.db-shm"} <= set(seen), seen
    assert seen == dict.fromkeys(seen, "0o600"), seen


@pytest.mark.usefixtures("open_umask")
@pytest.mark.parametrize("driver", sorted(DRIVERS))
async def test_an_older_world_readable_store_is_narrowed_at_open(open_dir: Path, driver: str) -> None:
    path = open_dir / "bc.db"
    store = DRIVERS[driver](path)
    await store.open()
    await write_something(store)
    await store.close()
    path.chmod(0o644)
    (open_dir / "bc.db-wal").write_bytes(b"")  # a side file an older version left readable
    (open_dir / "bc.db-wal").chmod(0o644)

    again = DRIVERS[driver](path)
    await again.open()
    try:
        seen = modes(open_dir)
    finally:
        await again.close()
    assert seen["bc.db"] == "0o600" and seen["bc.db-wal"] == "0o600", seen
    assert set(modes(open_dir).values()) == {"0o600"}, modes(open_dir)


@pytest.mark.usefixtures("open_umask")
async def test_a_new_journal_and_its_wal_are_0600(open_dir: Path) -> None:
    j = await Journal.open(open_dir / "journal.db", "n1")
    try:
        await j.append_events([("x.test", session_pb2.TRANSITION, b"x")])
        seen = modes(open_dir)
    finally:
        await j.close()
    assert {"journal.db", "journal.db-wal", "journal.db-shm"} <= set(seen), seen
    assert seen == dict.fromkeys(seen, "0o600"), seen


@pytest.mark.usefixtures("open_umask")
async def test_an_older_open_journal_is_narrowed_at_open(open_dir: Path) -> None:
    path = open_dir / "journal.db"
    j = await Journal.open(path, "n1")
    await j.close()
    path.chmod(0o644)
    j = await Journal.open(path, "n1")
    await j.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
