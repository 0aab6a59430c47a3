"""bc.gateway.oversize: what the gateway does with an update over the size table, on a real store."""

from __future__ import annotations

from bc.control.base.bus import Bus
from bc.gateway.oversize import fit_texts, refuse_oversized_update
from bc.protocol.limits import LIMITS
from bc.protocol.pb import session_pb2
from bc.store import events as events_sql
from bc.store.sqlite import InlineSqliteStore


def test_texts_over_max_text_bytes_are_cut_and_nothing_else_changes() -> None:
    u = session_pb2.CommandUpdate(
        command_id="c1", state=session_pb2.COMMAND_FAILED, reason="internal", message="m" * 50_000, result=b"{}"
    )
    out = fit_texts(u)
    assert len(out.message.encode()) <= LIMITS.max_text_bytes and out.message.startswith("m" * 1000)
    assert (out.command_id, out.state, out.reason, out.result) == ("c1", session_pb2.COMMAND_FAILED, "internal", b"{}")
    small = session_pb2.CommandUpdate(command_id="c1", message="fine")
    assert fit_texts(small) is small


async def test_a_result_over_the_limit_is_refused_and_said_even_for_an_unknown_command(
    store: InlineSqliteStore, bus: Bus
) -> None:
    now_ms = await store.now_ms()
    at_limit = session_pb2.CommandUpdate(command_id="c1", result=b"r" * LIMITS.max_result_bytes)
    over = session_pb2.CommandUpdate(command_id="c2", result=b"r" * (LIMITS.max_result_bytes + 1))
    async with store.transaction() as tx:
        assert not await refuse_oversized_update(tx, bus, "n1", at_limit, now_ms)
        assert await refuse_oversized_update(tx, bus, "n1", over, now_ms)
    async with store.transaction(write=False) as tx:
        said = await events_sql.list_events(tx, 0, 100, "node.result-too-large")
        settled = await events_sql.list_events(tx, 0, 100, "command.settled")
    assert [(str(e["subject"]), str(e["type"])) for e in said] == [("n1", "node.result-too-large")]
    assert settled == []  # no such command in flight: nothing to settle, but the node is still acked
