"""Release keys (migrations 0012, 0018) and release records (0012), and the latest daemon.upgrade of each node."""

from __future__ import annotations

from bc.store.base import Row, Tx


async def list_keys(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM release_keys ORDER BY added_at_ms, key_id", {})


async def add_key(
    tx: Tx, key_id: str, public_key: bytes, added_by: str, now_ms: int, root_signature: bytes | None = None
) -> bool:
    """False when the key is already there. `root_signature`: the root's endorsement (migration 0018)."""
    n = await tx.execute(
        "INSERT INTO release_keys (key_id, public_key, added_by, added_at_ms, root_signature)"
        " VALUES (:k, :p, :b, :t, :r) ON CONFLICT (key_id) DO NOTHING",
        {"k": key_id, "p": public_key, "b": added_by, "t": now_ms, "r": root_signature},
    )
    return n == 1


async def list_releases(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM releases ORDER BY sequence", {})


async def release_by_version(tx: Tx, version: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM releases WHERE version = :v", {"v": version})


async def release_by_sha(tx: Tx, sha256: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM releases WHERE sha256 = :s ORDER BY sequence LIMIT 1", {"s": sha256})


async def insert_release(
    tx: Tx,
    *,
    version: str,
    sha256: str,
    size: int,
    signature: bytes,
    key_id: str,
    url: str,
    path: str,
    published_by: str,
    now_ms: int,
) -> int:
    """The new release's sequence: one above every release before it."""
    seq = int(await tx.fetchval("SELECT COALESCE(MAX(sequence), 0) + 1 FROM releases", {}) or 1)
    await tx.execute(
        "INSERT INTO releases (sequence, version, sha256, size, signature, key_id, url, path, published_by,"
        " published_at_ms) VALUES (:q, :v, :s, :z, :g, :k, :u, :p, :b, :t)",
        {
            "q": seq,
            "v": version,
            "s": sha256,
            "z": size,
            "g": signature,
            "k": key_id,
            "u": url,
            "p": path,
            "b": published_by,
            "t": now_ms,
        },
    )
    return seq


async def latest_upgrades(tx: Tx) -> list[Row]:
    """Each node's newest daemon.upgrade command (node_id, id, state, reason, body)."""
    return await tx.fetchall(
        "SELECT c.node_id, c.id, c.state, c.reason, c.body FROM commands c"
        " WHERE c.kind = 'daemon.upgrade' AND c.seq = (SELECT MAX(c2.seq) FROM commands c2"
        " WHERE c2.node_id = c.node_id AND c2.kind = 'daemon.upgrade') ORDER BY c.node_id",
        {},
    )
