"""Release keys (migrations 0012, 0018) and release records (0012, 0020), and the latest daemon.upgrade of each node."""

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
    return await tx.fetchall("SELECT * FROM releases ORDER BY name, sequence", {})


async def release_by_version(tx: Tx, name: str, version: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM releases WHERE name = :n AND version = :v", {"n": name, "v": version})


async def next_sequence(tx: Tx, name: str) -> int:
    """One above every release of `name` (1 for the first)."""
    q = "SELECT COALESCE(MAX(sequence), 0) + 1 FROM releases WHERE name = :n"
    return int(await tx.fetchval(q, {"n": name}) or 1)


async def delete_release(tx: Tx, name: str, version: str) -> None:
    await tx.execute("DELETE FROM releases WHERE name = :n AND version = :v", {"n": name, "v": version})


async def insert_release(
    tx: Tx,
    *,
    name: str,
    sequence: int,
    version: str,
    platform: str,
    sha256: str,
    size: int,
    signature: bytes,
    key_id: str,
    url: str,
    path: str,
    published_by: str,
    now_ms: int,
) -> None:
    await tx.execute(
        "INSERT INTO releases (name, sequence, version, platform, sha256, size, signature, key_id, url, path,"
        " published_by, published_at_ms) VALUES (:n, :q, :v, :f, :s, :z, :g, :k, :u, :p, :b, :t)",
        {
            "n": name,
            "q": sequence,
            "v": version,
            "f": platform,
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


async def latest_upgrades(tx: Tx) -> list[Row]:
    """Each node's newest daemon.upgrade command (node_id, id, state, reason, body)."""
    return await tx.fetchall(
        "SELECT c.node_id, c.id, c.state, c.reason, c.body FROM commands c"
        " WHERE c.kind = 'daemon.upgrade' AND c.seq = (SELECT MAX(c2.seq) FROM commands c2"
        " WHERE c2.node_id = c.node_id AND c2.kind = 'daemon.upgrade') ORDER BY c.node_id",
        {},
    )
