"""Approvers, batches, their leaves, the approvers' decisions, and the changes of the quorum settings."""

from __future__ import annotations

from bc.store.base import Row, Tx


async def list_approvers(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM approvers ORDER BY name", {})


async def add_approver(tx: Tx, key_id: str, name: str, public_key: bytes, operator: str, now_ms: int) -> None:
    await tx.execute(
        "INSERT INTO approvers (key_id, name, public_key, operator, added_at_ms) VALUES (:k, :n, :p, :o, :t)",
        {"k": key_id, "n": name, "p": public_key, "o": operator, "t": now_ms},
    )


async def approver_by(tx: Tx, *, name: str = "", key_id: str = "") -> Row | None:
    # An empty name or key matches nothing (no approver has either empty).
    return await tx.fetchone(
        "SELECT * FROM approvers WHERE (name = :n AND :n <> '') OR (key_id = :k AND :k <> '')",
        {"n": name, "k": key_id},
    )


async def remove_approver(tx: Tx, key_id: str) -> bool:
    return await tx.execute("DELETE FROM approvers WHERE key_id = :k", {"k": key_id}) == 1


async def insert_batch(
    tx: Tx,
    *,
    id_: str,
    kind: str,
    requested_by: str,
    reason: str,
    payload_json: str,
    scope_root: bytes,
    threshold: int,
    now_ms: int,
    not_after_ms: int,
    dag_id: str = "",
) -> None:
    await tx.execute(
        "INSERT INTO batches (id, kind, state, requested_by, reason, payload_json, scope_root, threshold,"
        " created_at_ms, not_after_ms, dag_id) VALUES (:id, :k, 'pending', :rb, :r, :p, :root, :th, :t, :na, :dag)",
        {
            "id": id_,
            "k": kind,
            "rb": requested_by,
            "r": reason,
            "p": payload_json,
            "root": scope_root,
            "th": threshold,
            "t": now_ms,
            "na": not_after_ms,
            "dag": dag_id,
        },
    )


async def insert_leaf(
    tx: Tx, batch_id: str, idx: int, node_id: str, kind: str, payload_digest: bytes, command_id: str
) -> None:
    await tx.execute(
        "INSERT INTO batch_leaves (batch_id, idx, node_id, kind, payload_digest, command_id)"
        " VALUES (:b, :i, :n, :k, :d, :c)",
        {"b": batch_id, "i": idx, "n": node_id, "k": kind, "d": payload_digest, "c": command_id},
    )


async def get_batch(tx: Tx, batch_id: str, lock: str = "") -> Row | None:
    return await tx.fetchone(f"SELECT * FROM batches WHERE id = :id {lock}", {"id": batch_id})


async def list_batches(tx: Tx, state: str = "", limit: int = 200) -> list[Row]:
    if state:
        return await tx.fetchall(
            "SELECT * FROM batches WHERE state = :s ORDER BY created_at_ms DESC LIMIT :l", {"s": state, "l": limit}
        )
    return await tx.fetchall("SELECT * FROM batches ORDER BY created_at_ms DESC LIMIT :l", {"l": limit})


async def set_leaf_command(tx: Tx, batch_id: str, idx: int, command_id: str) -> None:
    """A `metal.bulk` leaf's command, made when its step releases it (bc.control.quorum.bulk)."""
    await tx.execute(
        "UPDATE batch_leaves SET command_id = :c WHERE batch_id = :b AND idx = :i AND command_id = ''",
        {"c": command_id, "b": batch_id, "i": idx},
    )


async def leaves(tx: Tx, batch_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT l.*, c.state AS command_state FROM batch_leaves l LEFT JOIN commands c ON c.id = l.command_id"
        " WHERE l.batch_id = :b ORDER BY l.idx",
        {"b": batch_id},
    )


async def count_leaves(tx: Tx, batch_id: str) -> int:
    return int(await tx.fetchval("SELECT COUNT(*) FROM batch_leaves WHERE batch_id = :b", {"b": batch_id}) or 0)


async def decisions(tx: Tx, batch_id: str) -> list[Row]:
    return await tx.fetchall("SELECT * FROM batch_approvals WHERE batch_id = :b ORDER BY at_ms", {"b": batch_id})


async def insert_decision(
    tx: Tx,
    *,
    batch_id: str,
    key_id: str,
    name: str,
    operator: str,
    decision: str,
    signature: bytes,
    expires_at_ms: int,
    reason: str,
    now_ms: int,
) -> bool:
    n = await tx.execute(
        "INSERT INTO batch_approvals"
        " (batch_id, key_id, name, operator, decision, signature, expires_at_ms, reason, at_ms)"
        " VALUES (:b, :k, :n, :o, :d, :s, :e, :r, :t) ON CONFLICT (batch_id, key_id) DO NOTHING",
        {
            "b": batch_id,
            "k": key_id,
            "n": name,
            "o": operator,
            "d": decision,
            "s": signature,
            "e": expires_at_ms,
            "r": reason,
            "t": now_ms,
        },
    )
    return n == 1


async def settle_batch(tx: Tx, batch_id: str, state: str, approval: bytes | None, now_ms: int) -> bool:
    n = await tx.execute(
        "UPDATE batches SET state = :s, approval = :a, settled_at_ms = :t WHERE id = :id AND state = 'pending'",
        {"s": state, "a": approval, "t": now_ms, "id": batch_id},
    )
    return n == 1


async def release_command(tx: Tx, command_id: str, proof: bytes) -> bool:
    n = await tx.execute(
        "UPDATE commands SET held = 0, batch_proof = :p WHERE id = :id AND held = 1 AND state = 'pending'",
        {"p": proof, "id": command_id},
    )
    return n == 1


async def approval_of(tx: Tx, batch_id: str) -> bytes | None:
    v = await tx.fetchval("SELECT approval FROM batches WHERE id = :id", {"id": batch_id})
    return None if v is None else bytes(v)


# -- changes of the quorum settings ------------------------------------------------------------


async def insert_change(
    tx: Tx,
    *,
    id_: str,
    requested_by: str,
    summary: str,
    from_settings: bytes,
    to_settings: bytes,
    threshold: int,
    to_version: int,
    now_ms: int,
    not_after_ms: int,
    root_signature: bytes = b"",
) -> None:
    await tx.execute(
        "INSERT INTO quorum_changes (id, state, requested_by, summary, from_settings, to_settings, threshold,"
        " to_version, created_at_ms, not_after_ms, root_signature)"
        " VALUES (:id, 'pending', :rb, :s, :f, :to, :th, :v, :t, :na, :rs)",
        {
            "rs": root_signature or None,
            "id": id_,
            "rb": requested_by,
            "s": summary,
            "f": from_settings,
            "to": to_settings,
            "th": threshold,
            "v": to_version,
            "t": now_ms,
            "na": not_after_ms,
        },
    )


async def get_change(tx: Tx, change_id: str, lock: str = "") -> Row | None:
    return await tx.fetchone(f"SELECT * FROM quorum_changes WHERE id = :id {lock}", {"id": change_id})


async def list_changes(tx: Tx, state: str = "", limit: int = 200) -> list[Row]:
    if state:
        return await tx.fetchall(
            "SELECT * FROM quorum_changes WHERE state = :s ORDER BY created_at_ms DESC, id DESC LIMIT :l",
            {"s": state, "l": limit},
        )
    return await tx.fetchall("SELECT * FROM quorum_changes ORDER BY created_at_ms DESC, id DESC LIMIT :l", {"l": limit})


async def open_change(tx: Tx, now_ms: int) -> Row | None:
    """The pending change that has not expired, if any (one at a time: each moves from the current settings)."""
    return await tx.fetchone(
        "SELECT * FROM quorum_changes WHERE state = 'pending' AND not_after_ms > :t ORDER BY created_at_ms LIMIT 1",
        {"t": now_ms},
    )


async def insert_change_decision(
    tx: Tx,
    *,
    change_id: str,
    key_id: str,
    name: str,
    operator: str,
    decision: str,
    signature: bytes,
    reason: str,
    now_ms: int,
) -> bool:
    n = await tx.execute(
        "INSERT INTO quorum_change_decisions (change_id, key_id, name, operator, decision, signature, reason, at_ms)"
        " VALUES (:c, :k, :n, :o, :d, :s, :r, :t) ON CONFLICT (change_id, key_id) DO NOTHING",
        {
            "c": change_id,
            "k": key_id,
            "n": name,
            "o": operator,
            "d": decision,
            "s": signature,
            "r": reason,
            "t": now_ms,
        },
    )
    return n == 1


async def change_decisions(tx: Tx, change_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT * FROM quorum_change_decisions WHERE change_id = :c ORDER BY at_ms, key_id", {"c": change_id}
    )


async def settle_change(tx: Tx, change_id: str, state: str, approval: bytes | None, now_ms: int) -> bool:
    n = await tx.execute(
        "UPDATE quorum_changes SET state = :s, approval = :a, settled_at_ms = :t WHERE id = :id AND state = 'pending'",
        {"s": state, "a": approval, "t": now_ms, "id": change_id},
    )
    return n == 1


async def applied_chain(tx: Tx, limit: int) -> list[bytes]:
    """The approvals of the latest `limit` applied changes, oldest first (what nodes walk from what they hold)."""
    rows = await tx.fetchall(
        "SELECT approval FROM quorum_changes WHERE state = 'applied' ORDER BY to_version DESC LIMIT :l", {"l": limit}
    )
    return [bytes(r["approval"]) for r in reversed(rows)]


async def withdraw_batch(tx: Tx, batch_id: str, now_ms: int) -> bool:
    n = await tx.execute(
        "UPDATE batches SET state = 'withdrawn', settled_at_ms = :t WHERE id = :b AND state IN ('pending', 'approved')",
        {"b": batch_id, "t": now_ms},
    )
    return n == 1


async def set_resolution(tx: Tx, batch_id: str, outcome: str) -> None:
    await tx.execute("UPDATE batches SET resolution = :o WHERE id = :b", {"o": outcome, "b": batch_id})


async def approved_unresolved(tx: Tx, kind: str, limit: int) -> list[str]:
    """Approved batches of `kind` whose outcome is not recorded yet (an approved `spec.set` not yet written)."""
    rows = await tx.fetchall(
        "SELECT id FROM batches WHERE kind = :k AND state = 'approved' AND resolution = ''"
        " ORDER BY created_at_ms LIMIT :l",
        {"k": kind, "l": limit},
    )
    return [str(r["id"]) for r in rows]


async def is_held(tx: Tx, command_id: str) -> bool:
    v = await tx.fetchval("SELECT held FROM commands WHERE id = :c", {"c": command_id})
    return bool(v)
