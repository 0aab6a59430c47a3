"""Join tokens and node certificates."""

from __future__ import annotations

from bc.store.base import Row, Tx


async def insert_token(
    tx: Tx,
    *,
    token_id: str,
    secret_hash: str,
    node_id: str,
    role: str,
    root_cert_pem: str,
    created_at_ms: int,
    expires_at_ms: int,
) -> None:
    await tx.execute(
        "INSERT INTO join_tokens (token_id, secret_hash, node_id, role, root_cert_pem, created_at_ms,"
        " expires_at_ms) VALUES (:id, :h, :n, :r, :root, :c, :e)",
        {
            "id": token_id,
            "h": secret_hash,
            "n": node_id,
            "r": role,
            "root": root_cert_pem,
            "c": created_at_ms,
            "e": expires_at_ms,
        },
    )


async def get_token(tx: Tx, token_id: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM join_tokens WHERE token_id = :id", {"id": token_id})


async def use_token(tx: Tx, token_id: str, now_ms: int) -> bool:
    """Consume a token once: True only for the first use before expiry."""
    n = await tx.execute(
        "UPDATE join_tokens SET used_at_ms = :t WHERE token_id = :id AND used_at_ms IS NULL AND expires_at_ms > :t",
        {"t": now_ms, "id": token_id},
    )
    return n == 1


async def insert_cert(
    tx: Tx,
    *,
    serial: str,
    node_id: str,
    identity_generation: int,
    cert_pem: str,
    issued_at_ms: int,
    not_after_ms: int,
    session_of: str | None = None,
) -> None:
    """A certificate the CA issued to the node; `session_of`: a session certificate of that node certificate."""
    await tx.execute(
        "INSERT INTO node_certs (serial, node_id, identity_generation, cert_pem, issued_at_ms, not_after_ms,"
        " session_of) VALUES (:s, :n, :g, :pem, :i, :na, :so)",
        {
            "s": serial,
            "n": node_id,
            "g": identity_generation,
            "pem": cert_pem,
            "i": issued_at_ms,
            "na": not_after_ms,
            "so": session_of,
        },
    )


async def get_cert(tx: Tx, serial: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM node_certs WHERE serial = :s", {"s": serial})


async def bump_identity_generation(tx: Tx, node_id: str) -> int:
    row = await tx.fetchone(
        "UPDATE nodes SET identity_generation = identity_generation + 1 WHERE node_id = :n"
        " RETURNING identity_generation",
        {"n": node_id},
    )
    return int(row["identity_generation"]) if row else 1


async def node_identity_generation(tx: Tx, node_id: str) -> int | None:
    """The node's current identity generation (raised by every re-join), or None for an unknown node."""
    value = await tx.fetchval("SELECT identity_generation FROM nodes WHERE node_id = :n", {"n": node_id})
    return None if value is None else int(value)


async def lock_node_identity(tx: Tx, node_id: str) -> int | None:
    """The node's identity generation, with its row held for the rest of the transaction (None: no such node).

    A write that changes nothing: on PostgreSQL it takes the row lock, so two re-joins with the same
    certificate run one after the other and the second sees the first one's certificate; SQLite has one
    writer already.
    """
    value = await tx.fetchval(
        "UPDATE nodes SET identity_generation = identity_generation WHERE node_id = :n RETURNING identity_generation",
        {"n": node_id},
    )
    return None if value is None else int(value)


async def latest_cert_serial(tx: Tx, node_id: str, identity_generation: int) -> str | None:
    """The serial of the node's certificate of this generation that expires last (ties: issued last); session
    certificates (`bc.pki.session_cert`) are not node certificates and never the latest."""
    value = await tx.fetchval(
        "SELECT serial FROM node_certs WHERE node_id = :n AND identity_generation = :g AND session_of IS NULL"
        " ORDER BY not_after_ms DESC, issued_at_ms DESC, serial DESC LIMIT 1",
        {"n": node_id, "g": identity_generation},
    )
    return None if value is None else str(value)


async def identity_issued_at_ms(tx: Tx, node_id: str, identity_generation: int) -> int | None:
    """When the node's identity of this generation was made: its first certificate's issue time (the join)."""
    value = await tx.fetchval(
        "SELECT MIN(issued_at_ms) FROM node_certs WHERE node_id = :n AND identity_generation = :g",
        {"n": node_id, "g": identity_generation},
    )
    return None if value is None else int(value)
