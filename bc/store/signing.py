"""Worker certificates, and re-signing what is stored when a worker key rotates."""

from __future__ import annotations

from bc.store.base import Row, Tx


async def put_cert(tx: Tx, key_id: str, cert_der: bytes, not_after_ms: int, now_ms: int) -> None:
    await tx.execute(
        "INSERT INTO signing_certs (key_id, cert_der, not_after_ms, created_at_ms) VALUES (:k, :c, :n, :t)"
        " ON CONFLICT (key_id) DO NOTHING",
        {"k": key_id, "c": cert_der, "n": not_after_ms, "t": now_ms},
    )


async def get_cert(tx: Tx, key_id: str) -> bytes | None:
    v = await tx.fetchval("SELECT cert_der FROM signing_certs WHERE key_id = :k", {"k": key_id})
    return None if v is None else bytes(v)


async def specs_to_resign(tx: Tx, key_id: str) -> list[Row]:
    """Current spec bodies signed by another key (or unsigned)."""
    return await tx.fetchall(
        "SELECT node_id, generation, spec_body FROM nodes WHERE spec_body IS NOT NULL AND spec_key_id <> :k",
        {"k": key_id},
    )


async def resign_spec(tx: Tx, node_id: str, generation: int, signature: bytes, key_id: str) -> bool:
    """Replace the signature of the stored generation only (a bump in between wrote its own)."""
    n = await tx.execute(
        "UPDATE nodes SET spec_signature = :s, spec_key_id = :k, spec_sign_pending = 0"
        " WHERE node_id = :n AND generation = :g",
        {"s": signature, "k": key_id, "n": node_id, "g": generation},
    )
    return n == 1


async def commands_to_resign(tx: Tx, key_id: str) -> list[Row]:
    """Commands that may still be delivered, signed by another key."""
    return await tx.fetchall(
        "SELECT id, body FROM commands WHERE state IN ('pending', 'dispatched', 'acked', 'running')"
        " AND signer_key_id <> :k",
        {"k": key_id},
    )


async def resign_command(tx: Tx, command_id: str, signature: bytes, key_id: str) -> None:
    await tx.execute(
        "UPDATE commands SET signature = :s, signer_key_id = :k WHERE id = :id",
        {"s": signature, "k": key_id, "id": command_id},
    )
