"""The agent's journal on real files: identity, spec, events, the time mark, and what it does with bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.journal import Journal, StoredSpec
from bc.errors import UsageError

NODE = "n1"


def spec(generation: int, signature: bytes | None = b"sig") -> StoredSpec:
    return StoredSpec(
        generation=generation,
        spec_hash=f"sha256:{generation:04d}",
        body=b"body-\x00\x01" + bytes([generation]),
        signature=signature,
        key_id="k1",
        full_spec=b"full-" + bytes([generation]),
    )


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "journal.db"


async def test_a_new_journal_gets_an_id_that_survives_reopen(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        jid = j.journal_id
        assert jid.startswith("j-")
        assert len(jid) > 2
        assert j.node_id == NODE
        assert path.exists()
    finally:
        await j.close()
    j2 = await Journal.open(path, NODE)
    try:
        assert j2.journal_id == jid
    finally:
        await j2.close()


async def test_two_new_journals_get_different_ids(tmp_path: Path) -> None:
    a = await Journal.open(tmp_path / "a" / "journal.db", NODE)
    b = await Journal.open(tmp_path / "b" / "journal.db", NODE)
    try:
        assert a.journal_id != b.journal_id
    finally:
        await a.close()
        await b.close()


async def test_a_new_journal_holds_no_spec_and_applied_generation_zero(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        assert await j.load_spec() is None
        assert await j.int_meta("applied_generation") == 0
        assert await j.unacked_events() == []
    finally:
        await j.close()


async def test_the_spec_round_trips_and_moves_the_applied_generation(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        await j.store_spec(spec(3))
        assert await j.load_spec() == spec(3)
        assert await j.int_meta("applied_generation") == 3
        await j.store_spec(spec(5, signature=None))
        assert await j.load_spec() == spec(5, signature=None)
        assert await j.int_meta("applied_generation") == 5
    finally:
        await j.close()
    j2 = await Journal.open(path, NODE)
    try:
        assert await j2.load_spec() == spec(5, signature=None)
        assert await j2.int_meta("applied_generation") == 5
    finally:
        await j2.close()


async def test_events_are_numbered_from_one_and_survive_reopen(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        first = await j.append_events([("allocation.bound", 2, b"a"), ("allocation.released", 2, b"b")])
        assert [e.seq for e in first] == [1, 2]
        second = await j.append_events([("metric", 1, b"c")])
        assert [e.seq for e in second] == [3]
        assert await j.append_events([]) == []
    finally:
        await j.close()
    j2 = await Journal.open(path, NODE)
    try:
        events = await j2.unacked_events()
        assert [(e.seq, e.type, e.event_class, e.payload) for e in events] == [
            (1, "allocation.bound", 2, b"a"),
            (2, "allocation.released", 2, b"b"),
            (3, "metric", 1, b"c"),
        ]
        more = await j2.append_events([("x", 3, b"d")])
        assert [e.seq for e in more] == [4]
    finally:
        await j2.close()


async def test_an_ack_drops_events_up_to_and_including_its_seq(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        await j.append_events([(f"e{i}", 2, bytes([i])) for i in range(5)])
        assert await j.ack_events(3) == 3
        assert [e.seq for e in await j.unacked_events()] == [4, 5]
        assert await j.ack_events(3) == 0
        # acked events never renumber: the next one continues the sequence
        assert [e.seq for e in await j.append_events([("e5", 2, b"")])] == [6]
    finally:
        await j.close()
    j2 = await Journal.open(path, NODE)
    try:
        assert [e.seq for e in await j2.unacked_events()] == [4, 5, 6]
    finally:
        await j2.close()


async def test_the_time_mark_only_moves_forward(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        assert await j.advance_time_mark(1_000) == 1_000
        assert await j.advance_time_mark(500) == 1_000
        assert await j.advance_time_mark(1_000) == 1_000
        assert await j.advance_time_mark(2_000) == 2_000
    finally:
        await j.close()
    j2 = await Journal.open(path, NODE)
    try:
        assert await j2.int_meta("server_time_mark_ms") == 2_000
        assert await j2.advance_time_mark(1_999) == 2_000
    finally:
        await j2.close()


async def test_a_journal_of_another_node_is_refused_and_left_untouched(path: Path) -> None:
    j = await Journal.open(path, NODE)
    jid = j.journal_id
    await j.append_events([("e", 2, b"keep")])
    await j.close()
    before = path.read_bytes()
    with pytest.raises(UsageError, match="n1"):
        await Journal.open(path, "n2")
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir() if ".corrupt-" in p.name] == []
    j2 = await Journal.open(path, NODE)
    try:
        assert j2.journal_id == jid
        assert [e.payload for e in await j2.unacked_events()] == [b"keep"]
    finally:
        await j2.close()


async def test_a_corrupt_journal_is_moved_aside_and_a_new_one_starts(path: Path) -> None:
    j = await Journal.open(path, NODE)
    old_id = j.journal_id
    await j.store_spec(spec(7))
    await j.close()
    garbage = b"this is not a sqlite database \x00\xff" * 200
    path.write_bytes(garbage)

    j2 = await Journal.open(path, NODE)
    try:
        aside = [p for p in path.parent.iterdir() if p.name.startswith("journal.db.corrupt-")]
        assert len(aside) == 1
        suffix = aside[0].name.removeprefix("journal.db.corrupt-")
        assert suffix.isdigit()
        assert aside[0].read_bytes() == garbage
        assert j2.journal_id.startswith("j-")
        assert j2.journal_id != old_id
        assert await j2.load_spec() is None
        assert await j2.int_meta("applied_generation") == 0
        assert [e.seq for e in await j2.append_events([("e", 2, b"")])] == [1]
    finally:
        await j2.close()


async def test_a_journal_with_damaged_pages_is_moved_aside_too(path: Path) -> None:
    j = await Journal.open(path, NODE)
    old_id = j.journal_id
    await j.append_events([("metric", 1, b"x" * 3000) for _ in range(40)])
    await j.close()
    data = bytearray(path.read_bytes())
    assert len(data) > 8192
    for offset in range(4096, len(data), 4096):  # keep the header page, damage every other page
        data[offset : offset + 200] = b"\xde\xad" * 100
    path.write_bytes(bytes(data))

    j2 = await Journal.open(path, NODE)
    try:
        aside = [p for p in path.parent.iterdir() if p.name.startswith("journal.db.corrupt-")]
        assert len(aside) == 1
        assert aside[0].read_bytes() == bytes(data)
        assert j2.journal_id != old_id
        assert await j2.unacked_events() == []
    finally:
        await j2.close()
