"""Cordon and delete: the SQL of taking a node out of service."""

from __future__ import annotations

from bc.protocol import connectivity as cx
from bc.store import connectivity as cx_sql
from bc.store.base import Row, Tx


async def set_cordoned(tx: Tx, node_id: str, cordoned: bool) -> bool:
    n = await tx.execute(
        "UPDATE nodes SET cordoned = :c WHERE node_id = :n AND cordoned <> :c", {"c": int(cordoned), "n": node_id}
    )
    return n == 1


async def live_reservations(tx: Tx, node_id: str) -> int:
    v = await tx.fetchval(
        "SELECT COUNT(*) FROM reservations WHERE node_id = :n AND state NOT IN ('released', 'failed', 'ended', 'lost')",
        {"n": node_id},
    )
    return int(v or 0)


async def tombstone(tx: Tx, node_id: str, now_ms: int) -> None:
    """Delete the node but keep its history: reservations, bookings, usage, commands, events and
    certificates stay (billing and audit never lose a row); its session routing and unused tokens go."""
    params: dict[str, object] = {"n": node_id, **cx_sql.node_params(cx.DELETE, now_ms)}
    await tx.execute(
        f"UPDATE nodes SET deleted_at_ms = :t, {cx_sql.node_set(cx.DELETE)}, job_hold = NULL WHERE node_id = :n",
        params,
    )
    await tx.execute("DELETE FROM node_sessions WHERE node_id = :n", params)
    await tx.execute("DELETE FROM join_tokens WHERE node_id = :n AND used_at_ms IS NULL", params)


async def open_commands(tx: Tx, node_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT id, state FROM commands WHERE node_id = :n"
        " AND state IN ('pending', 'dispatched', 'acked', 'running') ORDER BY seq",
        {"n": node_id},
    )
