"""The command half of the journal: the same contract on disk (SQLite, real files) and in memory."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.journal import Journal
from agent.journal_rules import (
    Acceptance,
    CommandConflict,
    CommandEntry,
    CommandStore,
    Settlement,
    UnknownCommand,
    recover,
)
from agent.memory_journal import MemoryJournal

NODE = "n1"
INC, BOOT = "inc-2", "boot-2"
OLD_INC, OLD_BOOT = "inc-1", "boot-1"
DAY = 86400.0


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CommandStore]:
    if request.param == "memory":
        yield MemoryJournal()
        return
    j = await Journal.open(tmp_path / "journal.db", NODE)
    try:
        yield j
    finally:
        await j.close()


async def accept(
    s: CommandStore,
    cid: str,
    *,
    inc: str = INC,
    boot: str = BOOT,
    retry_safe: bool = False,
    self_terminating: bool = False,
    now: float = 1.0,
) -> None:
    await s.accept(Acceptance(cid, "gpu.reset", retry_safe, self_terminating, inc, boot, b"body-" + cid.encode(), now))


async def test_accept_is_readable_back_with_its_body(store: CommandStore) -> None:
    assert await store.get_command("c1") is None
    await accept(store, "c1", retry_safe=True, now=5.0)
    assert await store.get_command("c1") == CommandEntry(
        "c1", "gpu.reset", "accepted", INC, BOOT, True, False, 5.0, None, False
    )
    assert await store.command_body("c1") == b"body-c1"
    assert await store.command_body("nope") is None


async def test_a_duplicate_accept_and_a_done_command_are_refused(store: CommandStore) -> None:
    await accept(store, "c1")
    with pytest.raises(CommandConflict):
        await accept(store, "c1")
    await store.finish("c1", b"done", 2.0)
    with pytest.raises(CommandConflict):
        await accept(store, "c1", inc="inc-3")
    entry = await store.get_command("c1")
    assert entry is not None and entry.result == b"done"


async def test_a_reexecution_takes_over_an_earlier_process_entry(store: CommandStore) -> None:
    await accept(store, "c1", inc=OLD_INC, boot=OLD_BOOT, retry_safe=True)
    await store.mark_running("c1", OLD_INC, OLD_BOOT, 2.0)
    await store.accept(Acceptance("c1", "gpu.reset", True, False, INC, BOOT, b"again", 3.0))
    entry = await store.get_command("c1")
    assert entry is not None
    assert (entry.state, entry.incarnation_id, entry.boot_id, entry.updated_at) == ("accepted", INC, BOOT, 3.0)
    assert await store.command_body("c1") == b"again"


async def test_mark_running_records_the_boot(store: CommandStore) -> None:
    with pytest.raises(UnknownCommand):
        await store.mark_running("c1", INC, BOOT, 1.0)
    await accept(store, "c1", self_terminating=True)
    await store.mark_running("c1", INC, BOOT, 4.0)
    entry = await store.get_command("c1")
    assert entry is not None and (entry.state, entry.boot_id, entry.updated_at) == ("running", BOOT, 4.0)
    with pytest.raises(CommandConflict):
        await store.mark_running("c1", "another-process", BOOT, 5.0)


async def test_finish_keeps_the_first_result(store: CommandStore) -> None:
    with pytest.raises(UnknownCommand):
        await store.finish("c1", b"r", 1.0)
    await accept(store, "c1")
    assert await store.finish("c1", b"first", 2.0) is True
    assert await store.finish("c1", b"second", 3.0) is False
    entry = await store.get_command("c1")
    assert entry is not None and (entry.state, entry.result, entry.acked) == ("done", b"first", False)
    assert await store.command_body("c1") == b"body-c1", "the body outlives the result"


async def test_a_rejection_is_journaled_so_a_duplicate_gets_the_same_answer(store: CommandStore) -> None:
    assert await store.record_done("c1", "gpu.reset", b"rejected:EXPIRED", INC, BOOT, 1.0) is True
    assert await store.record_done("c1", "gpu.reset", b"rejected:other", INC, BOOT, 2.0) is False
    entry = await store.get_command("c1")
    assert entry is not None and (entry.state, entry.kind, entry.result) == ("done", "gpu.reset", b"rejected:EXPIRED")
    # a re-execution whose acceptance checks fail again settles the old entry
    await accept(store, "c2", inc=OLD_INC, retry_safe=True)
    assert await store.record_done("c2", "gpu.reset", b"rejected:STALE", INC, BOOT, 3.0) is True
    entry = await store.get_command("c2")
    assert entry is not None and (entry.state, entry.result) == ("done", b"rejected:STALE")


async def test_results_are_unacked_until_acked_oldest_first(store: CommandStore) -> None:
    for i, cid in enumerate(["c3", "c1", "c2"]):
        await accept(store, cid, now=float(i))
    await store.finish("c2", b"R2", 10.0)
    await store.finish("c3", b"R3", 11.0)
    await store.record_done("c0", "k", b"R0", INC, BOOT, 12.0)
    assert await store.unacked_results() == [("c2", b"R2"), ("c3", b"R3"), ("c0", b"R0")]
    assert await store.ack_results(["c3", "unknown", "c1", "c3"]) == 1, "only done results are acked, once"
    assert await store.unacked_results() == [("c2", b"R2"), ("c0", b"R0")]
    assert await store.ack_results([]) == 0
    entry = await store.get_command("c3")
    assert entry is not None and entry.acked and entry.result == b"R3", "an acked result is still resent"


async def test_settlements_mark_entries_done_in_one_go(store: CommandStore) -> None:
    await accept(store, "a", inc=OLD_INC, boot=OLD_BOOT, self_terminating=True)
    await store.mark_running("a", OLD_INC, OLD_BOOT, 2.0)
    await accept(store, "b", inc=OLD_INC, boot=OLD_BOOT, now=3.0)
    await accept(store, "c", inc=OLD_INC, boot=OLD_BOOT, retry_safe=True, now=4.0)
    settlements = recover(await store.commands(), INC, "boot-3")
    assert settlements == [Settlement("a", "rebooted", OLD_BOOT), Settlement("b", "interrupted", OLD_BOOT)]
    with pytest.raises(KeyError):
        await store.apply_settlements(settlements, {"a": b"A"}, 5.0)
    assert await store.unacked_results() == [], "a refused settlement writes nothing"
    assert await store.apply_settlements(settlements, {"a": b"A", "b": b"B"}, 5.0) == 2
    assert await store.apply_settlements(settlements, {"a": b"A2", "b": b"B2"}, 6.0) == 0
    assert await store.unacked_results() == [("a", b"A"), ("b", b"B")]
    entry = await store.get_command("c")
    assert entry is not None and entry.state == "accepted", "a retry-safe entry waits for redelivery"


async def test_commands_lists_and_deletes(store: CommandStore) -> None:
    await accept(store, "b", now=2.0)
    await accept(store, "a", now=1.0)
    assert [e.command_id for e in await store.commands()] == ["a", "b"]
    assert await store.delete_commands(["a", "zzz"]) == 1
    assert [e.command_id for e in await store.commands()] == ["b"]
    assert await store.command_body("a") is None
    assert await store.delete_commands([]) == 0


async def test_sweep_deletes_old_entries_but_never_the_running_process_in_flight(store: CommandStore) -> None:
    now = 30 * DAY
    await store.record_done("old-done", "k", b"r", OLD_INC, OLD_BOOT, now - 8 * DAY)
    await store.record_done("new-done", "k", b"r", OLD_INC, OLD_BOOT, now - 1 * DAY)
    await accept(store, "old-left", inc=OLD_INC, now=now - 9 * DAY)
    await accept(store, "old-mine", inc=INC, now=now - 9 * DAY)
    assert sorted(await store.sweep_commands(now, INC)) == ["old-done", "old-left"]
    assert [e.command_id for e in await store.commands()] == ["old-mine", "new-done"]


# -- on disk only -------------------------------------------------------------


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "journal.db"


async def test_commands_survive_reopen(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        await j.accept(Acceptance("acc", "node.reboot", True, True, OLD_INC, OLD_BOOT, b"B1", 1.0))
        await j.accept(Acceptance("run", "node.reboot", True, True, OLD_INC, OLD_BOOT, b"B2", 2.0))
        await j.mark_running("run", OLD_INC, OLD_BOOT, 3.0)
        await j.accept(Acceptance("fin", "gpu.reset", False, False, OLD_INC, OLD_BOOT, b"B3", 4.0))
        await j.finish("fin", b"\x00result\xff", 5.0)
        await j.record_done("rej", "gpu.reset", b"rejected", OLD_INC, OLD_BOOT, 6.0)
        await j.ack_results(["rej"])
        before = await j.commands()
    finally:
        await j.close()
    j2 = await Journal.open(path, NODE)
    try:
        assert await j2.commands() == before
        assert [(e.command_id, e.state) for e in before] == [
            ("acc", "accepted"),
            ("run", "running"),
            ("fin", "done"),
            ("rej", "done"),
        ]
        assert await j2.command_body("run") == b"B2"
        assert await j2.command_body("rej") is None
        assert await j2.unacked_results() == [("fin", b"\x00result\xff")]
        # the new process recovers what the old one left, in a new boot
        settlements = recover(await j2.commands(), INC, BOOT)
        assert settlements == [Settlement("run", "rebooted", OLD_BOOT)]
        await j2.apply_settlements(settlements, {"run": b"rebooted"}, 7.0)
    finally:
        await j2.close()
    j3 = await Journal.open(path, NODE)
    try:
        assert await j3.unacked_results() == [("fin", b"\x00result\xff"), ("run", b"rebooted")]
        await j3.ack_results(["fin", "run"])
    finally:
        await j3.close()
    j4 = await Journal.open(path, NODE)
    try:
        assert await j4.unacked_results() == []
    finally:
        await j4.close()


async def test_a_journal_from_before_commands_opens_and_keeps_its_data(path: Path) -> None:
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, type TEXT NOT NULL, class INTEGER NOT NULL,"
            " payload BLOB NOT NULL)"
        )
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("node_id", NODE), ("journal_id", "j-old"), ("event_seq", "1")],
        )
        conn.execute("INSERT INTO events (seq, type, class, payload) VALUES (1, 'e', 3, x'01')")
    conn.close()
    j = await Journal.open(path, NODE)
    try:
        assert j.journal_id == "j-old"
        assert [e.payload for e in await j.unacked_events()] == [b"\x01"]
        await j.accept(Acceptance("c1", "k", False, False, INC, BOOT, b"", 1.0))
        assert (await j.get_command("c1")) is not None
    finally:
        await j.close()


async def test_concurrent_writers_do_not_share_a_transaction(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        await asyncio.gather(
            *(j.accept(Acceptance(f"c{i}", "k", False, False, INC, BOOT, b"", float(i))) for i in range(20)),
            *(j.append_events([("e", 3, bytes([i]))]) for i in range(20)),
        )
        await asyncio.gather(*(j.finish(f"c{i}", b"r%d" % i, 50.0 + i) for i in range(20)))
        assert len(await j.unacked_results()) == 20
        assert [e.seq for e in await j.unacked_events()] == list(range(1, 21))
    finally:
        await j.close()
