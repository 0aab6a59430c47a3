"""Cordon and delete: the SQL of taking a node out of service."""

from __future__ import annotations

from bc.store.base import Tx


async def set_cordoned(tx: Tx, node_id: str, cordoned: bool) -> bool:
    n = await tx.execute(
        "UPDATE nodes SET cordoned = :c WHERE node_id = :n AND cordoned <> :c", {"c": int(cordoned), "n": node_id}
    )
    return n == 1


async def live_reservations(tx: Tx, node_id: str) -> int:
    v = await tx.fetchval(
        "SELECT COUNT(*) FROM reservations WHERE node_id = :n AND state NOT IN ('released', 'failed')",
        {"n": node_id},
    )
    return int(v or 0)


async def delete_node(tx: Tx, node_id: str) -> None:
    """Remove the node and what only it refers to; revoked certificates stay as the record of who it was."""
    params = {"n": node_id}
    await tx.execute(
        "DELETE FROM device_bookings WHERE reservation_id IN (SELECT id FROM reservations WHERE node_id = :n)", params
    )
    for table in ("reservations", "commands", "node_events", "node_sessions", "join_tokens"):
        await tx.execute(f"DELETE FROM {table} WHERE node_id = :n", params)
    await tx.execute("DELETE FROM nodes WHERE node_id = :n", params)
