"""The persisted job queue: the pure scheduler's steps, carried out and stored in one transaction each.

Theory of operation
-------------------
Every change to the queue is one *step* in one store transaction: a submit, a cancel, a pool
capacity, or a pass over the running nodes (`pass_once`). A step takes the `job_meta` row (PostgreSQL
holds its lock to the commit, SQLite's single writer does the rest), loads the live world (or reuses
the one this process holds, when the stored version says nothing changed since), calls the pure
`scheduler.step_all`, writes what it decided (node states, held leases and slots, the DAG roll-ups,
`job.*` events) and starts every node it claimed (`bc.jobs.primitives`): the start's store effect (a
command enqueued, a batch created, a spec patched) commits with the claim, or neither does. Nodes that
settle at once (SetWanted, Reconcile, Emit, …) feed the next round of the same step, so a cordon DAG is
done when its submit returns.

A `bc serve` killed at any instant leaves either the step before or the step after: a restarted
engine loads the world from the rows, re-checks each running node from its stored detail (the command
it sent, the batch it created) and never starts a settled node again.

`run_forever` is the singleton that notices outcomes: under the store lease `worker:jobs` (like the
command sweeper's), it runs a pass whenever the event log moves (a command settled, a status
reported, an approval) and at least every `interval_s`.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.nodes import specs
from bc.control.quorum import batches as quorum
from bc.control.signing.signer import Signer
from bc.control.trust.identity import TokenMint
from bc.errors import Conflict, NotFound
from bc.jobs import primitives, scheduler, templates
from bc.jobs.model import DagSpec, Dep, DepWhen, NodeSpec, NodeState
from bc.jobs.scheduler import CancelDag, Decisions, Event, Finished, SetCapacity, Submit, World
from bc.jobs.step_ctx import Ctx
from bc.jobs.views import JobRequest
from bc.seams.clock import Clock
from bc.seams.ids import ulid
from bc.store import Store, StoreError, Tx, leases
from bc.store import jobs as jobs_sql
from bc.store import nodes as nodes_sql

log = logging.getLogger("bc.jobs.engine")

LEASE_NAME = "worker:jobs"
LEASE_TTL_MS = 15_000
MAX_ROUNDS = 10_000  # rounds of one step: each settles at least one node, so a DAG's size bounds it


@dataclass
class _Held:
    """The world this process last stored, with what the pure world does not carry."""

    version: int
    world: World
    owners: dict[str, str] = field(default_factory=dict)  # dag id -> requested_by


class JobEngine:
    build = staticmethod(templates.build)
    """The request-to-DAG rule (a seam only for the simulator's `--break health-reset-under-hold`: production
    never sets it)."""

    def __init__(
        self,
        store: Store,
        bus: Bus,
        signer: Signer,
        rng: random.Random,
        *,
        holder: str,
        tokens: TokenMint | None = None,
    ) -> None:
        self.store, self.bus, self.signer, self.rng, self.holder = store, bus, signer, rng, holder
        # Join tokens a provisioning job mints (bc.jobs.metal_steps); set by bc.assembly where the CA is.
        self.tokens = tokens
        self._held: _Held | None = None

    # -- what clients ask -----------------------------------------------------------

    async def submit(self, req: JobRequest, requested_by: str) -> str:
        """Store and start a DAG for `req`; returns its id. Bad input stores nothing."""
        if req.template == "rollout" and req.section != "devices":
            specs.section_mutation(req.section, req.section_json)  # a rollout that cannot parse never starts
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            return await self.submit_in(tx, req, requested_by, now_ms)

    async def submit_in(self, tx: Tx, req: JobRequest, requested_by: str, now_ms: int) -> str:
        """`submit` inside the caller's transaction (the health reconciler's: its episode and its job commit
        together or not at all)."""
        facts = await self._facts(tx, req, requested_by)
        dag_id = "j-" + ulid(now_ms / 1000, self.rng)
        spec = self.build(req, dag_id, facts)
        await self._step(tx, [Submit(spec)], now_ms, new=(spec, req, requested_by))
        return dag_id

    async def cancel(self, dag_id: str, requested_by: str) -> bool:
        """Cancel a live DAG's queued nodes (tails spared) and ask its running commands to cancel;
        True when anything was cancelled or asked."""
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            row = await jobs_sql.get_dag(tx, dag_id)
            if row is None:
                raise NotFound(f"no job named {dag_id!r}")
            if row["settled_at_ms"] is not None:
                raise Conflict(f"job {dag_id} already ended {row['state']}; there is nothing to cancel")
            dec = await self._step(tx, [CancelDag(dag_id)], now_ms)
            await publish(
                tx, self.bus, "job.cancel", dag_id, {"by": requested_by, "cancelled": bool(dec.cancel_answer)}, now_ms
            )
        return bool(dec.cancel_answer)

    async def set_slots(self, pool: str, capacity: int) -> None:
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            await self._step(tx, [SetCapacity(pool, capacity)], now_ms)
            await publish(tx, self.bus, "job.slots", pool, {"capacity": capacity}, now_ms)

    # -- noticing outcomes --------------------------------------------------------------

    async def pass_once(self, *, lease: bool = True) -> int:
        """Check every running node; settle those that ended and schedule. Returns how many settled.
        Without the store lease (another process runs the queue) it does nothing."""
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            if lease and not await leases.acquire(tx, LEASE_NAME, self.holder, now_ms, LEASE_TTL_MS):
                return 0
            held = await self._peek(tx)
            events: list[Event] = []
            rows = [(r, json.loads(str(r["detail"] or "{}"))) for r in await jobs_sql.running_nodes(tx)]
            # A running Command ends only when its command row does: one look at all of them, not one each.
            waiting = [str(d["command_id"]) for r, d in rows if r["kind"] == "Command" and d.get("command_id")]
            ended = await jobs_sql.settled_commands(tx, waiting)
            for row, detail in rows:
                dag_id, node_id = str(row["dag_id"]), str(row["id"])
                if row["kind"] == "Command" and detail.get("command_id") and str(detail["command_id"]) not in ended:
                    continue
                try:
                    run = held.world.dag(dag_id)
                except NotFound:
                    continue
                node = run.nodes[node_id]
                ctx = self._ctx(tx, now_ms, held, dag_id, node, detail)
                outcome = await primitives.check(ctx)
                if ctx.detail != detail:
                    await jobs_sql.set_node_detail(tx, dag_id, node_id, json.dumps(ctx.detail, sort_keys=True))
                if outcome is not None:
                    events.append(Finished(dag_id, node_id, outcome.ok, outcome.error, cancelled=outcome.cancelled))
            if not events:
                return 0  # nothing moved: nothing written (a quiet pass leaves the store as it was)
            if await jobs_sql.bump_version(tx) != held.version + 1:
                return 0  # another process stepped since the look (PostgreSQL): the next pass looks again
            held.version += 1
            await self._step(tx, events, now_ms, held=held)
        return len(events)

    async def run_forever(self, clock: Clock, interval_s: float = 1.0) -> None:
        """Pass whenever the event log moves and at least every `interval_s`; a store failure is logged.

        A pass only looks at running job nodes (a Command's row, a wait's deadline): with none, a pass woken
        by an event is skipped after one read, and the lease is renewed every third of its TTL. Each pass
        takes the lease in a write transaction, and a fleet's command traffic publishes events by the
        hundred a second: one fsynced commit per event for nothing was a third of `bc serve`'s commits
        per command at one node (docs/scale.md)."""
        last_full = -math.inf
        while True:
            working = True
            try:
                started = clock.monotonic()
                working = await self._has_work()
                if working or started - last_full >= LEASE_TTL_MS / 3000:
                    last_full = started
                    await self.pass_once()
            except StoreError as e:
                log.warning("event=jobs.pass-failed error=%s", e)
            except Exception:  # a bug must not end the queue for good: the pass rolled back; log it, go on
                log.exception("event=jobs.pass-crashed")
            if working:  # a running job node answers each event at once
                await self.bus.wait_events(interval_s)
            else:  # an idle queue looks again at most every `EVENT_GAP_S` (a submit starts its own nodes)
                await self.bus.wait_events_spaced(interval_s)

    async def _has_work(self) -> bool:
        async with self.store.transaction(write=False) as tx:
            return await jobs_sql.any_running(tx)

    # -- one step ------------------------------------------------------------------------

    async def _step(
        self,
        tx: Tx,
        events: Sequence[Event],
        now_ms: int,
        *,
        new: tuple[DagSpec, JobRequest, str] | None = None,
        held: _Held | None = None,
    ) -> Decisions:
        held = held or await self._begin(tx)
        if new is not None:
            held.owners[new[0].id] = new[2]
        first: Decisions | None = None
        pending: list[Event] = list(events)
        world = held.world
        for _ in range(MAX_ROUNDS):
            before = world
            world, dec = scheduler.step_all(world, pending)
            first = first or dec
            if new is not None:
                await self._insert(tx, new, now_ms)
                new = None
            await self._write(tx, before, world, pending, dec, now_ms, held)
            pending = await self._start(tx, world, dec, now_ms, held)
            if not pending:
                break
        else:  # pragma: no cover - a template that grows forever
            raise Conflict("a job step did not settle within its round limit")
        self._keep_on_commit(tx, _Held(held.version, world, held.owners))
        assert first is not None
        return first

    async def _peek(self, tx: Tx) -> _Held:
        """The stored world without taking the step's lock: what a pass checks before it writes anything."""
        version = await jobs_sql.version(tx)
        if self._held is not None and self._held.version == version:
            return _Held(version, self._held.world, dict(self._held.owners))
        world, owners = await _load_world(tx)
        return _Held(version, world, owners)

    async def _begin(self, tx: Tx) -> _Held:
        """Take the step's row lock first (PostgreSQL), then the world: the one held here when no other
        step came between (the stored version is ours plus one), else loaded from the rows."""
        version = await jobs_sql.bump_version(tx)
        if self._held is not None and self._held.version == version - 1:
            return _Held(version, self._held.world, dict(self._held.owners))
        world, owners = await _load_world(tx)
        return _Held(version, world, owners)

    def _keep_on_commit(self, tx: Tx, held: _Held) -> None:
        """Hold `held` for the next step once this transaction commits (a rollback leaves the old one
        valid: the version bump rolls back with it)."""

        def keep() -> None:
            self._held = held

        tx.on_commit(keep)

    async def _insert(self, tx: Tx, new: tuple[DagSpec, JobRequest, str], now_ms: int) -> None:
        spec, req, requested_by = new
        args = {k: v for k, v in _request_doc(req).items() if v not in ("", (), 0, None)}
        await jobs_sql.insert_dag(
            tx,
            id_=spec.id,
            submit_seq=await jobs_sql.next_submit_seq(tx),
            template=spec.template,
            args=json.dumps(args, sort_keys=True),
            subjects=json.dumps(sorted(spec.lease_subjects())),
            local_pools=json.dumps(dict(spec.local_pools), sort_keys=True),
            stop_on_failure=spec.stop_on_failure,
            requested_by=requested_by,
            reason=req.reason,
            now_ms=now_ms,
        )
        await _insert_nodes(tx, spec.id, spec.nodes, 0)
        data = {"template": spec.template, "subjects": list(req.nodes), "requested_by": requested_by}
        await publish(tx, self.bus, "job.submitted", spec.id, data, now_ms)

    async def _write(
        self, tx: Tx, before: World, after: World, events: Sequence[Event], dec: Decisions, now_ms: int, held: _Held
    ) -> None:
        touched: dict[str, None] = {}
        for ev in events:
            if isinstance(ev, Finished):
                state = NodeState.DONE if ev.ok else NodeState.CANCELLED if ev.cancelled else NodeState.FAILED
                await jobs_sql.set_node_state(tx, ev.dag, ev.node, state.value, now_ms, error=ev.error)
                if ev.grow:
                    await _insert_nodes(tx, ev.dag, ev.grow, await jobs_sql.max_pos(tx, ev.dag) + 1)
                await self._node_event(tx, ev.dag, ev.node, state, now_ms, ev.error)
                touched[ev.dag] = None
            elif isinstance(ev, CancelDag):
                touched[ev.dag] = None
            elif isinstance(ev, SetCapacity):
                await jobs_sql.set_pool(tx, ev.pool, ev.capacity)
            elif isinstance(ev, Submit):
                touched[ev.spec.id] = None
        for dag_id, node_id in dec.cancelled:
            await jobs_sql.set_node_state(tx, dag_id, node_id, NodeState.CANCELLED.value, now_ms)
            await self._node_event(tx, dag_id, node_id, NodeState.CANCELLED, now_ms, None)
            touched[dag_id] = None
        for key, (dag_id, node_id) in dec.released_slots:
            await jobs_sql.drop_slot(tx, key, dag_id, node_id)
        for subject, dag_id in dec.released_leases:
            await jobs_sql.drop_lease(tx, subject, dag_id)
        # After the releases: a lease a DAG let go of in this step may go to the next one in it.
        for c in dec.claims:
            await jobs_sql.set_node_state(tx, c.dag, c.node, NodeState.RUNNING.value, now_ms)
            for subject in c.leases:
                await jobs_sql.take_lease(tx, subject, c.dag)
            for key in c.slots:
                await jobs_sql.take_slot(tx, key, c.dag, c.node)
            await self._node_event(tx, c.dag, c.node, NodeState.RUNNING, now_ms, None)
            touched[c.dag] = None
        live = {d.spec.id: d for d in after.dags}
        for dag_id in touched:
            run = live.get(dag_id)
            if run is not None:
                await jobs_sql.update_dag(
                    tx,
                    dag_id,
                    state=run.state().value,
                    first_error=run.first_error,
                    cancel_requested=run.cancel_requested,
                    settled_at_ms=None,
                )
        ended = {d.spec.id: d for d in before.dags}
        # Indexed once per round: a bulk step ends thousands of DAGs.
        event_errors: dict[str, str] = {}
        cancelled_now: set[str] = set()
        for ev in events:
            if isinstance(ev, Finished) and not ev.ok and not ev.cancelled and ev.error:
                event_errors.setdefault(ev.dag, ev.error)
            elif isinstance(ev, CancelDag):
                cancelled_now.add(ev.dag)
        for dag_id, state in dec.terminal:
            run = ended.get(dag_id)
            first_error = (run.first_error if run is not None else None) or event_errors.get(dag_id)
            await jobs_sql.update_dag(
                tx,
                dag_id,
                state=state.value,
                first_error=first_error,
                cancel_requested=bool(run and run.cancel_requested) or dag_id in cancelled_now,
                settled_at_ms=now_ms,
            )
            await jobs_sql.drop_dag_slots(tx, dag_id)
            data: dict[str, object] = {"state": state.value}
            if first_error:
                data["error"] = first_error
            await publish(tx, self.bus, "job.settled", dag_id, data, now_ms)
            held.owners.pop(dag_id, None)

    async def _node_event(
        self, tx: Tx, dag_id: str, node_id: str, state: NodeState, now_ms: int, error: str | None
    ) -> None:
        data: dict[str, object] = {"node": node_id, "state": state.value}
        if error:
            data["error"] = error
        await publish(tx, self.bus, "job.node", dag_id, data, now_ms)

    async def _start(self, tx: Tx, world: World, dec: Decisions, now_ms: int, held: _Held) -> list[Event]:
        """Start what `dec` claimed and ask what it must cancel; the outcomes known at once, as events."""
        live = {d.spec.id: d for d in world.dags}
        out: list[Event] = []
        for c in dec.claims:
            run = live[c.dag]
            ctx = self._ctx(tx, now_ms, held, c.dag, run.nodes[c.node], {}, c.deps, c.first_error)
            outcome = await primitives.start(ctx)
            if ctx.detail:
                await jobs_sql.set_node_detail(tx, c.dag, c.node, json.dumps(ctx.detail, sort_keys=True))
            if outcome is not None:
                out.append(Finished(c.dag, c.node, outcome.ok, outcome.error, cancelled=outcome.cancelled))
        for dag_id, node_id in dec.cancel_running:
            row = await jobs_sql.node(tx, dag_id, node_id)
            if row is None or dag_id not in live:
                continue
            detail = json.loads(str(row["detail"] or "{}"))
            ended = await primitives.cancel(self._ctx(tx, now_ms, held, dag_id, live[dag_id].nodes[node_id], detail))
            if ended is not None:
                out.append(Finished(dag_id, node_id, ended.ok, ended.error, cancelled=ended.cancelled))
        return out

    def _ctx(
        self,
        tx: Tx,
        now_ms: int,
        held: _Held,
        dag_id: str,
        node: NodeSpec,
        detail: dict[str, Any],
        deps: tuple[Any, ...] = (),
        first_error: str | None = None,
    ) -> Ctx:
        return Ctx(
            tx=tx,
            bus=self.bus,
            signer=self.signer,
            rng=self.rng,
            now_ms=now_ms,
            dag_id=dag_id,
            requested_by=held.owners.get(dag_id, ""),
            node=node,
            detail=dict(detail),
            deps=deps,
            first_error=first_error,
            tokens=self.tokens,
        )

    async def _facts(self, tx: Tx, req: JobRequest, requested_by: str) -> templates.Facts:
        names = list(req.nodes[: templates.MAX_SUBJECTS + 1])
        existing = await jobs_sql.existing_nodes(tx, names)
        gpus: dict[str, tuple[str, ...]] = {}
        if req.template == "remediate":
            for n in names[:1]:
                row = await nodes_sql.get(tx, n)
                if row is not None:
                    inventory = json.loads(str(row["inventory"] or "{}"))
                    gpus[n] = tuple(str(g.get("uuid", "")) for g in inventory.get("gpus", []) if g.get("uuid"))
        has = await quorum.has_approvers(tx)
        if has and req.template in ("remediate", "reboot", "metal.provision") and not req.preapproved:
            await quorum.check_can_approve(tx, requested_by)  # a batch that could never be approved: refuse now
        return templates.Facts(frozenset(existing), has, gpus)


def _request_doc(req: JobRequest) -> dict[str, Any]:
    return {
        "nodes": list(req.nodes),
        "reason": req.reason,
        "gpus": list(req.gpus),
        "max_parallel": req.max_parallel,
        "section": req.section,
        "max_unavailable": req.max_unavailable if req.template in ("rollout", "release") else 0,
        "deadline_s": req.deadline_s if req.template in ("drain", "reboot", "remediate") else 0,
        **({"preapproved": req.preapproved} if req.preapproved else {}),
    }


async def _insert_nodes(tx: Tx, dag_id: str, nodes: Sequence[NodeSpec], pos: int) -> None:
    for i, n in enumerate(nodes):
        await jobs_sql.insert_node(
            tx,
            dag_id=dag_id,
            id_=n.id,
            pos=pos + i,
            kind=n.kind,
            subject=n.subject,
            params=json.dumps(dict(n.params), sort_keys=True),
            lease=n.lease,
            pools=json.dumps(list(n.pools)),
            group=n.group,
            tail=n.tail,
        )
        for d in n.deps:
            await jobs_sql.insert_edge(tx, dag_id, n.id, d.node, d.when.value)


async def _load_world(tx: Tx) -> tuple[World, dict[str, str]]:
    """The live world from the rows: DAGs in submit order, each node's state, the held resources."""
    dag_rows = await jobs_sql.live_dags(tx)
    nodes_by_dag: dict[str, list[dict[str, Any]]] = {}
    for r in await jobs_sql.live_nodes(tx):
        nodes_by_dag.setdefault(str(r["dag_id"]), []).append(r)
    deps: dict[tuple[str, str], list[Dep]] = {}
    for e in await jobs_sql.live_edges(tx):
        deps.setdefault((str(e["dag_id"]), str(e["node_id"])), []).append(
            Dep(str(e["dep_id"]), DepWhen(str(e["kind"])))
        )
    world = World(capacities={str(p["name"]): int(p["capacity"]) for p in await jobs_sql.pools(tx)})
    owners: dict[str, str] = {}
    for d in dag_rows:
        dag_id = str(d["id"])
        rows = nodes_by_dag.get(dag_id, [])
        specs_ = tuple(
            NodeSpec(
                id=str(r["id"]),
                kind=str(r["kind"]),
                subject=None if r["subject"] is None else str(r["subject"]),
                params=json.loads(str(r["params"])),
                deps=tuple(deps.get((dag_id, str(r["id"])), ())),
                lease=bool(r["lease"]),
                pools=tuple(json.loads(str(r["pools"]))),
                group=None if r["grp"] is None else str(r["grp"]),
                tail=bool(r["tail"]),
            )
            for r in rows
        )
        spec = DagSpec(
            id=dag_id,
            template=str(d["template"]),
            nodes=specs_,
            local_pools={str(k): int(v) for k, v in json.loads(str(d["local_pools"])).items()},
            subjects=frozenset(str(s) for s in json.loads(str(d["subjects"]))),
            stop_on_failure=bool(d["stop_on_failure"]),
        )
        run = scheduler.DagRun(
            spec,
            {str(r["id"]): NodeState(str(r["state"])) for r in rows},
            {str(r["id"]): str(r["error"]) for r in rows if r["error"]},
            None if d["first_error"] is None else str(d["first_error"]),
            bool(d["cancel_requested"]),
        )
        world.dags.append(run)
        owners[dag_id] = str(d["requested_by"])
    for r in await jobs_sql.leases(tx):
        world.leases[str(r["subject"])] = str(r["dag_id"])
    for r in await jobs_sql.slots(tx):
        world.slots.setdefault(str(r["pool_key"]), set()).add((str(r["dag_id"]), str(r["node_id"])))
    return world, owners
