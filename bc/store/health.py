"""The health reconciler's rows: policy versions, episodes, automatic actions, GPU cordons (docs/health.md)."""

from __future__ import annotations

from collections.abc import Mapping

from bc.store.base import Row, Tx, id_range
from bc.store.nodes import LIVE

# -- the policy's versions ----------------------------------------------------------------------------


async def policy(tx: Tx) -> Row | None:
    """The policy in force: the newest version (None: never set, the defaults apply)."""
    return await tx.fetchone("SELECT * FROM health_policies ORDER BY version DESC LIMIT 1")


async def policy_versions(tx: Tx, limit: int) -> list[Row]:
    return await tx.fetchall(
        "SELECT version, set_by, set_at_ms, reason FROM health_policies ORDER BY version DESC LIMIT :l", {"l": limit}
    )


async def add_policy(tx: Tx, text: str, set_by: str, reason: str, now_ms: int) -> int:
    """Store a new version (one more than the newest) and return its number."""
    version = int(await tx.fetchval("SELECT COALESCE(MAX(version), 0) + 1 FROM health_policies") or 1)
    await tx.execute(
        "INSERT INTO health_policies (version, policy, set_by, set_at_ms, reason) VALUES (:v, :p, :b, :t, :r)",
        {"v": version, "p": text, "b": set_by, "t": now_ms, "r": reason},
    )
    return version


async def policy_version(tx: Tx, version: int) -> Row | None:
    return await tx.fetchone("SELECT * FROM health_policies WHERE version = :v", {"v": version})


async def preapproval_batches(tx: Tx, before: int) -> list[Row]:
    """(version, preapproval_batch) of the versions before `before` that opened a pre-approval batch."""
    return await tx.fetchall(
        "SELECT version, preapproval_batch FROM health_policies WHERE version < :v AND preapproval_batch <> ''"
        " ORDER BY version",
        {"v": before},
    )


async def set_preapproval_batch(tx: Tx, version: int, batch_id: str) -> None:
    await tx.execute(
        "UPDATE health_policies SET preapproval_batch = :b WHERE version = :v", {"b": batch_id, "v": version}
    )


# -- what the reconciler reads of the fleet ----------------------------------------------------------------


async def fleet(tx: Tx) -> list[Row]:
    """Every live node of role node: its connectivity, labels and stored status (its conditions)."""
    return await tx.fetchall(
        f"SELECT n.node_id, n.connectivity, n.labels, n.status FROM nodes n WHERE {LIVE} AND n.role = 'node'"
        " ORDER BY n.node_id"
    )


async def busy_gpus(tx: Tx, now_ms: int) -> list[Row]:
    """(node_id, gpu_uuid) of every GPU under an unreleased booking whose window is not over: a live hold."""
    return await tx.fetchall(
        "SELECT DISTINCT node_id, gpu_uuid FROM device_bookings"
        " WHERE released_at_ms IS NULL AND (end_ms IS NULL OR end_ms > :now)",
        {"now": now_ms},
    )


async def reservations_on_gpus(tx: Tx, node_id: str, gpus: list[str] | None, now_ms: int) -> list[Row]:
    """The live reservations holding any of `gpus` on the node (None: any of its GPUs) (id, tenant, end_ms), in
    id order: what a GPU-scoped drain (or a node's) waits for."""
    if gpus is not None and not gpus:
        return []
    names = {f"g{i}": g for i, g in enumerate(gpus or [])}
    marks = ", ".join(f":{k}" for k in names)
    on_gpus = f" AND b.gpu_uuid IN ({marks})" if gpus is not None else ""
    return await tx.fetchall(
        "SELECT r.id, r.tenant, MAX(b.end_ms) AS end_ms,"
        " SUM(CASE WHEN b.end_ms IS NULL THEN 1 ELSE 0 END) AS open_ended"
        " FROM reservations r JOIN device_bookings b ON b.reservation_id = r.id"
        f" WHERE b.node_id = :n{on_gpus} AND b.released_at_ms IS NULL"
        " AND (b.end_ms IS NULL OR b.end_ms > :now) AND r.state NOT IN ('released', 'failed', 'ended', 'lost')"
        " GROUP BY r.id, r.tenant ORDER BY r.id",
        {"n": node_id, "now": now_ms, **names},
    )


# -- episodes ----------------------------------------------------------------------------------------------


async def has_open_episodes(tx: Tx) -> bool:
    row = await tx.fetchone("SELECT 1 AS one FROM health_episodes WHERE state IN ('queued', 'running') LIMIT 1")
    return row is not None


async def open_episodes(tx: Tx) -> list[Row]:
    return await tx.fetchall(
        "SELECT * FROM health_episodes WHERE state IN ('queued', 'running') ORDER BY opened_at_ms, id"
    )


async def recent_episodes(tx: Tx, since_ms: int, limit: int = 1000) -> list[Row]:
    """Episodes that ended at or after `since_ms`, newest first."""
    return await tx.fetchall(
        "SELECT * FROM health_episodes WHERE ended_at_ms >= :s ORDER BY ended_at_ms DESC, id LIMIT :l",
        {"s": since_ms, "l": limit},
    )


async def add_episode(tx: Tx, row: Mapping[str, object]) -> None:
    cols = ", ".join(row)
    marks = ", ".join(f":{k}" for k in row)
    await tx.execute(f"INSERT INTO health_episodes ({cols}) VALUES ({marks})", dict(row))


EPISODE_FIELDS = frozenset(
    {"state", "stage", "dag_id", "wait_reason", "outcome", "started_at_ms", "ended_at_ms", "clear_since_ms"}
)


async def update_episode(tx: Tx, episode_id: str, expected_state: str, changes: Mapping[str, object]) -> bool:
    """Change an episode still in `expected_state` (a fenced write: False when it moved meanwhile)."""
    bad = set(changes) - EPISODE_FIELDS
    if bad:
        raise ValueError(f"not an episode field: {sorted(bad)}")
    sets = ", ".join(f"{k} = :{k}" for k in changes)
    n = await tx.execute(
        f"UPDATE health_episodes SET {sets} WHERE id = :id AND state = :expected",
        {**changes, "id": episode_id, "expected": expected_state},
    )
    return n == 1


# -- automatic actions ---------------------------------------------------------------------------------------


async def add_action(tx: Tx, episode_id: str, stage: str, now_ms: int) -> None:
    await tx.execute(
        "INSERT INTO health_actions (episode_id, stage, at_ms) VALUES (:e, :s, :t) ON CONFLICT DO NOTHING",
        {"e": episode_id, "s": stage, "t": now_ms},
    )


async def action_times(tx: Tx, since_ms: int) -> list[int]:
    rows = await tx.fetchall("SELECT at_ms FROM health_actions WHERE at_ms > :s ORDER BY at_ms", {"s": since_ms})
    return [int(r["at_ms"]) for r in rows]


# -- GPU cordons ---------------------------------------------------------------------------------------------


async def gpu_cordons(
    tx: Tx, node_id: str | None = None, *, after: str | None = None, through: str | None = None
) -> list[Row]:
    """Every GPU cordon (of one node; of the nodes whose id is > `after` and <= `through` where given: a page
    of the listing), by node and GPU."""
    if node_id is None:
        where, params = id_range("node_id", after, through)
        where = f" WHERE {where.removeprefix(' AND ')}" if where else ""
        return await tx.fetchall(f"SELECT * FROM gpu_cordons{where} ORDER BY node_id, gpu_uuid", params)
    return await tx.fetchall("SELECT * FROM gpu_cordons WHERE node_id = :n ORDER BY gpu_uuid", {"n": node_id})


async def cordon_gpu(
    tx: Tx, node_id: str, gpu: str, reason: str, episode_id: str | None, quarantined: bool, by: str, now_ms: int
) -> bool:
    """Take a GPU out of placement (or mark a cordoned one quarantined); True when it was not cordoned before."""
    before = await tx.fetchval(
        "SELECT 1 FROM gpu_cordons WHERE node_id = :n AND gpu_uuid = :g", {"n": node_id, "g": gpu}
    )
    await tx.execute(
        "INSERT INTO gpu_cordons (node_id, gpu_uuid, reason, episode_id, quarantined, cordoned_by, since_ms)"
        " VALUES (:n, :g, :r, :e, :q, :b, :t) ON CONFLICT (node_id, gpu_uuid) DO UPDATE SET reason = excluded.reason,"
        " episode_id = excluded.episode_id, quarantined = excluded.quarantined",
        {"n": node_id, "g": gpu, "r": reason, "e": episode_id, "q": 1 if quarantined else 0, "b": by, "t": now_ms},
    )
    return before is None


async def return_gpu(tx: Tx, node_id: str, gpu: str, episode_id: str | None = None) -> bool:
    """Put a GPU back into placement; with `episode_id`, only the cordon that episode made. True when one went."""
    if episode_id is None:
        n = await tx.execute("DELETE FROM gpu_cordons WHERE node_id = :n AND gpu_uuid = :g", {"n": node_id, "g": gpu})
    else:
        n = await tx.execute(
            "DELETE FROM gpu_cordons WHERE node_id = :n AND gpu_uuid = :g AND episode_id = :e",
            {"n": node_id, "g": gpu, "e": episode_id},
        )
    return n == 1


async def gpu_cordon(tx: Tx, node_id: str, gpu: str) -> Row | None:
    """One GPU's cordon, if it has one."""
    return await tx.fetchone("SELECT * FROM gpu_cordons WHERE node_id = :n AND gpu_uuid = :g", {"n": node_id, "g": gpu})


async def open_episode_of(tx: Tx, node_id: str, gpu: str) -> Row | None:
    """The GPU's open (queued or running) episode, if it has one."""
    return await tx.fetchone(
        "SELECT * FROM health_episodes WHERE node_id = :n AND gpu_uuid = :g AND state IN ('queued', 'running')",
        {"n": node_id, "g": gpu},
    )
