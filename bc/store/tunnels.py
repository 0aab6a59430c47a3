"""Exec-ticket keys and tunnel sessions (migration 0027; docs/access.md)."""

from __future__ import annotations

from bc.store.base import Row, Tx

# -- keys ----------------------------------------------------------------------------------------------


async def live_keys(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM exec_ticket_keys WHERE retired_at_ms IS NULL ORDER BY kid", {})


async def insert_key(tx: Tx, kid: str, public_jwk: str, created_by: str, now_ms: int) -> None:
    await tx.execute(
        "INSERT INTO exec_ticket_keys (kid, public_jwk, created_by, created_at_ms) VALUES (:k, :j, :b, :t)",
        {"k": kid, "j": public_jwk, "b": created_by, "t": now_ms},
    )


async def retire_keys_but(tx: Tx, kid: str, now_ms: int) -> list[str]:
    """Retire every live key but `kid`; the kids retired."""
    rows = await tx.fetchall(
        "UPDATE exec_ticket_keys SET retired_at_ms = :t WHERE retired_at_ms IS NULL AND kid <> :k RETURNING kid",
        {"t": now_ms, "k": kid},
    )
    return [str(r["kid"]) for r in rows]


# -- sessions ------------------------------------------------------------------------------------------


async def insert_session(
    tx: Tx,
    *,
    sid: str,
    jti: str,
    node_id: str,
    operator: str,
    purpose: str,
    port: int,
    reason: str,
    kid: str,
    issued_at_ms: int,
    expires_at_ms: int,
    record: bool = False,
) -> None:
    await tx.execute(
        "INSERT INTO tunnel_sessions (sid, jti, node_id, operator, purpose, port, reason, kid, state, issued_at_ms,"
        " expires_at_ms, record_promised) VALUES (:sid, :jti, :n, :o, :p, :port, :r, :kid, 'issued', :t, :exp, :rec)",
        {
            "rec": 1 if record else 0,
            "sid": sid,
            "jti": jti,
            "n": node_id,
            "o": operator,
            "p": purpose,
            "port": port,
            "r": reason,
            "kid": kid,
            "t": issued_at_ms,
            "exp": expires_at_ms,
        },
    )


async def get_session(tx: Tx, sid: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM tunnel_sessions WHERE sid = :s", {"s": sid})


async def mark_open(tx: Tx, sid: str, gateway_id: str, now_ms: int) -> bool:
    """`issued` → `open` (once: a second Open of one ticket matches nothing)."""
    n = await tx.execute(
        "UPDATE tunnel_sessions SET state = 'open', gateway_id = :g, opened_at_ms = :t"
        " WHERE sid = :s AND state = 'issued' AND expires_at_ms > :t",
        {"s": sid, "g": gateway_id, "t": now_ms},
    )
    return n == 1


async def mark_ended(
    tx: Tx,
    sid: str,
    state: str,
    now_ms: int,
    *,
    bytes_up: int,
    bytes_down: int,
    exit_code: int | None,
    reason: str,
) -> bool:
    n = await tx.execute(
        "UPDATE tunnel_sessions SET state = :st, ended_at_ms = :t, bytes_up = :u, bytes_down = :d, exit_code = :x,"
        " end_reason = :r WHERE sid = :s AND state IN ('issued', 'open')",
        {"s": sid, "st": state, "t": now_ms, "u": bytes_up, "d": bytes_down, "x": exit_code, "r": reason},
    )
    return n == 1


async def ask_close(tx: Tx, sid: str, reason: str) -> bool:
    """Ask whichever process relays the open tunnel `sid` to close it (docs/access.md, "Gateways")."""
    n = await tx.execute(
        "UPDATE tunnel_sessions SET close_asked = :r WHERE sid = :s AND state = 'open'", {"s": sid, "r": reason}
    )
    return n == 1


async def close_asks(tx: Tx, sids: list[str]) -> dict[str, str]:
    """Of the open tunnels `sids`, those asked to close, with why."""
    if not sids:
        return {}
    names = {f"s{i}": sid for i, sid in enumerate(sids)}
    rows = await tx.fetchall(
        "SELECT sid, close_asked FROM tunnel_sessions WHERE close_asked <> '' AND state = 'open' AND sid IN ("
        + ", ".join(f":{k}" for k in names)
        + ")",
        names,
    )
    return {str(r["sid"]): str(r["close_asked"]) for r in rows}


async def list_sessions(tx: Tx, node_id: str, open_only: bool, limit: int) -> list[Row]:
    where: list[str] = []
    args: dict[str, object] = {"lim": limit}
    if node_id:
        where.append("node_id = :n")
        args["n"] = node_id
    if open_only:
        where.append("state = 'open'")
    sql = "SELECT * FROM tunnel_sessions"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return await tx.fetchall(sql + " ORDER BY issued_at_ms DESC, sid LIMIT :lim", args)


# -- typescripts (migration 0031) ----------------------------------------------------------------------


async def append_typescript(tx: Tx, sid: str, offset: int, data: bytes, done: bool) -> bool:
    """Append `data` at `offset` of `sid`'s typescript (the next chunk only: `offset` is what it holds)."""
    n = await tx.execute(
        "UPDATE tunnel_sessions SET typescript_bytes = typescript_bytes + :n, typescript_done = :d"
        " WHERE sid = :s AND typescript_bytes = :o AND typescript_done = 0",
        {"s": sid, "n": len(data), "o": offset, "d": 1 if done else 0},
    )
    if n != 1:
        return False
    if data:
        seq = await tx.fetchval("SELECT COUNT(*) FROM tunnel_typescripts WHERE sid = :s", {"s": sid})
        await tx.execute(
            "INSERT INTO tunnel_typescripts (sid, seq, data) VALUES (:s, :q, :d)",
            {"s": sid, "q": int(seq or 0), "d": data},
        )
    return True


async def typescript_chunks(tx: Tx, sid: str) -> list[bytes]:
    rows = await tx.fetchall("SELECT data FROM tunnel_typescripts WHERE sid = :s ORDER BY seq", {"s": sid})
    return [bytes(r["data"]) for r in rows]
