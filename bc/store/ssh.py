"""The SSH user CA and its grants (migration 0011; docs/ssh.md)."""

from __future__ import annotations

from bc.store.base import Row, Tx


async def get_ca(tx: Tx) -> Row | None:
    return await tx.fetchone("SELECT * FROM ssh_ca WHERE id = 1", {})


async def insert_ca(tx: Tx, public_key: str, fingerprint: str, offline: bool, created_by: str, now_ms: int) -> bool:
    """False when a CA exists already (one per cluster)."""
    rows = await tx.fetchall(
        "INSERT INTO ssh_ca (id, public_key, fingerprint, offline, created_by, created_at_ms)"
        " VALUES (1, :k, :f, :o, :b, :t) ON CONFLICT (id) DO NOTHING RETURNING id",
        {"k": public_key, "f": fingerprint, "o": int(offline), "b": created_by, "t": now_ms},
    )
    return bool(rows)


async def serial_taken(tx: Tx, serial: int) -> bool:
    return await tx.fetchone("SELECT serial FROM ssh_grants WHERE serial = :s", {"s": serial}) is not None


async def insert_grant(
    tx: Tx,
    *,
    serial: int,
    node_id: str,
    principal: str,
    public_key: str,
    fingerprint: str,
    ttl_s: int,
    state: str,
    batch_id: str,
    requested_by: str,
    reason: str,
    now_ms: int,
) -> None:
    await tx.execute(
        "INSERT INTO ssh_grants (serial, node_id, principal, public_key, fingerprint, ttl_s, state, batch_id,"
        " requested_by, reason, created_at_ms) VALUES (:s, :n, :p, :k, :f, :ttl, :st, :b, :rb, :r, :t)",
        {
            "s": serial,
            "n": node_id,
            "p": principal,
            "k": public_key,
            "f": fingerprint,
            "ttl": ttl_s,
            "st": state,
            "b": batch_id,
            "rb": requested_by,
            "r": reason,
            "t": now_ms,
        },
    )


async def issue(tx: Tx, serial: int, certificate: str, valid_after_ms: int, valid_before_ms: int) -> bool:
    """Record a signed certificate on a grant not issued yet; False when it was issued or refused already."""
    return (
        await tx.execute(
            "UPDATE ssh_grants SET state = 'issued', certificate = :c, valid_after_ms = :a, valid_before_ms = :b"
            " WHERE serial = :s AND state = 'pending' AND revoked_at_ms IS NULL",
            {"c": certificate, "a": valid_after_ms, "b": valid_before_ms, "s": serial},
        )
        == 1
    )


async def set_window(tx: Tx, serial: int, valid_after_ms: int, valid_before_ms: int) -> bool:
    """Fix the window an offline CA must sign a pending grant for (once); False when it was set already."""
    return (
        await tx.execute(
            "UPDATE ssh_grants SET valid_after_ms = :a, valid_before_ms = :b"
            " WHERE serial = :s AND state = 'pending' AND valid_before_ms = 0",
            {"a": valid_after_ms, "b": valid_before_ms, "s": serial},
        )
        == 1
    )


async def refuse(tx: Tx, serial: int) -> bool:
    return (
        await tx.execute(
            "UPDATE ssh_grants SET state = 'refused' WHERE serial = :s AND state = 'pending'", {"s": serial}
        )
        == 1
    )


async def get_grant(tx: Tx, serial: int, lock: str = "") -> Row | None:
    return await tx.fetchone(f"SELECT * FROM ssh_grants WHERE serial = :s {lock}", {"s": serial})


async def grant_of_batch(tx: Tx, batch_id: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM ssh_grants WHERE batch_id = :b", {"b": batch_id})


async def revoke(tx: Tx, serial: int, by: str, reason: str, now_ms: int) -> bool:
    """False when the grant was revoked already."""
    return (
        await tx.execute(
            "UPDATE ssh_grants SET revoked_at_ms = :t, revoked_by = :b, revoke_reason = :r"
            " WHERE serial = :s AND revoked_at_ms IS NULL",
            {"t": now_ms, "b": by, "r": reason, "s": serial},
        )
        == 1
    )


async def list_grants(tx: Tx, node_id: str = "", live_at_ms: int | None = None) -> list[Row]:
    """Grants, newest first; of one node when `node_id`; only issued, unrevoked, unexpired ones with `live_at_ms`."""
    where: list[str] = []
    params: dict[str, object] = {}
    if node_id:
        where.append("node_id = :n")
        params["n"] = node_id
    if live_at_ms is not None:
        where.append("state = 'issued' AND revoked_at_ms IS NULL AND valid_before_ms > :now")
        params["now"] = live_at_ms
    clause = (" WHERE " + " AND ".join(where)) if where else ""
    return await tx.fetchall(f"SELECT * FROM ssh_grants{clause} ORDER BY created_at_ms DESC, serial", params)


async def live_principals(tx: Tx, now_ms: int) -> list[Row]:
    """(node_id, principal) of every issued, unrevoked, unexpired grant."""
    return await tx.fetchall(
        "SELECT DISTINCT node_id, principal FROM ssh_grants"
        " WHERE state = 'issued' AND revoked_at_ms IS NULL AND valid_before_ms > :now ORDER BY node_id, principal",
        {"now": now_ms},
    )


async def live_batched_grants(tx: Tx, now_ms: int) -> list[Row]:
    """(node_id, principal, fingerprint, batch_id, approval) of every live grant its quorum approved (root's)."""
    return await tx.fetchall(
        "SELECT g.node_id, g.principal, g.fingerprint, g.batch_id, b.approval FROM ssh_grants g"
        " JOIN batches b ON b.id = g.batch_id"
        " WHERE g.state = 'issued' AND g.revoked_at_ms IS NULL AND g.valid_before_ms > :now"
        " AND g.batch_id <> '' AND b.approval IS NOT NULL ORDER BY g.node_id, g.principal, g.serial",
        {"now": now_ms},
    )


async def revoked_serials(tx: Tx) -> list[int]:
    """Every serial ever revoked: what every node's KRL lists. An expired certificate stays listed though its
    validity refuses it already: a serial leaving the KRL is root-equivalent, and the node cannot tell an
    expired certificate's serial from one un-revoked by a control plane with a stolen worker key."""
    rows = await tx.fetchall(
        "SELECT serial FROM ssh_grants WHERE revoked_at_ms IS NOT NULL AND state = 'issued' ORDER BY serial"
    )
    return [int(r["serial"]) for r in rows]
