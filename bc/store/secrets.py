"""The secret broker's rows (docs/secrets.md): secrets with their scope, and their sealed versions.

Values are stored sealed (`bc.pki.secret_box`); nothing here sees a plaintext.
"""

from __future__ import annotations

from bc.store.base import Row, Tx


async def get(tx: Tx, name: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM secrets WHERE name = :n", {"n": name})


async def list_all(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM secrets ORDER BY name")


async def put(
    tx: Tx, name: str, sealed: bytes, key_id: str, scope_nodes: str, scope_labels: str, by: str, now_ms: int
) -> int:
    """A new version of `name` (1 for a new secret) with this scope; the version written. The caller seals
    `sealed` for the version `next_version` names, in the same transaction."""
    version = await next_version(tx, name)
    await tx.execute(
        "INSERT INTO secrets (name, version, scope_nodes, scope_labels, created_by, created_at_ms, updated_by,"
        " updated_at_ms) VALUES (:n, :v, :sn, :sl, :b, :t, :b, :t)"
        " ON CONFLICT (name) DO UPDATE SET version = :v, scope_nodes = :sn, scope_labels = :sl, updated_by = :b,"
        " updated_at_ms = :t",
        {"n": name, "v": version, "sn": scope_nodes, "sl": scope_labels, "b": by, "t": now_ms},
    )
    await tx.execute(
        "INSERT INTO secret_versions (name, version, sealed, key_id, set_by, set_at_ms)"
        " VALUES (:n, :v, :s, :k, :b, :t)",
        {"n": name, "v": version, "s": sealed, "k": key_id, "b": by, "t": now_ms},
    )
    return version


async def next_version(tx: Tx, name: str) -> int:
    """One above the newest stored version of `name` (1 again after `remove`)."""
    return int(
        await tx.fetchval("SELECT COALESCE(MAX(version), 0) + 1 FROM secret_versions WHERE name = :n", {"n": name}) or 1
    )


async def sealed(tx: Tx, name: str, version: int) -> Row | None:
    return await tx.fetchone(
        "SELECT sealed, key_id FROM secret_versions WHERE name = :n AND version = :v", {"n": name, "v": version}
    )


async def versions(tx: Tx, name: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT version, set_by, set_at_ms, key_id FROM secret_versions WHERE name = :n ORDER BY version DESC",
        {"n": name},
    )


async def remove(tx: Tx, name: str) -> bool:
    """The secret and every version of it; False when there was none."""
    await tx.execute("DELETE FROM secret_versions WHERE name = :n", {"n": name})
    return await tx.execute("DELETE FROM secrets WHERE name = :n", {"n": name}) == 1


async def node_specs(tx: Tx) -> list[Row]:
    """Every live node's id, generation and stored spec (protobuf JSON): which of them name a secret."""
    return await tx.fetchall("SELECT node_id, generation, spec FROM nodes WHERE deleted_at_ms IS NULL ORDER BY node_id")


async def node_for_request(tx: Tx, node_id: str) -> Row | None:
    """What the broker checks a request against: the node's generation, its spec, labels and whether it is
    waiting for a signature."""
    return await tx.fetchone(
        "SELECT node_id, generation, spec, labels, spec_sign_pending FROM nodes"
        " WHERE node_id = :n AND deleted_at_ms IS NULL",
        {"n": node_id},
    )
