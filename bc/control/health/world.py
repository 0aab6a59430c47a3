"""The health reconciler's world as the store holds it: one read the loop and `bc health` share.

`load(tx, now_ms)` reads the policy in force, every live node of role node with its stored conditions (its
GPUs' and its host units'), the open episodes with their jobs' outcomes, the episodes that started or were
quarantined within the repeat window, the GPUs under a live hold, the GPUs kept out for a person and the
automatic actions of the last hour, into the pure `bc.control.health.decide.World` (and the episode rows
the loop writes back to).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass

from bc.control.health import conditions as cond
from bc.control.health import decide as d
from bc.control.health import policy as pol
from bc.store import Row, Tx
from bc.store import commands as cmd_sql
from bc.store import health as health_sql
from bc.store import jobs as jobs_sql


@dataclass(frozen=True)
class Loaded:
    """One pass's reading of the store: the pure world, and the rows the decisions are carried out on."""

    world: d.World
    policy_version: int
    rows: Mapping[d.Key, Row]


async def load_policy(tx: Tx) -> tuple[pol.Policy, int]:
    """The policy in force and its version (0: never set: the defaults, disabled, so that nothing acts on the
    fleet by itself until an admin has set a policy, `bc health policy set '{}'` for the defaults)."""
    row = await health_sql.policy(tx)
    if row is None:
        return pol.UNSET, 0
    return pol.parse(str(row["policy"])), int(row["version"])


async def load(tx: Tx, now_ms: int) -> Loaded:
    policy, version = await load_policy(tx)
    nodes: dict[str, d.NodeFacts] = {}
    conditions: list[cond.GpuCondition] = []
    for r in await health_sql.fleet(tx):
        node_id = str(r["node_id"])
        labels = {str(k): str(v) for k, v in json.loads(str(r["labels"] or "{}")).items()}
        nodes[node_id] = d.NodeFacts(str(r["connectivity"]) == "connected", labels)
        conditions.extend(cond.from_status(node_id, str(r["status"] or "{}")))
        conditions.extend(cond.node_from_status(node_id, str(r["status"] or "{}")))
    rows = {(str(r["node_id"]), str(r["gpu_uuid"])): r for r in await health_sql.open_episodes(tx)}
    episodes = [await _episode(tx, r) for r in rows.values()]
    recent = [
        _plain(r)
        for r in await health_sql.recent_episodes(tx, now_ms - policy.repeat_window_s * 1000)
        if r["started_at_ms"] is not None or str(r["state"]) == d.QUARANTINED
    ]
    cordons = await health_sql.gpu_cordons(tx)
    world = d.World(
        now_ms=now_ms,
        policy=policy,
        conditions=conditions,
        episodes=episodes,
        recent=recent,
        nodes=nodes,
        busy=frozenset((str(b["node_id"]), str(b["gpu_uuid"])) for b in await health_sql.busy_gpus(tx, now_ms)),
        # kept out for a person: quarantined, or cordoned by one (`bc health gpu cordon`, no episode)
        quarantined=frozenset(
            (str(c["node_id"]), str(c["gpu_uuid"])) for c in cordons if c["quarantined"] or c["episode_id"] is None
        ),
        actions=await health_sql.action_times(tx, now_ms - d.HOUR_MS),
    )
    return Loaded(world, version, rows)


def _plain(r: Row) -> d.Episode:
    return d.Episode(
        node_id=str(r["node_id"]),
        gpu=str(r["gpu_uuid"]),
        state=str(r["state"]),
        action=str(r["action"]),
        match=str(r["rule"]),
        stage=str(r["stage"]),
        opened_ms=int(r["opened_at_ms"]),
        started_ms=int(r["started_at_ms"] or 0),
        ended_ms=int(r["ended_at_ms"] or 0),
        clear_since_ms=int(r["clear_since_ms"] or 0),
    )


async def _episode(tx: Tx, r: Row) -> d.Episode:
    e = _plain(r)
    if e.state != d.RUNNING or not r["dag_id"]:
        return e
    return dataclasses.replace(e, job=await job_outcome(tx, str(r["dag_id"]), e))


async def job_outcome(tx: Tx, dag_id: str, e: d.Episode) -> d.JobOutcome:
    """The episode's job as `decide` reads it; a reset stage's job says whether the reset itself failed."""
    dag = await jobs_sql.get_dag(tx, dag_id)
    if dag is None:
        return d.JobOutcome("failed", True, error=f"job {dag_id} is gone")
    state, terminal = str(dag["state"]), dag["settled_at_ms"] is not None
    error = str(dag["first_error"] or "")
    if not terminal or e.stage != d.RESET_STAGE:
        return d.JobOutcome(state, terminal, error=error)
    reset = await jobs_sql.node(tx, dag_id, f"reset:{e.node_id}")
    if reset is None or str(reset["state"]) not in ("done", "failed"):
        return d.JobOutcome(state, terminal, error=error)
    if str(reset["state"]) == "failed":
        return d.JobOutcome(state, terminal, reset_failed=True, error=str(reset["error"] or error))
    unhealthy = await _not_healthy_after_reset(tx, reset)
    if unhealthy:
        return d.JobOutcome(state, terminal, reset_failed=True, error=unhealthy)
    return d.JobOutcome(state, terminal, error=error)


async def _not_healthy_after_reset(tx: Tx, reset_node: Row) -> str:
    """Why the reset command's result says a GPU did not come back ("" when every GPU reset and reads healthy)."""
    detail = json.loads(str(reset_node["detail"] or "{}"))
    row = await cmd_sql.get(tx, str(detail.get("command_id", "")))
    try:
        result = json.loads(bytes(row["result"] or b"{}").decode()) if row is not None else {}
    except (UnicodeDecodeError, ValueError):
        result = {}
    for g in result.get("gpus", []) if isinstance(result, dict) else []:
        if not g.get("reset") or not g.get("healthy", False):
            return f"GPU {g.get('uuid', '?')} did not read healthy after its reset: {g.get('message') or 'no message'}"
    return ""
