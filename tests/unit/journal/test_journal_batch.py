"""Group commit in the SQLite journal (`agent.journal_batch`), on real journal files.

Writes that arrive while a commit is in flight share the next transaction; each caller is answered only
once the transaction holding its write has committed (another connection can read it by then); a member
that raises costs the others nothing; a commit that fails rolls back every member and answers none as
written; and a crash between a batch's commit and its answers leaves each result to be sent once.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.journal import Journal
from agent.journal_conn import connect_commit_in_thread
from agent.journal_rules import Acceptance, CommandConflict, CommandEntry, Resolution, UnknownCommand, resolve
from agent.memory_journal import MemoryJournal

NODE = "n1"
INC, BOOT = "inc-1", "boot-1"
BODY = b"body"


def update(cid: str) -> bytes:
    return f"result of {cid}".encode()


def durable(path: Path) -> dict[str, tuple[str, bytes | None]]:
    """What another connection reads from the file: command id to (state, result)."""
    conn = sqlite3.connect(path)
    try:
        return {str(r[0]): (str(r[1]), r[2]) for r in conn.execute("SELECT command_id, state, result FROM commands")}
    finally:
        conn.close()


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[Journal]:
    j = await Journal.open(tmp_path / "journal.db", NODE)
    try:
        yield j
    finally:
        await j.close()


async def accept(j: Journal, cid: str) -> None:
    await j.accept(Acceptance(cid, "inventory.refresh", True, False, INC, BOOT, BODY, 1.0))


async def test_writes_that_arrive_during_a_commit_share_the_next_one_and_each_is_durable_when_answered(
    journal: Journal,
) -> None:
    ids = [f"c{i:02d}" for i in range(20)]

    async def command(cid: str) -> None:
        await accept(journal, cid)
        assert durable(journal.path).get(cid) == ("accepted", None), "answered before `accepted` was committed"
        assert await journal.finish(cid, update(cid), 2.0)
        assert durable(journal.path).get(cid) == ("done", update(cid)), "answered before `done` was committed"

    await asyncio.gather(*(command(cid) for cid in ids))
    stats = journal.batches.stats
    assert stats.transactions >= 1 and stats.members >= 2, "no batch formed"
    assert stats.members - stats.transactions > 0, "every write still had a transaction of its own"
    assert stats.split == 0 and stats.failed == 0
    assert sorted(cid for cid, _ in await journal.unacked_results()) == ids


async def test_a_member_that_raises_is_answered_with_its_error_and_the_others_commit(journal: Journal) -> None:
    await accept(journal, "done-1")
    await journal.finish("done-1", update("done-1"), 2.0)

    outcomes = await asyncio.gather(
        accept(journal, "lead"),  # alone: its commit is in flight while the rest queue
        accept(journal, "a"),
        accept(journal, "done-1"),  # re-accepting a done command: the rules refuse it
        journal.finish("nowhere", update("nowhere"), 2.0),  # no such command
        accept(journal, "b"),
        return_exceptions=True,
    )
    assert outcomes[0] is None and outcomes[1] is None and outcomes[4] is None
    assert isinstance(outcomes[2], CommandConflict)
    assert isinstance(outcomes[3], UnknownCommand)
    assert journal.batches.stats.split == 1
    rows = durable(journal.path)
    assert {cid: state for cid, (state, _) in rows.items()} == {
        "done-1": "done",
        "lead": "accepted",
        "a": "accepted",
        "b": "accepted",
    }
    assert rows["done-1"][1] == update("done-1"), "the first result stands"


async def with_foreign_keys(path: str) -> aiosqlite.Connection:
    conn = await connect_commit_in_thread(path)
    await conn.execute("PRAGMA foreign_keys = ON")
    return conn


async def test_a_batch_whose_commit_fails_rolls_back_every_member_and_answers_none(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    j = await Journal.open(path, NODE, connect=with_foreign_keys)
    try:
        # A real commit that fails: a command named poison-* leaves a row that breaks a deferred foreign key,
        # which SQLite checks at COMMIT, and the COMMIT fails with the transaction still open.
        setup = sqlite3.connect(path)
        setup.executescript(
            "CREATE TABLE parent (id INTEGER PRIMARY KEY);"
            "CREATE TABLE child (pid INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);"
            "CREATE TRIGGER poison AFTER INSERT ON commands WHEN NEW.command_id LIKE 'poison%'"
            " BEGIN INSERT INTO child (pid) VALUES (42); END;"
        )
        setup.close()
        members = ["a", "b", "poison-1", "c"]
        outcomes = await asyncio.gather(accept(j, "lead"), *(accept(j, cid) for cid in members), return_exceptions=True)
        assert outcomes[0] is None, "the write before the batch committed alone"
        assert all(isinstance(o, sqlite3.IntegrityError) for o in outcomes[1:]), outcomes
        assert j.batches.stats.failed == 1
        assert set(durable(path)) == {"lead"}, "a member of the failed batch reached the file"
        # The failed transaction was rolled back: the journal goes on, and so does a lone poison write.
        await accept(j, "after")
        with pytest.raises(sqlite3.IntegrityError):
            await accept(j, "poison-2")
        await accept(j, "after-2")
        assert set(durable(path)) == {"lead", "after", "after-2"}
    finally:
        await j.close()


async def test_a_caller_cancelled_while_its_commit_runs_leaves_it_to_land_before_the_next_begin(
    journal: Journal,
) -> None:
    first = asyncio.create_task(accept(journal, "first"))
    await asyncio.sleep(0)  # one turn: the write is in its COMMIT, on the connection's thread
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await accept(journal, "second")  # its BEGIN must wait for that COMMIT, not run beside it
    assert set(durable(journal.path)) == {"first", "second"}, "a COMMIT already handed over was lost"


async def test_a_caller_cancelled_while_its_begin_waits_for_the_lock_leaves_no_transaction_behind(
    journal: Journal,
) -> None:
    other = sqlite3.connect(journal.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another connection holds the write lock: BEGIN waits on the thread
    first = asyncio.create_task(accept(journal, "first"))
    await asyncio.sleep(0)  # one turn: the write waits in its BEGIN, on the connection's thread
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    other.execute("COMMIT")  # the cancelled BEGIN now gets the lock, for a transaction nobody owns
    other.close()
    await accept(journal, "second")
    assert await journal.finish("second", update("second"), 2.0)
    assert set(durable(journal.path)) == {"second"}


CRASHED = 17
CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from agent.journal import Journal
    from agent.journal_rules import Acceptance
    from agent.journal_conn import connect_commit_in_thread

    path, n, crashed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    class CrashAfterCommit:
        # The process dies the moment its commit number `at` is on the disk, before anyone is answered.
        def __init__(self, inner, at):
            self.inner, self.at, self.commits = inner, at, 0

        def execute(self, sql, params=()):
            result = self.inner.execute(sql, params)
            if sql != "COMMIT":
                return result
            self.commits += 1
            if self.commits < self.at:
                return result

            async def then_crash():
                await result
                os._exit(crashed)

            return then_crash()

        def executemany(self, sql, params):
            return self.inner.executemany(sql, params)

        @property
        def in_transaction(self):
            return self.inner.in_transaction

        async def close(self):
            await self.inner.close()

    async def connect(p):
        # Opening commits once, then n accepts one by one, then n finishes at once: the first alone, the
        # other n-1 in one batch, whose commit is the last.
        return CrashAfterCommit(await connect_commit_in_thread(p), at=1 + n + 2)

    async def main():
        j = await Journal.open(path, "n1", connect=connect)
        for i in range(n):
            await j.accept(Acceptance(f"c{i}", "inventory.refresh", True, False, "inc-1", "boot-1", b"body", 1.0))

        async def finish(i):
            await j.finish(f"c{i}", f"result of c{i}".encode(), 2.0)
            print(f"answered c{i}", flush=True)  # the ack the dispatcher would send now

        await asyncio.gather(*(finish(i) for i in range(n)))
        print("no crash", flush=True)

    asyncio.run(main())
    """
)


async def test_a_crash_between_a_batchs_commit_and_its_answers_leaves_each_result_to_send_once(
    tmp_path: Path,
) -> None:
    path, n = tmp_path / "journal.db", 6
    child = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", CHILD, str(path), str(n), str(CRASHED)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        check=False,
    )
    assert child.returncode == CRASHED, child.stderr
    answered = [line.removeprefix("answered ") for line in child.stdout.splitlines()]
    assert "no crash" not in child.stdout
    assert answered == ["c0"], f"members of the batch were answered before the crash: {answered}"

    j = await Journal.open(path, NODE)  # the next process
    try:
        unacked = await j.unacked_results()
        assert sorted(cid for cid, _ in unacked) == [f"c{i}" for i in range(n)], "a committed result was lost"
        assert len({cid for cid, _ in unacked}) == len(unacked), "a result would go out twice in one Hello"
        for cid, result in unacked:
            entry = await j.get_command(cid)
            assert entry is not None and resolve(entry, "inc-2", "boot-1") is Resolution.RESEND
            assert result == update(cid)
        assert await j.ack_results(cid for cid, _ in unacked) == n
        assert await j.ack_results(cid for cid, _ in unacked) == 0, "an acked result was acked again"
        assert await j.unacked_results() == [], "an acked result would be sent again"
    finally:
        await j.close()


# -- the batch against the rules, applied one write at a time ----------------------------------------------

Op = tuple[str, int]  # ("accept" | "finish" | "ack", command index)
OPS = st.lists(st.tuples(st.sampled_from(["accept", "finish", "ack"]), st.integers(0, 5)), min_size=1, max_size=24)


async def apply(store: Journal | MemoryJournal, op: Op) -> Any:
    kind, i = op
    cid = f"c{i}"
    if kind == "accept":
        return await store.accept(Acceptance(cid, "inventory.refresh", True, False, INC, BOOT, BODY, 1.0))
    if kind == "finish":
        return await store.finish(cid, update(cid), 2.0)
    return await store.ack_results([cid])


def outcome(r: Any) -> Any:
    return type(r) if isinstance(r, Exception) else r


def rows(entries: list[CommandEntry]) -> list[tuple[str, str, bytes | None, bool]]:
    return sorted((e.command_id, e.state, e.result, e.acked) for e in entries)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=OPS, second=OPS)
def test_concurrent_writes_end_as_the_same_writes_one_at_a_time_in_memory(first: list[Op], second: list[Op]) -> None:
    """Whatever batches form and split, every caller gets the outcome, and the file holds the entries, that the
    memory journal gives the same writes one at a time in the order they were issued."""

    async def run() -> None:
        with tempfile.TemporaryDirectory() as d:
            j = await Journal.open(Path(d) / "journal.db", NODE)
            memory = MemoryJournal()
            try:
                for ops in (first, second):  # two waves, so the second meets entries the first left
                    got = await asyncio.gather(*(apply(j, op) for op in ops), return_exceptions=True)
                    want = []
                    for op in ops:
                        try:
                            want.append(await apply(memory, op))
                        except Exception as e:
                            want.append(e)
                    assert [outcome(r) for r in got] == [outcome(r) for r in want], ops
                    assert rows(await j.commands()) == rows(await memory.commands())
            finally:
                await j.close()

    asyncio.run(run())
