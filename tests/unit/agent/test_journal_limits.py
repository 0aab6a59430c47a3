"""The journal never holds what the node could not send: results and events are fitted to the size table.

The rules (`journal_rules.fit_update`, `fit_event`, `refit`) are checked on their
own, then on both stores (real SQLite files and the in-memory journal), and on a
journal an older agent left with an oversized result in it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import journal_rules as rules
from agent.journal import Journal
from agent.journal_rules import Acceptance, CommandStore
from agent.memory_journal import MemoryJournal
from bc.protocol.limits import LIMITS, Limits
from bc.protocol.pb import session_pb2
from bc.protocol.pb.session_pb2 import CommandUpdate

NODE = "n1"
INC, BOOT = "inc-1", "boot-1"
SMALL = Limits(max_result_bytes=1000, max_text_bytes=200, max_event_bytes=300)


def done(cid: str, result: bytes, state: int = session_pb2.COMMAND_SUCCEEDED, message: str = "") -> CommandUpdate:
    return CommandUpdate(command_id=cid, state=state, reason="", message=message, result=result, boot_id=BOOT)


# -- the rules ------------------------------------------------------------------------


def test_a_result_over_the_limit_becomes_failed_result_too_large_saying_what_it_was() -> None:
    big = done("c1", b"x" * 1001)
    big.node_sig = b"an old signature"
    fitted = CommandUpdate.FromString(rules.fit_update(big.SerializeToString(), SMALL))
    assert fitted.command_id == "c1" and fitted.boot_id == BOOT
    assert fitted.state == session_pb2.COMMAND_FAILED
    assert fitted.reason == "result-too-large"
    assert fitted.message == (
        "the result is 1,001 bytes; the limit is 1,000 bytes (max_result_bytes); the command itself ended succeeded"
    )
    assert json.loads(fitted.result) == {
        "result_bytes": 1001,
        "max_result_bytes": 1000,
        "outcome": "succeeded",
        "outcome_reason": "",
    }
    assert fitted.node_sig == b""  # it covered a result that is no longer there


def test_a_result_at_the_limit_and_its_bytes_are_kept_exactly() -> None:
    raw = done("c1", b"x" * 1000, message="m" * 200).SerializeToString()
    assert rules.fit_update(raw, SMALL) is raw


def test_a_long_message_is_cut_and_the_outcome_kept() -> None:
    raw = done("c1", b"{}", state=session_pb2.COMMAND_FAILED, message="é" * 500).SerializeToString()
    fitted = CommandUpdate.FromString(rules.fit_update(raw, SMALL))
    assert fitted.state == session_pb2.COMMAND_FAILED and fitted.result == b"{}"
    assert len(fitted.message.encode()) <= 200 and fitted.message.startswith("é" * 50)


@given(
    st.integers(min_value=0, max_value=3000),
    st.text(max_size=400),
    st.text(max_size=400),
    st.sampled_from([session_pb2.COMMAND_SUCCEEDED, session_pb2.COMMAND_FAILED, session_pb2.COMMAND_REJECTED]),
)
def test_every_fitted_update_is_within_the_limits_and_fitting_twice_changes_nothing(
    result_bytes: int, reason: str, message: str, state: int
) -> None:
    u = CommandUpdate(command_id="c1", state=state, reason=reason, message=message, result=b"r" * result_bytes)
    once = rules.fit_update(u.SerializeToString(), SMALL)
    fitted = CommandUpdate.FromString(once)
    assert len(fitted.result) <= SMALL.max_result_bytes
    assert len(fitted.reason.encode()) <= SMALL.max_text_bytes
    assert len(fitted.message.encode()) <= SMALL.max_text_bytes
    assert len(once) <= SMALL.max_update_bytes
    assert rules.fit_update(once, SMALL) == once
    if result_bytes <= SMALL.max_result_bytes:
        assert fitted.state == state and fitted.result == u.result


def test_an_event_over_the_limit_becomes_event_too_large_a_transition() -> None:
    payload = session_pb2.NodeEvent(type="allocation.bound", body=b"b" * 400).SerializeToString()
    type_, cls, out = rules.fit_event("allocation.bound", rules.RESULT, payload, SMALL)
    assert (type_, cls) == ("event.too-large", rules.TRANSITION)
    ev = session_pb2.NodeEvent.FromString(out)
    assert ev.type == "event.too-large"
    assert json.loads(ev.body) == {"type": "allocation.bound", "bytes": len(payload), "max_event_bytes": 300}
    small = session_pb2.NodeEvent(type="m", body=b"b").SerializeToString()
    assert rules.fit_event("m", rules.METRIC, small, SMALL) == ("m", rules.METRIC, small)


# -- both stores ----------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CommandStore]:
    if request.param == "memory":
        m = MemoryJournal()
        m.limits = SMALL
        yield m
        return
    j = await Journal.open(tmp_path / "journal.db", NODE)
    j.limits = SMALL
    try:
        yield j
    finally:
        await j.close()


async def test_a_finished_command_over_the_limit_is_journaled_fitted(store: CommandStore) -> None:
    await store.accept(Acceptance("c1", "diag.nvml", True, False, INC, BOOT, b"body", 1.0))
    assert await store.finish("c1", done("c1", b"x" * 5000).SerializeToString(), 2.0)
    [(cid, raw)] = await store.unacked_results()
    stored = CommandUpdate.FromString(raw)
    assert cid == "c1" and stored.reason == "result-too-large" and stored.state == session_pb2.COMMAND_FAILED
    assert len(raw) <= SMALL.max_update_bytes


async def test_a_rejection_and_a_settlement_are_fitted_too(store: CommandStore) -> None:
    rejected = CommandUpdate(command_id="c2", state=session_pb2.COMMAND_REJECTED, reason="X" * 999)
    await store.record_done("c2", "gpu.reset", rejected.SerializeToString(), INC, BOOT, 1.0)
    await store.accept(Acceptance("c3", "gpu.reset", False, False, "older", BOOT, b"body", 1.0))
    s = rules.Settlement("c3", "interrupted", BOOT)
    await store.apply_settlements([s], {"c3": done("c3", b"y" * 5000).SerializeToString()}, 2.0)
    got = {cid: CommandUpdate.FromString(raw) for cid, raw in await store.unacked_results()}
    assert len(got["c2"].reason.encode()) <= 200 and got["c2"].state == session_pb2.COMMAND_REJECTED
    assert got["c3"].reason == "result-too-large"


# -- what an older agent left -----------------------------------------------------------


async def test_an_older_agents_oversized_result_is_settled_at_start(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    j = await Journal.open(path, NODE)
    await j.accept(Acceptance("c1", "diag.nvml", True, False, INC, BOOT, b"body", 1.0))
    await j.accept(Acceptance("c2", "diag.nvml", True, False, INC, BOOT, b"body", 1.0))
    await j.finish("c2", done("c2", b"{}").SerializeToString(), 2.0)
    await j.append_events([("metric", rules.METRIC, b"m" * 100)])
    await j.close()
    # What an agent without the limits journaled: a 2 MB result, and an event of 100 kB.
    huge = done("c1", b"x" * 2 * 1024 * 1024).SerializeToString()
    big_event = session_pb2.NodeEvent(type="allocation.failed", body=b"e" * 100_000).SerializeToString()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE commands SET state = 'done', result = ?, acked = 0 WHERE command_id = 'c1'", (huge,))
        db.execute("INSERT INTO events (seq, type, class, payload) VALUES (2, 'allocation.failed', 3, ?)", (big_event,))

    j = await Journal.open(path, NODE)
    try:
        refitted = await j.settle_oversized()
        assert [e.command_id for e in refitted] == ["c1"]
        got = {cid: CommandUpdate.FromString(raw) for cid, raw in await j.unacked_results()}
        assert got["c1"].reason == "result-too-large" and got["c1"].state == session_pb2.COMMAND_FAILED
        assert "2,097,152 bytes" in got["c1"].message
        assert got["c2"].result == b"{}"  # what fits is left alone
        events = await j.unacked_events()
        assert [(e.seq, e.type) for e in events] == [(1, "metric"), (2, "event.too-large")]
        assert all(len(e.payload) <= LIMITS.max_event_bytes for e in events)
        assert await j.settle_oversized() == []  # settled once
    finally:
        await j.close()


async def test_events_over_the_limit_are_journaled_as_event_too_large(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "journal.db", NODE)
    try:
        ev = session_pb2.NodeEvent(type="spec.rejected", body=b"r" * (LIMITS.max_event_bytes + 1))
        [stored] = await j.append_events([("spec.rejected", rules.TRANSITION, ev.SerializeToString())])
        assert stored.type == "event.too-large" and stored.event_class == rules.TRANSITION
        body = json.loads(session_pb2.NodeEvent.FromString(stored.payload).body)
        assert body["type"] == "spec.rejected" and body["max_event_bytes"] == LIMITS.max_event_bytes
    finally:
        await j.close()
