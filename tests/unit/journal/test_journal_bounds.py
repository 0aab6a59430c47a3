"""The SQLite journal's event bounds on real files: metrics make room, results and transitions never do."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.journal import Journal, JournalFull
from agent.journal_rules import MAX_BYTES, MAX_EVENTS, METRIC, RESULT, TRANSITION

NODE = "n1"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "journal.db"


async def kept(j: Journal) -> list[tuple[int, str]]:
    return [(e.seq, e.type) for e in await j.unacked_events()]


async def test_the_oldest_metrics_are_dropped_to_admit_new_events(path: Path) -> None:
    j = await Journal.open(path, NODE, max_events=4)
    try:
        await j.append_events(
            [("m1", METRIC, b"1"), ("r2", RESULT, b"2"), ("m3", METRIC, b"3"), ("t4", TRANSITION, b"4")]
        )
        assert not await j.is_full()
        out = await j.append_events([("r5", RESULT, b"5")])
        assert [e.seq for e in out] == [5]
        assert await kept(j) == [(2, "r2"), (3, "m3"), (4, "t4"), (5, "r5")]
        await j.append_events([("m6", METRIC, b"6")])
        assert await kept(j) == [(2, "r2"), (4, "t4"), (5, "r5"), (6, "m6")]
    finally:
        await j.close()


async def test_the_byte_bound_drops_metrics_too(path: Path) -> None:
    j = await Journal.open(path, NODE, max_bytes=100)
    try:
        await j.append_events([("m1", METRIC, b"x" * 30), ("m2", METRIC, b"x" * 30), ("r3", RESULT, b"x" * 30)])
        await j.append_events([("r4", RESULT, b"x" * 40)])
        assert await kept(j) == [(2, "m2"), (3, "r3"), (4, "r4")]
    finally:
        await j.close()


async def test_results_and_transitions_are_never_dropped_and_a_full_journal_refuses(path: Path) -> None:
    j = await Journal.open(path, NODE, max_events=3)
    try:
        await j.append_events([("r1", RESULT, b"1"), ("m2", METRIC, b"2"), ("t3", TRANSITION, b"3")])
        assert not await j.is_full(), "the metric can still make room"
        await j.append_events([("r4", RESULT, b"4")])
        assert await kept(j) == [(1, "r1"), (3, "t3"), (4, "r4")]
        assert await j.is_full()
        for cls in (RESULT, TRANSITION, METRIC):
            with pytest.raises(JournalFull):
                await j.append_events([("x", cls, b"x")])
        assert await kept(j) == [(1, "r1"), (3, "t3"), (4, "r4")], "a refused batch writes nothing"
        assert await j.int_meta("event_seq") == 4, "and takes no sequence numbers"
        # acks drain the backlog: the journal takes events again, numbered on
        await j.ack_events(1)
        assert not await j.is_full()
        assert [e.seq for e in await j.append_events([("r5", RESULT, b"5")])] == [5]
    finally:
        await j.close()


async def test_a_batch_that_needs_more_than_the_metrics_drops_nothing(path: Path) -> None:
    j = await Journal.open(path, NODE, max_events=3)
    try:
        await j.append_events([("m1", METRIC, b"1"), ("r2", RESULT, b"2")])
        with pytest.raises(JournalFull):
            await j.append_events([("r3", RESULT, b"3"), ("r4", RESULT, b"4"), ("r5", RESULT, b"5")])
        assert await kept(j) == [(1, "m1"), (2, "r2")]
    finally:
        await j.close()


async def test_the_bytes_bound_counts_results_too(path: Path) -> None:
    j = await Journal.open(path, NODE, max_bytes=64)
    try:
        await j.append_events([("r1", RESULT, b"x" * 64)])
        assert await j.is_full()
        with pytest.raises(JournalFull):
            await j.append_events([("r2", RESULT, b"y")])
    finally:
        await j.close()


async def test_bounds_hold_across_reopen_and_config_can_only_lower_them(path: Path) -> None:
    j = await Journal.open(path, NODE, max_events=MAX_EVENTS * 10, max_bytes=MAX_BYTES + 1)
    try:
        assert (j.max_events, j.max_bytes) == (MAX_EVENTS, MAX_BYTES)
        await j.append_events([("r1", RESULT, b"1"), ("r2", RESULT, b"2")])
    finally:
        await j.close()
    j2 = await Journal.open(path, NODE, max_events=2)
    try:
        assert (j2.max_events, j2.max_bytes) == (2, MAX_BYTES)
        assert await j2.is_full()
        with pytest.raises(JournalFull):
            await j2.append_events([("r3", RESULT, b"3")])
    finally:
        await j2.close()


async def test_size_bytes_is_the_size_on_disk(path: Path) -> None:
    j = await Journal.open(path, NODE)
    try:
        before = await j.size_bytes()
        assert before > 0
        await j.append_events([("m", METRIC, b"z" * 10_000) for _ in range(10)])  # each within max_event_bytes
        assert await j.size_bytes() >= before + 100_000
    finally:
        await j.close()
