"""The rest of the journal (meta, spec, events, batch leaves): one contract on disk and in memory.

An agent is handed either store (`AgentJournal`) and cannot tell them apart; the simulator runs on the
memory one. Each test runs against both.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.journal import Journal
from agent.journal_api import AgentJournal, JournalFull, StoredSpec, new_journal_id
from agent.memory_journal import MemoryJournal
from bc.protocol.pb import session_pb2

NODE = "n1"
METRIC, TRANSITION, RESULT = session_pb2.METRIC, session_pb2.TRANSITION, session_pb2.RESULT


async def open_journal(kind: str, path: Path, seed: int = 3, max_events: int = 10_000) -> AgentJournal:
    if kind == "memory":
        return MemoryJournal(new_journal_id(random.Random(seed)), max_events=max_events)
    return await Journal.open(path, NODE, rng=random.Random(seed), max_events=max_events)


@pytest.fixture(params=["sqlite", "memory"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def journal(kind: str, tmp_path: Path) -> AsyncIterator[AgentJournal]:
    j = await open_journal(kind, tmp_path / "journal.db")
    try:
        yield j
    finally:
        await j.close()


async def test_a_new_journal_draws_its_id_from_the_agents_random(kind: str, tmp_path: Path) -> None:
    a = await open_journal(kind, tmp_path / "a.db", seed=3)
    b = await open_journal(kind, tmp_path / "b.db", seed=3)
    c = await open_journal(kind, tmp_path / "c.db", seed=4)
    try:
        assert a.journal_id == b.journal_id == new_journal_id(random.Random(3)) != c.journal_id
        assert a.journal_id.startswith("j-") and len(a.journal_id) == 18
    finally:
        for j in (a, b, c):
            await j.close()


async def test_meta_and_the_time_mark_that_only_moves_forward(journal: AgentJournal) -> None:
    assert await journal.get_meta("server_inventory_hash") == ""
    await journal.set_meta("server_inventory_hash", "abc")
    assert await journal.get_meta("server_inventory_hash") == "abc"
    assert await journal.int_meta("observed_generation") == 0
    await journal.set_observed(4)
    assert await journal.int_meta("observed_generation") == 4
    assert await journal.advance_time_mark(2_000) == 2_000
    assert await journal.advance_time_mark(1_000) == 2_000, "a mark never moves back"
    assert await journal.int_meta("server_time_mark_ms") == 2_000


async def test_the_spec_and_the_applied_generation_move_together(journal: AgentJournal) -> None:
    assert await journal.load_spec() is None
    spec = StoredSpec(3, "hash-3", b"body", b"sig", "worker-1", b"full")
    await journal.store_spec(spec)
    assert await journal.load_spec() == spec
    assert await journal.int_meta("applied_generation") == 3


async def test_events_are_numbered_acked_and_bounded(kind: str, tmp_path: Path) -> None:
    j = await open_journal(kind, tmp_path / "journal.db", max_events=3)
    try:
        first = await j.append_events([("m", METRIC, b"1"), ("t", TRANSITION, b"2")])
        assert [e.seq for e in first] == [1, 2]
        await j.append_events([("r", RESULT, b"3"), ("r", RESULT, b"4")])  # the oldest metric makes room
        assert [(e.seq, e.type) for e in await j.unacked_events()] == [(2, "t"), (3, "r"), (4, "r")]
        assert await j.is_full()
        with pytest.raises(JournalFull):
            await j.append_events([("r", RESULT, b"5")])
        assert [e.seq for e in await j.unacked_events(limit=2)] == [2, 3]
        assert await j.ack_events(3) == 2
        assert [e.seq for e in await j.unacked_events()] == [4]
        assert not await j.is_full()
        assert [e.seq for e in await j.append_events([("r", RESULT, b"6")])] == [5]
    finally:
        await j.close()


async def test_a_batch_leaf_stays_with_its_first_claimer(journal: AgentJournal) -> None:
    assert await journal.claim_batch_leaf("root", 0, "c1", 1.0) == "c1"
    assert await journal.claim_batch_leaf("root", 0, "c2", 2.0) == "c1"
    assert await journal.claim_batch_leaf("root", 1, "c2", 2.0) == "c2"
