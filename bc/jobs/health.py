"""The health reconciler: GPU conditions in, remediation jobs out, within the policy's limits (docs/health.md).

Theory of operation
-------------------
A singleton under the store lease `worker:health` (like the job queue's `worker:jobs`). Each pass is one
store transaction: it reads the policy in force (the newest version, else the defaults), the fleet's nodes
with their stored conditions (`bc.control.health.conditions`), the open episodes with their jobs'
outcomes, the episodes that ended within the repeat window, the GPUs under a live hold, the quarantined
GPUs and the automatic actions of the last hour; calls the pure `bc.control.health.decide.decide`; and
carries each decision out in the same transaction, with its event:

    Open        an episode row (queued, or quarantined at once) and a GPU cordon:
                health.remediation.queued, health.gpu.cordoned (+ health.gpu.quarantined)
    Start       a `remediate` job, GPU-scoped: its drain waits for the GPU's holds and never releases one;
                a quorum batch when approvers exist, whose reason names the condition and its evidence:
                health.remediation.started (+ health.drain.asked when the policy's drain is `ask`)
    Escalate    a `reboot` job for the node (its own batch when approvers exist): health.remediation.escalated

Where the policy in force pre-approves the step's kind (`gpu.reset`, `node.reboot`) for the node's pool and k
approvers signed that version (`bc.control.health.preapprovals`), the job asks for no batch: its command
carries the signed version, which the node checks itself. The started (escalated) event's `approval` says
which it was, and why.
    Finish      the episode done, the GPU returned: health.remediation.done, health.gpu.returned
    Quarantine  the episode quarantined, the GPU kept out for a person:
                health.remediation.failed, health.gpu.quarantined
    Clear       a queued episode whose condition stayed gone, the GPU returned:
                health.remediation.cleared, health.gpu.returned
    Wait        why a queued episode waits (`bc health` shows it): health.remediation.waiting, when it changes

A node episode (a host unit's condition, `gpu` ""; `bc.control.health.decide`) cordons no GPU: its Start is
the node's `reboot` job (its drain keeps new holds off the node, waits for the live ones, releases none; its
own batch when approvers exist), and its Quarantine is `health.node.quarantined`, for a person.

The job and the episode commit together (`JobEngine.submit_in`), so a `bc serve` killed at any instant
leaves an episode with its job or neither; a restarted reconciler reads the episode's `dag_id` and goes on.
A job the engine refuses (the node was deleted, the approvers could never approve) leaves its episode
queued, waiting with the refusal as its reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
from collections.abc import Mapping
from typing import Any

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.health import decide as d
from bc.control.health import preapprovals
from bc.control.health.world import Loaded, load
from bc.control.quorum import batches as quorum
from bc.errors import BcError
from bc.jobs.engine import JobEngine
from bc.jobs.views import JobRequest
from bc.seams.clock import Clock
from bc.seams.ids import ulid
from bc.store import Row, Store, StoreError, Tx, leases
from bc.store import events as events_sql
from bc.store import health as health_sql

log = logging.getLogger("bc.jobs.health")

LEASE_NAME = "worker:health"
LEASE_TTL_MS = 15_000
INTERVAL_S = 5.0
"""A pass at least this often; the event log moving (a status, a job settling) wakes it sooner."""
MIN_GAP_S = 1.0
"""Passes are at least this far apart: each reads every node's conditions."""
BACKSTOP_S = 30.0
"""With no episode open, a pass reads the fleet only for news that can open one (`WAKING_TYPES`), and at least
this often for what only time changes (a repeat window, the hour's action count)."""
WAKING_TYPES = ("node.condition", "health.policy.set", "health.gpu.returned")
"""What can open an episode when none is open: a condition that changed, a new policy, a GPU a person returned."""
REQUESTER = "health-reconciler"
"""Who the reconciler's jobs and batches name as their requester (it is no operator)."""
MAX_REASON = 500


def reason_text(key: d.Key, rule: str, evidence: Mapping[str, Any], episode_id: str) -> str:
    """A job's and its batch's reason: the condition and its evidence, within the batch's 500 characters."""
    node, gpu = key
    where = f"node {node} ({evidence.get('type', '')} " if not gpu else f"GPU {gpu} of {node} ("
    text = f"health {episode_id}: {rule} on {where}{evidence.get('reason', '')}: {evidence.get('message', '')})"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


class HealthReconciler:
    decider = staticmethod(d.decide)
    """The pure decision (a seam only for the simulator's `--break health-ignore-limits`: production never sets it)."""

    def __init__(self, store: Store, bus: Bus, jobs: JobEngine, rng: random.Random, *, holder: str) -> None:
        self.store, self.bus, self.jobs, self.rng, self.holder = store, bus, jobs, rng, holder
        self.seen_seq: int | None = None
        """The event log's last seq when the last pass read the fleet: later waking events are news to it."""

    async def pass_once(self, *, lease: bool = True) -> list[d.Decision] | None:
        """One pass; the decisions it carried out, or None without the lease (another process reconciles)."""
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            if lease and not await leases.acquire(tx, LEASE_NAME, self.holder, now_ms, LEASE_TTL_MS):
                return None
            seen = await events_sql.last_seq(tx)
            loaded = await load(tx, now_ms)
            tx.on_commit(lambda: setattr(self, "seen_seq", seen))  # a pass rolled back has seen nothing
            decisions = self.decider(loaded.world)
            rows = dict(loaded.rows)
            for x in decisions:
                await self._apply(tx, x, loaded, rows, now_ms)
        return decisions

    async def run_forever(self, clock: Clock, interval_s: float = INTERVAL_S) -> None:
        """Pass when the event log moves and at least every `interval_s` while an episode is open; with none
        open, only for news that can open one, or every `BACKSTOP_S` (`_has_work`). A store failure is logged.

        Each pass reads every node's status: at 1,000 nodes, a pass on every event cost 8 % of a simulated
        heavy run with no policy set (`bc sim`), for nothing."""
        last_full = -math.inf
        while True:
            try:
                started = clock.monotonic()
                if self.seen_seq is None or started - last_full >= BACKSTOP_S or await self._has_work(self.seen_seq):
                    last_full = started
                    await self.pass_once()
            except StoreError as e:
                log.warning("event=health.pass-failed error=%s", e)
            except Exception:  # a bug must not end the reconciler for good: the pass rolled back; log it, go on
                log.exception("event=health.pass-crashed")
            await self.bus.wait_events(interval_s)
            await asyncio.sleep(MIN_GAP_S)

    async def _has_work(self, seen_seq: int) -> bool:
        """Whether a pass now could decide anything: an episode is open (its job moves, its node comes and
        goes, its GPU's holds end), or a condition changed or a policy was set since the last pass."""
        async with self.store.transaction(write=False) as tx:
            if await health_sql.has_open_episodes(tx):
                return True
            return bool(await events_sql.of_types_since(tx, seen_seq, WAKING_TYPES))

    # -- carrying decisions out ---------------------------------------------------------------------

    async def _apply(self, tx: Tx, x: d.Decision, loaded: Loaded, rows: dict[d.Key, Row], now_ms: int) -> None:
        if isinstance(x, d.Open):
            await self._open(tx, x, loaded, rows, now_ms)
            return
        row = rows[x.key]
        eid, state = str(row["id"]), str(row["state"])
        base = {"episode": eid, "node": x.key[0], "gpu": x.key[1]}
        if isinstance(x, d.Start):
            await self._start(tx, x, row, loaded, now_ms)
        elif isinstance(x, d.Escalate):
            policy = loaded.world.policy
            evidence = json.loads(str(row["evidence"] or "{}"))
            preapproved, approval = await self._preapproval(tx, loaded, x.key[0], "node.reboot", now_ms)
            req = JobRequest(
                "reboot",
                (x.key[0],),
                reason=reason_text(x.key, str(row["rule"]), evidence, eid),
                deadline_s=float(policy.drain_deadline_s),
                preapproved=preapproved,
            )
            try:
                dag_id = await self.jobs.submit_in(tx, req, REQUESTER, now_ms)
            except BcError as e:
                await self._wait(tx, row, f"the reboot job was refused: {e.message}", now_ms)
                return
            d.next_state(state, "escalate")
            await health_sql.update_episode(
                tx, eid, state, {"stage": d.REBOOT_STAGE, "dag_id": dag_id, "wait_reason": ""}
            )
            await health_sql.add_action(tx, eid, d.REBOOT_STAGE, now_ms)
            data = {**base, "dag_id": dag_id, "why": x.why, **({"approval": approval} if approval else {})}
            await self._event(tx, "health.remediation.escalated", x.key, data, now_ms)
        elif isinstance(x, d.Finish):
            await self._end(tx, row, "finish", x.why, now_ms)
            await self._event(tx, "health.remediation.done", x.key, {**base, "why": x.why}, now_ms)
            await self._return(tx, x.key, eid, now_ms)
        elif isinstance(x, d.Quarantine):
            await self._end(tx, row, "quarantine", x.why, now_ms)
            await self._event(tx, "health.remediation.failed", x.key, {**base, "why": x.why}, now_ms)
            await self._quarantine(tx, x.key, eid, x.why, now_ms)
        elif isinstance(x, d.Clear):
            await self._end(tx, row, "clear", x.why, now_ms)
            await self._event(tx, "health.remediation.cleared", x.key, {**base, "why": x.why}, now_ms)
            await self._return(tx, x.key, eid, now_ms)
        elif isinstance(x, d.Seen):
            await health_sql.update_episode(tx, eid, state, {"clear_since_ms": x.since_ms or None})
        elif isinstance(x, d.Wait):
            await self._wait(tx, row, x.why, now_ms)

    async def _open(self, tx: Tx, x: d.Open, loaded: Loaded, rows: dict[d.Key, Row], now_ms: int) -> None:
        eid = "h-" + ulid(now_ms / 1000, self.rng)
        state = d.next_state(d.QUEUED, "quarantine") if x.quarantine_why else d.QUEUED
        row: dict[str, Any] = {
            "id": eid,
            "node_id": x.key[0],
            "gpu_uuid": x.key[1],
            "state": state,
            "action": x.action,
            "rule": x.match,
            "stage": "",
            "evidence": json.dumps(x.condition.evidence(), sort_keys=True),
            "dag_id": None,
            "wait_reason": "",
            "outcome": x.quarantine_why,
            "policy_version": loaded.policy_version,
            "opened_at_ms": now_ms,
            "started_at_ms": None,
            "ended_at_ms": now_ms if x.quarantine_why else None,
            "clear_since_ms": None,
        }
        await health_sql.add_episode(tx, row)
        rows[x.key] = row
        data = {
            "episode": eid,
            "node": x.key[0],
            "gpu": x.key[1],
            "rule": x.match,
            "action": x.action,
            "evidence": x.condition.evidence(),
            "policy_version": loaded.policy_version,
        }
        await self._event(tx, "health.remediation.queued", x.key, data, now_ms)
        if x.quarantine_why:
            await self._quarantine(tx, x.key, eid, x.quarantine_why, now_ms)
            return
        if x.condition.on_node:  # nothing to cordon: the reboot job's drain keeps new holds off the node
            return
        reason = f"health {eid}: {x.match} ({x.condition.reason})"
        if await health_sql.cordon_gpu(tx, *x.key, reason, eid, False, REQUESTER, now_ms):
            await self._event(
                tx,
                "health.gpu.cordoned",
                x.key,
                {"episode": eid, "node": x.key[0], "gpu": x.key[1], "reason": reason},
                now_ms,
            )

    async def _start(self, tx: Tx, x: d.Start, row: Row, loaded: Loaded, now_ms: int) -> None:
        eid, state = str(row["id"]), str(row["state"])
        policy = loaded.world.policy
        stage = d.first_stage(x.action)
        reason = reason_text(x.key, str(row["rule"]), x.evidence, eid)
        kind = "node.reboot" if stage == d.REBOOT_STAGE else "gpu.reset"
        preapproved, approval = await self._preapproval(tx, loaded, x.key[0], kind, now_ms)
        if stage == d.REBOOT_STAGE:  # a node condition: the node's reboot job (drain, node.reboot)
            req = JobRequest(
                "reboot",
                (x.key[0],),
                reason=reason,
                deadline_s=float(policy.drain_deadline_s),
                preapproved=preapproved,
            )
        else:
            req = JobRequest(
                "remediate",
                (x.key[0],),
                reason=reason,
                gpus=(x.key[1],),
                deadline_s=float(policy.drain_deadline_s),
                gpu_scope=True,
                preapproved=preapproved,
            )
        try:
            dag_id = await self.jobs.submit_in(tx, req, REQUESTER, now_ms)
        except BcError as e:
            await self._wait(tx, row, f"the remediation job was refused: {e.message}", now_ms)
            return
        d.next_state(state, "start")
        await health_sql.update_episode(
            tx,
            eid,
            state,
            {"state": d.RUNNING, "stage": stage, "dag_id": dag_id, "started_at_ms": now_ms, "wait_reason": ""},
        )
        await health_sql.add_action(tx, eid, stage, now_ms)
        used = d.limits_used(loaded.world)
        data = {
            "episode": eid,
            "node": x.key[0],
            "gpu": x.key[1],
            "dag_id": dag_id,
            "action": x.action,
            "evidence": dict(x.evidence),
            "limits": {
                "nodes_before": used.nodes,
                "node_cap": used.node_cap,
                "actions_last_hour_before": used.actions_last_hour,
                "actions_cap": used.actions_cap,
            },
            **({"approval": approval} if approval else {}),
        }
        await self._event(tx, "health.remediation.started", x.key, data, now_ms)
        if policy.drain == "ask":
            gpus = [x.key[1]] if x.key[1] else None  # a node's reboot drains all of its GPUs
            holds = await health_sql.reservations_on_gpus(tx, x.key[0], gpus, now_ms)
            if holds:
                asked = {
                    "episode": eid,
                    "node": x.key[0],
                    "gpu": x.key[1],
                    "dag_id": dag_id,
                    "reservations": [{"id": str(h["id"]), "tenant": str(h["tenant"])} for h in holds[:20]],
                    "more": max(0, len(holds) - 20),
                }
                await self._event(tx, "health.drain.asked", x.key, asked, now_ms)

    async def _preapproval(self, tx: Tx, loaded: Loaded, node_id: str, kind: str, now_ms: int) -> tuple[int, str]:
        """(the policy version whose signed pre-approval covers `kind` on the node, what it says) or (0, why a
        quorum batch is asked for instead); (0, "") when no approvers exist (nothing needs approving). Only
        advice: the node checks the signed version itself (docs/health.md)."""
        if not await quorum.has_approvers(tx):
            return 0, ""
        row = await health_sql.policy(tx)
        if row is None or int(row["version"]) != loaded.policy_version:
            return 0, "a quorum batch (the policy changed during this pass)"
        standing = await preapprovals.standing(tx, row, loaded.world.policy, now_ms)
        facts = loaded.world.nodes.get(node_id)
        version, note = preapprovals.use(standing, kind, facts.labels if facts else {}, now_ms)
        return (version, note) if version else (0, f"a quorum batch ({note})")

    async def _end(self, tx: Tx, row: Row, event: str, why: str, now_ms: int) -> None:
        state = str(row["state"])
        new = d.next_state(state, event)
        await health_sql.update_episode(
            tx, str(row["id"]), state, {"state": new, "outcome": why, "ended_at_ms": now_ms, "wait_reason": ""}
        )

    async def _wait(self, tx: Tx, row: Row, why: str, now_ms: int) -> None:
        if str(row["wait_reason"] or "") == why:
            return
        await health_sql.update_episode(tx, str(row["id"]), str(row["state"]), {"wait_reason": why})
        key = (str(row["node_id"]), str(row["gpu_uuid"]))
        data = {"episode": str(row["id"]), "node": key[0], "gpu": key[1], "why": why}
        await self._event(tx, "health.remediation.waiting", key, data, now_ms)

    async def _return(self, tx: Tx, key: d.Key, eid: str, now_ms: int) -> None:
        if await health_sql.return_gpu(tx, *key, episode_id=eid):
            await self._event(tx, "health.gpu.returned", key, {"episode": eid, "node": key[0], "gpu": key[1]}, now_ms)

    async def _quarantine(self, tx: Tx, key: d.Key, eid: str, why: str, now_ms: int) -> None:
        if not key[1]:  # a node: nothing cordoned; the reconciler leaves the condition to a person for a while
            data = {"episode": eid, "node": key[0], "why": why, "for": "a person"}
            await self._event(tx, "health.node.quarantined", key, data, now_ms)
            return
        reason = f"health {eid}: quarantined: {why}"
        await health_sql.cordon_gpu(tx, *key, reason[:MAX_REASON], eid, True, REQUESTER, now_ms)
        data = {"episode": eid, "node": key[0], "gpu": key[1], "why": why, "for": "a person"}
        await self._event(tx, "health.gpu.quarantined", key, data, now_ms)

    async def _event(self, tx: Tx, type_: str, key: d.Key, data: dict[str, Any], now_ms: int) -> None:
        log.info("event=%s node=%s gpu=%s", type_, key[0], key[1])
        await publish(tx, self.bus, type_, key[0], data, now_ms)
