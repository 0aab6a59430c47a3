"""The events a node journals and sends (EventBatch): stored once per (node, journal, seq), acked by seq."""

from __future__ import annotations

from bc.store.base import Row, Tx


async def session_cursor(tx: Tx, node_id: str) -> Row | None:
    """The node's current journal id and the highest event seq acknowledged for it."""
    return await tx.fetchone("SELECT journal_id, acked_event_seq FROM node_sessions WHERE node_id = :n", {"n": node_id})


async def insert(tx: Tx, *, node_id: str, journal_id: str, seq: int, type_: str, body: bytes, now_ms: int) -> bool:
    """Store one event; False when this (node, journal, seq) was stored already (a resend)."""
    n = await tx.execute(
        "INSERT INTO node_events (node_id, journal_id, seq, type, body, received_at_ms)"
        " VALUES (:n, :j, :s, :t, :b, :r) ON CONFLICT DO NOTHING",
        {"n": node_id, "j": journal_id, "s": seq, "t": type_, "b": body, "r": now_ms},
    )
    return n == 1


async def advance_ack(tx: Tx, node_id: str, journal_id: str, seq: int) -> None:
    """Raise the acknowledged seq of this journal's events; never lowers it."""
    await tx.execute(
        "UPDATE node_sessions SET acked_event_seq = :s WHERE node_id = :n AND journal_id = :j AND acked_event_seq < :s",
        {"s": seq, "n": node_id, "j": journal_id},
    )
