"""The node's journal holds results, specs and the time mark: 0600 whatever the umask and the dir's mode."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.journal import Journal
from bc.protocol.pb import session_pb2


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def modes(directory: Path) -> dict[str, str]:
    return {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in sorted(directory.iterdir())}


@pytest.mark.usefixtures("open_umask")
async def test_a_new_journal_and_its_wal_are_0600(tmp_path: Path) -> None:
    d = tmp_path / "node"
    d.mkdir()
    d.chmod(0o777)
    j = await Journal.open(d / "journal.db", "n1")
    try:
        await j.append_events([("x.test", session_pb2.TRANSITION, b"x")])
        seen = modes(d)
    finally:
        await j.close()
    assert {"journal.db", "journal.db-wal", "journal.db-shm"} <= set(seen), seen
    assert seen == dict.fromkeys(seen, "0o600"), seen


@pytest.mark.usefixtures("open_umask")
async def test_an_older_open_journal_is_narrowed_at_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    j = await Journal.open(path, "n1")
    await j.close()
    path.chmod(0o644)
    j = await Journal.open(path, "n1")
    await j.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
