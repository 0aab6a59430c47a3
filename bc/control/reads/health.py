"""What `bc health` and `bc health policy show` read: one query function each (docs/health.md)."""

from __future__ import annotations

import json

from bc.control.health import decide as d
from bc.control.health import preapprovals
from bc.control.health import world as health_world
from bc.protocol.pb import admin_pb2
from bc.store import Row, Store, Tx
from bc.store import events as events_sql
from bc.store import health as health_sql
from bc.store import jobs as jobs_sql

RECENT_MS = 86_400_000
RECENT_SHOWN = 200
HISTORY_SHOWN = 20


async def health(store: Store) -> admin_pb2.HealthInfo:
    """The sick GPUs and what the policy does with each, the queue, the running remediations, the recent
    outcomes, the GPU cordons and the limits used."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        seq = await events_sql.last_seq(tx)
        loaded = await health_world.load(tx, now_ms)
        recent = await health_sql.recent_episodes(tx, now_ms - RECENT_MS, RECENT_SHOWN)
        cordons = await health_sql.gpu_cordons(tx)
        open_rows = list(loaded.rows.values())
        jobs = {str(r["dag_id"]): await _job_state(tx, str(r["dag_id"])) for r in open_rows if r["dag_id"]}
    w = loaded.world
    used = d.limits_used(w)
    info = admin_pb2.HealthInfo(
        policy_version=loaded.policy_version,
        enabled=w.policy.enabled,
        event_seq=seq,
        limits=admin_pb2.HealthLimitsInfo(
            nodes=used.nodes,
            node_cap=used.node_cap,
            actions_last_hour=used.actions_last_hour,
            actions_cap=used.actions_cap,
            per_label=w.policy.limits.per_label,
            fleet_size=len(w.nodes),
        ),
    )
    for c in sorted(w.conditions, key=lambda c: c.key):
        action, rule = w.policy.action_for(c.signals)
        row = loaded.rows.get(c.key)
        info.conditions.add(
            node_id=c.node_id,
            gpu_uuid=c.gpu,
            reason=c.reason,
            message=c.message,
            since_ms=c.since_ms,
            rule=rule,
            action=action,
            episode_id=str(row["id"]) if row is not None else "",
            type=c.type,
        )
    for r in open_rows:
        target = info.queue if str(r["state"]) == d.QUEUED else info.running
        target.append(_episode(r, jobs.get(str(r["dag_id"] or ""), "")))
    info.recent.extend(_episode(r, "") for r in recent)
    for k in cordons:
        info.cordons.add(
            node_id=str(k["node_id"]),
            gpu_uuid=str(k["gpu_uuid"]),
            reason=str(k["reason"]),
            episode_id=str(k["episode_id"] or ""),
            quarantined=bool(k["quarantined"]),
            since_ms=int(k["since_ms"]),
        )
    return info


async def _job_state(tx: Tx, dag_id: str) -> str:
    row = await jobs_sql.get_dag(tx, dag_id)
    return "" if row is None else str(row["state"])


def _episode(r: Row, job_state: str) -> admin_pb2.HealthEpisodeInfo:
    return admin_pb2.HealthEpisodeInfo(
        id=str(r["id"]),
        node_id=str(r["node_id"]),
        gpu_uuid=str(r["gpu_uuid"]),
        state=str(r["state"]),
        action=str(r["action"]),
        rule=str(r["rule"]),
        stage=str(r["stage"]),
        evidence_json=str(r["evidence"] or "{}"),
        dag_id=str(r["dag_id"] or ""),
        wait_reason=str(r["wait_reason"] or ""),
        outcome=str(r["outcome"] or ""),
        policy_version=int(r["policy_version"] or 0),
        opened_at_ms=int(r["opened_at_ms"] or 0),
        started_at_ms=int(r["started_at_ms"] or 0),
        ended_at_ms=int(r["ended_at_ms"] or 0),
        job_state=job_state,
    )


async def health_policy(store: Store) -> admin_pb2.HealthPolicyInfo:
    """The policy in force (the defaults as version 0 when never set) and its latest versions."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await health_sql.policy(tx)
        history = await health_sql.policy_versions(tx, HISTORY_SHOWN)
        policy, version = await health_world.load_policy(tx)
        standing = await preapprovals.standing(tx, row, policy, now_ms)
    info = admin_pb2.HealthPolicyInfo(version=version, policy_json=json.dumps(policy.doc(), indent=None))
    info.preapproval_batch, info.preapproval_state = standing.batch_id, standing.state
    info.preapproval_approvals, info.preapproval_threshold = standing.approvals, standing.threshold
    for p in standing.entries:
        info.preapprovals.add(
            kind=p.kind,
            pool=dict(p.pool),
            expires_at_ms=p.expires_at_ms,
            state=preapprovals.entry_state(p, standing, now_ms),
        )
    if row is not None:
        info.set_by, info.set_at_ms, info.reason = str(row["set_by"]), int(row["set_at_ms"]), str(row["reason"])
    for h in history:
        info.history.add(
            version=int(h["version"]), set_by=str(h["set_by"]), set_at_ms=int(h["set_at_ms"]), reason=str(h["reason"])
        )
    return info
