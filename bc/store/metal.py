"""Bare-metal machines (migration 0028; docs/metal.md, "Provisioning as jobs")."""

from __future__ import annotations

from bc.store.base import Row, Tx


async def get(tx: Tx, name: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM metal_machines WHERE name = :n", {"n": name})


async def by_node(tx: Tx, node_id: str) -> Row | None:
    """The machine whose installed OS is `node_id` (what `bc metal reprovision NODE` acts on)."""
    return await tx.fetchone("SELECT * FROM metal_machines WHERE node_id = :n ORDER BY name LIMIT 1", {"n": node_id})


async def list_all(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM metal_machines ORDER BY site_node, name", {})


async def insert(
    tx: Tx,
    *,
    name: str,
    site_node: str,
    bmc_url: str,
    system_id: str,
    macs_json: str,
    labels_json: str,
    enrolled_by: str,
    now_ms: int,
) -> bool:
    """False when a machine of that name exists already (nothing written)."""
    rows = await tx.fetchall(
        "INSERT INTO metal_machines (name, site_node, bmc_url, system_id, macs, labels, enrolled_by, created_at_ms,"
        " updated_at_ms) VALUES (:n, :s, :b, :sys, :m, :l, :by, :t, :t) ON CONFLICT (name) DO NOTHING RETURNING name",
        {
            "n": name,
            "s": site_node,
            "b": bmc_url,
            "sys": system_id,
            "m": macs_json,
            "l": labels_json,
            "by": enrolled_by,
            "t": now_ms,
        },
    )
    return bool(rows)


async def delete(tx: Tx, name: str) -> bool:
    rows = await tx.fetchall("DELETE FROM metal_machines WHERE name = :n RETURNING name", {"n": name})
    return bool(rows)


async def set_state(
    tx: Tx, name: str, state: str, step: str, reason: str, now_ms: int, *, dag_id: str | None = None
) -> None:
    sets = "state = :st, step = :step, reason = :r, updated_at_ms = :t"
    params: dict[str, object] = {"n": name, "st": state, "step": step, "r": reason[:2000], "t": now_ms}
    if dag_id is not None:
        sets += ", dag_id = :d"
        params["d"] = dag_id
    await tx.execute(f"UPDATE metal_machines SET {sets} WHERE name = :n", params)


async def set_node(tx: Tx, name: str, node_id: str, now_ms: int) -> None:
    await tx.execute(
        "UPDATE metal_machines SET node_id = :nd, updated_at_ms = :t WHERE name = :n",
        {"n": name, "nd": node_id, "t": now_ms},
    )


async def token_used(tx: Tx, token_id: str) -> bool:
    """Whether the join token `token_id` was consumed (its node joined with it)."""
    used = await tx.fetchval("SELECT used_at_ms FROM join_tokens WHERE token_id = :t", {"t": token_id})
    return used is not None
