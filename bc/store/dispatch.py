"""The gateway's command SQL: what to send, marking it sent, and the Hello resume rules.

Marks carry the session fence: a command is marked `dispatched` only while
the session row still names this gateway and epoch, so a zombie gateway's
dispatch matches nothing.
"""

from __future__ import annotations

from bc.store.base import Row, Tx

IN_FLIGHT = ("dispatched", "acked", "running")
_IN_FLIGHT_SQL = "('dispatched', 'acked', 'running')"


async def pending_for(tx: Tx, node_id: str, now_ms: int, lock: str = "") -> list[Row]:
    return await tx.fetchall(
        "SELECT id, node_id, seq, lane, kind, body, cancel_requested_at_ms FROM commands"
        " WHERE node_id = :n AND state = 'pending' AND not_before_ms <= :t AND not_after_ms > :t"
        f" ORDER BY seq LIMIT 1000 {lock}",
        {"n": node_id, "t": now_ms},
    )


async def pending_cancelled(tx: Tx, node_id: str) -> list[Row]:
    """Pending commands whose cancel was requested, whatever their window: a cancel before dispatch wins."""
    return await tx.fetchall(
        "SELECT id FROM commands WHERE node_id = :n AND state = 'pending' AND cancel_requested_at_ms IS NOT NULL",
        {"n": node_id},
    )


async def in_flight_by_lane(tx: Tx, node_id: str, epoch: int) -> dict[str, int]:
    rows = await tx.fetchall(
        f"SELECT lane, COUNT(*) AS n FROM commands WHERE node_id = :n AND state IN {_IN_FLIGHT_SQL}"
        " AND dispatched_epoch = :e GROUP BY lane",
        {"n": node_id, "e": epoch},
    )
    return {str(r["lane"]): int(r["n"]) for r in rows}


async def mark_dispatched(tx: Tx, command_id: str, node_id: str, gateway_id: str, epoch: int, now_ms: int) -> bool:
    n = await tx.execute(
        "UPDATE commands SET state = 'dispatched', dispatched_epoch = :e, attempt = attempt + 1, updated_at_ms = :t"
        " WHERE id = :id AND node_id = :n AND state = 'pending' AND EXISTS ("
        "  SELECT 1 FROM node_sessions s WHERE s.node_id = :n AND s.session_epoch = :e AND s.open = 1"
        "  AND s.gateway_id = :g)",
        {"id": command_id, "n": node_id, "e": epoch, "g": gateway_id, "t": now_ms},
    )
    return n == 1


async def settle(
    tx: Tx, command_id: str, node_id: str, state: str, reason: str, now_ms: int, from_states: tuple[str, ...]
) -> bool:
    """A server-decided outcome (guards, resume rules); only from the states given."""
    placeholders = ", ".join(f":f{i}" for i in range(len(from_states)))
    params: dict[str, object] = {"id": command_id, "n": node_id, "s": state, "r": reason, "t": now_ms}
    params.update({f"f{i}": v for i, v in enumerate(from_states)})
    n = await tx.execute(
        "UPDATE commands SET state = :s, reason = :r, updated_at_ms = :t, settled_at_ms = :t"
        f" WHERE id = :id AND node_id = :n AND state IN ({placeholders})",
        params,
    )
    return n == 1


async def get_body(tx: Tx, command_id: str) -> Row | None:
    return await tx.fetchone(
        "SELECT id, node_id, body, signature, attempt, kind, state, batch_id FROM commands WHERE id = :id",
        {"id": command_id},
    )


async def in_flight(tx: Tx, node_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT id, seq, kind, lane, state, retry_safe, self_terminating, dispatched_epoch, boot_id FROM commands"
        f" WHERE node_id = :n AND state IN {_IN_FLIGHT_SQL} ORDER BY seq",
        {"n": node_id},
    )


async def move_to_epoch(tx: Tx, node_id: str, epoch: int) -> None:
    await tx.execute(
        f"UPDATE commands SET dispatched_epoch = :e WHERE node_id = :n AND state IN {_IN_FLIGHT_SQL}",
        {"n": node_id, "e": epoch},
    )


async def requeue_busy(tx: Tx, command_id: str, node_id: str, retry_at_ms: int, now_ms: int) -> bool:
    """BUSY is not terminal: the command goes back to pending and is sent again after a pause."""
    n = await tx.execute(
        "UPDATE commands SET state = 'pending', dispatched_epoch = NULL, not_before_ms = :r, updated_at_ms = :t"
        " WHERE id = :id AND node_id = :n AND state IN ('dispatched', 'acked')",
        {"id": command_id, "n": node_id, "r": retry_at_ms, "t": now_ms},
    )
    return n == 1


async def cancels_to_send(tx: Tx, node_id: str, epoch: int) -> list[Row]:
    """In-flight commands whose cancel was requested and not yet sent on this session."""
    return await tx.fetchall(
        "SELECT id, cancel_reason FROM commands WHERE node_id = :n AND cancel_requested_at_ms IS NOT NULL"
        f" AND state IN {_IN_FLIGHT_SQL} AND (cancel_sent_epoch IS NULL OR cancel_sent_epoch <> :e) ORDER BY seq",
        {"n": node_id, "e": epoch},
    )


async def mark_cancel_sent(tx: Tx, command_id: str, epoch: int) -> None:
    await tx.execute("UPDATE commands SET cancel_sent_epoch = :e WHERE id = :id", {"e": epoch, "id": command_id})
