"""The gateway's own command SQL: lane credits in use, the Hello resume rules, BUSY requeues.

The rest of the command queue's SQL (enqueue, dispatch marks, cancels, the
sweeper) is in `bc.store.commands`.
"""

from __future__ import annotations

from bc.store.base import Row, Tx

IN_FLIGHT = ("dispatched", "acked", "running")
_IN_FLIGHT_SQL = "('dispatched', 'acked', 'running')"


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
