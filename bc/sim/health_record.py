"""What a `bc sim --health` run reads for H1 at its end (`bc.sim.health_facts`), from the events log and the store.

* The **limits** in force: the last `health.policy.set` event's policy (the run sets one, at its start), and
  the fleet's size as the reconciler counts it (`bc.store.health.fleet`: every live node of role node), with
  each node's labels.
* The **episodes**: `health.remediation.queued` opens one; `started` and `escalated` are its actions (with
  their job ids); `done`, `failed`, `cleared` or `health.gpu.quarantined` end it; `waiting` says why it waited.
* The reconciler's **resets**: every `gpu.reset` command of a remediation's job (its idempotency key
  `job:<dag>:<node>`, or a command of a batch the job created) that started on its node
  (`FactLog.side_effects`), for its episode's GPU and each GPU its result says it reset, with whether it did
  (the node refuses to reset a GPU a hold of its own uses: that refusal is the node's defence, and H1 still
  counts the ask).
* The **holds** on GPUs: each booking's GPUs (`FactLog.bookings`) from its start until the control plane
  decided to end it (`reservation.releasing`, or an end event) or its window ended; and each **release**
  decision, with whether the workload (the operator) had asked for it by then (`Fleet.operator_released`: a
  release the operator asks for after the control plane decided one is not the operator's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from bc.sim import storms
from bc.sim.facts import FactLog
from bc.sim.health_facts import EpisodeRun, EpisodeWait, GpuHold, HealthFacts, HealthLimits, HealthReset, HoldReleased
from bc.sim.record import DECISION_EVENTS, Event
from bc.store import Store
from bc.store import commands as commands_sql
from bc.store import health as health_sql
from bc.store import quorum as q_sql

ENDS = {
    "health.remediation.done": "done",
    "health.remediation.failed": "failed",
    "health.remediation.cleared": "cleared",
    "health.gpu.quarantined": "quarantined",
}


async def health_from_store(
    facts: FactLog, store: Store, events: Sequence[Event], operator_released: Mapping[str, int]
) -> None:
    """Fill `facts.health` (see the module docstring); call after `bc.sim.record.from_store`."""
    async with store.transaction(write=False) as tx:
        fleet = await health_sql.fleet(tx)
        commands = [r for r in await commands_sql.list_(tx, limit=1 << 62) if str(r["kind"]) == "gpu.reset"]
        batch_dag = {str(b["id"]): str(b["dag_id"] or "") for b in await q_sql.list_batches(tx, limit=1 << 30)}
    h = HealthFacts()
    h.labels = {str(r["node_id"]): dict(json.loads(str(r["labels"] or "{}"))) for r in fleet}
    h.limits = _limits(events, len(fleet))
    h.episodes, h.waits = _episodes(events)
    h.resets = _resets(facts, h.episodes, commands, batch_dag)
    h.holds = _holds(facts, events)
    h.releases = _releases(facts, events, operator_released)
    h.injected.update({k: 0 for k in storms.KINDS})
    for _seq, type_, _subject, data, _at in events:
        if type_ == "sim.fault":
            kind = str(json.loads(data).get("kind", ""))
            if kind in storms.KINDS:
                h.injected[kind] += 1
    facts.health = h


def _limits(events: Sequence[Event], fleet_size: int) -> HealthLimits | None:
    found: HealthLimits | None = None
    for _seq, type_, _subject, data, at_ms in events:
        if type_ != "health.policy.set":
            continue
        policy: dict[str, Any] = json.loads(data).get("policy", {})
        lim: dict[str, Any] = policy.get("limits", {})
        found = HealthLimits(
            int(lim.get("max_nodes", 1)),
            int(lim.get("max_fleet_percent", 10)),
            str(lim.get("per_label", "")),
            int(lim.get("max_actions_per_hour", 4)),
            fleet_size,
            at_ms,
            int(policy.get("repeat_window_s", 86400)),
        )
    return found


def _episodes(events: Sequence[Event]) -> tuple[list[EpisodeRun], list[EpisodeWait]]:
    runs: dict[str, dict[str, Any]] = {}
    waits: list[EpisodeWait] = []
    for _seq, type_, _subject, data, at_ms in events:
        if not type_.startswith("health.") or type_ == "health.policy.set":
            continue
        body = json.loads(data)
        eid = str(body.get("episode", ""))
        if type_ == "health.remediation.queued":
            runs[eid] = {
                "node": str(body["node"]),
                "gpu": str(body["gpu"]),
                "queued": at_ms,
                "starts": [],
                "escalations": [],
                "end": None,
                "outcome": "",
                "dags": [],
            }
            continue
        run = runs.get(eid)
        if run is None:
            continue
        if type_ == "health.remediation.started":
            run["starts"].append(at_ms)
            run["dags"].append(str(body.get("dag_id", "")))
        elif type_ == "health.remediation.escalated":
            run["escalations"].append(at_ms)
            run["dags"].append(str(body.get("dag_id", "")))
        elif type_ == "health.remediation.waiting":
            waits.append(EpisodeWait(at_ms, eid, str(body.get("why", ""))))
        elif type_ in ENDS and run["end"] is None:
            run["end"], run["outcome"] = at_ms, ENDS[type_]
    out = [
        EpisodeRun(
            eid,
            r["node"],
            r["gpu"],
            r["queued"],
            tuple(r["starts"]),
            tuple(r["escalations"]),
            r["end"],
            r["outcome"],
            tuple(r["dags"]),
        )
        for eid, r in runs.items()
    ]
    return out, waits


def _resets(
    facts: FactLog, episodes: Sequence[EpisodeRun], commands: Sequence[Any], batch_dag: dict[str, str]
) -> list[HealthReset]:
    """Each remediation's `gpu.reset` that started on its node, for its episode's GPU (a health remediation
    resets that GPU alone), with whether its result says the GPU was reset (the node refuses a GPU a hold uses)."""
    episode_of = {dag: e for e in episodes for dag in e.dag_ids if dag}
    started: dict[str, int] = {}
    for s in sorted(facts.side_effects, key=lambda s: s.t_ms):
        started.setdefault(s.command_id, s.t_ms)
    out: list[HealthReset] = []
    for c in commands:
        key = str(c["idempotency_key"])
        dag = key.split(":")[1] if key.startswith("job:") else batch_dag.get(str(c["batch_id"] or ""), "")
        e = episode_of.get(dag)
        cid = str(c["id"])
        if e is None or cid not in started:
            continue
        try:
            result = json.loads(bytes(c["result"] or b"{}").decode())
        except (UnicodeDecodeError, ValueError):
            result = {}
        gpus = result.get("gpus", []) if isinstance(result, dict) else []
        reset = {str(g.get("uuid", "")) for g in gpus if isinstance(g, dict) and g.get("reset")}
        for gpu in sorted({e.gpu} | reset):
            out.append(HealthReset(started[cid], str(c["node_id"]), gpu, cid, e.episode_id, gpu in reset))
    return sorted(out, key=lambda r: (r.t_ms, r.node_id, r.gpu))


def _decided(events: Sequence[Event]) -> dict[str, tuple[int, str]]:
    """Each reservation's first decision to end its hold: (at_ms, event type)."""
    out: dict[str, tuple[int, str]] = {}
    for _seq, type_, subject, _data, at_ms in events:
        if type_ in DECISION_EVENTS:
            out.setdefault(subject, (at_ms, type_))
    return out


def _holds(facts: FactLog, events: Sequence[Event]) -> list[GpuHold]:
    decided = _decided(events)
    out: list[GpuHold] = []
    for b in facts.bookings:
        end = b.end_ms
        d = decided.get(b.reservation_id)
        if d is not None:
            end = d[0] if end is None else min(end, d[0])
        if end is not None and end <= b.start_ms:
            continue
        for gpu in sorted({a.gpu_uuid for a in b.atoms}):
            out.append(GpuHold(b.reservation_id, b.node_id, gpu, b.start_ms, end))
    return out


def _releases(facts: FactLog, events: Sequence[Event], operator_released: Mapping[str, int]) -> list[HoldReleased]:
    gpus: dict[str, tuple[str, tuple[str, ...]]] = {}
    for b in facts.bookings:
        gpus[b.reservation_id] = (b.node_id, tuple(sorted({a.gpu_uuid for a in b.atoms})))
    out: list[HoldReleased] = []
    for rid, (at_ms, type_) in sorted(_decided(events).items(), key=lambda kv: (kv[1][0], kv[0])):
        if type_ not in ("reservation.releasing", "reservation.released") or rid not in gpus:
            continue
        node_id, held = gpus[rid]
        asked = operator_released.get(rid)
        out.append(HoldReleased(at_ms, rid, node_id, held, asked is not None and asked <= at_ms))
    return out
