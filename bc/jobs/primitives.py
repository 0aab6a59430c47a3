"""The primitives: what each job node does to the fleet, inside the scheduler step's transaction.

`start` runs when the scheduler claims a node, in the same transaction that marks it running, so its
store effect (a command enqueued, a batch created, a spec patched) and the claim commit together or
not at all. It returns an `Outcome` when the node is done at once, else the `detail` to remember (a
command id, a batch id, a generation) and the node stays running. `check` looks again after a wake-up
(a command settled, a generation observed, an approval); `cancel` asks a running node to stop (a
command is asked to cancel; it still reports its real outcome).

A restarted scheduler re-checks running nodes from their stored detail, so it re-attaches to the
command it sent; a Command's idempotency key `job:<dag>:<node>` makes even a repeated start harmless.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping

from bc.control.base.events import publish
from bc.control.commands import queue as cmds
from bc.control.commands import states as cs
from bc.control.nodes import specs
from bc.control.quorum import batches as quorum
from bc.control.quorum import bulk
from bc.errors import BcError
from bc.jobs import metal_steps
from bc.jobs.model import deps_state, failure_reason
from bc.jobs.step_ctx import DONE, Ctx, Outcome, Primitive
from bc.protocol import root_equiv
from bc.protocol.pb import common_pb2, spec_pb2
from bc.store import commands as cmd_sql
from bc.store import health as health_sql
from bc.store import jobs as jobs_sql
from bc.store import node_lifecycle as life_sql
from bc.store import nodes as nodes_sql
from bc.store import operators as ops_sql
from bc.store import quorum as q_sql

# -- SetWanted, Reconcile, Group, Emit: done at once -----------------------------------


async def _set_wanted(ctx: Ctx) -> Outcome | None:
    cordoned = bool(ctx.param("cordoned"))
    if await life_sql.set_cordoned(ctx.tx, ctx.subject, cordoned):
        await publish(
            ctx.tx,
            ctx.bus,
            "node.cordoned" if cordoned else "node.uncordoned",
            ctx.subject,
            {"dag_id": ctx.dag_id},
            ctx.now_ms,
        )
    return DONE


async def _reconcile(ctx: Ctx) -> Outcome | None:
    """Converge the node's schedulability to its wanted state: drop this job's transient hold."""
    if await jobs_sql.clear_job_hold(ctx.tx, ctx.subject, ctx.dag_id):
        await publish(ctx.tx, ctx.bus, "node.job-hold-released", ctx.subject, {"dag_id": ctx.dag_id}, ctx.now_ms)
    return DONE


async def _group(ctx: Ctx) -> Outcome | None:
    return DONE  # a group root only holds its group's resources


async def _emit(ctx: Ctx) -> Outcome | None:
    state = deps_state(ctx.deps)
    data: dict[str, object] = {"dag_id": ctx.dag_id, "node": ctx.node.subject or "", "state": state.value}
    reason = failure_reason(ctx.deps, ctx.first_error)
    if reason:
        data["error"] = reason
    await publish(ctx.tx, ctx.bus, "job.outcome", ctx.dag_id, data, ctx.now_ms)
    return DONE


# -- Drain ----------------------------------------------------------------------------


async def _drain_start(ctx: Ctx) -> Outcome | None:
    if ctx.param("hold", True):  # a GPU-scoped drain (the health reconciler's) holds no node: its GPUs are cordoned
        await jobs_sql.set_job_hold(ctx.tx, ctx.subject, ctx.dag_id)
    ctx.detail["deadline_ms"] = ctx.now_ms + round(float(ctx.param("deadline_s", 1800)) * 1000)
    return await _drain_check(ctx)


async def _drain_cancel(ctx: Ctx) -> Outcome | None:
    """A drain only waits: cancelled, it ends `cancelled` (its hold is the tail Reconcile's to clear)."""
    return Outcome(False, f"drain of {ctx.node.subject} cancelled with job {ctx.dag_id}", cancelled=True)


async def _patch_cancel(ctx: Ctx) -> Outcome | None:
    """The spec is patched already (an effect that started): stop waiting, and say so as a failure."""
    generation = ctx.detail.get("generation")
    return Outcome(False, f"job {ctx.dag_id} cancelled while {ctx.node.subject} converged generation {generation}")


WAITING_SHOWN = 5
"""A waiting drain names this many of the reservations it waits for in its detail (the rest are counted)."""


async def _drain_check(ctx: Ctx) -> Outcome | None:
    gpus = [str(g) for g in ctx.param("gpus", [])]
    if gpus:  # only the holds on these GPUs (never released here: the drain waits for them to end)
        rows = [
            {**r, "end_ms": None if int(r["open_ended"] or 0) else r["end_ms"]}
            for r in await health_sql.reservations_on_gpus(ctx.tx, ctx.subject, gpus, ctx.now_ms)
        ]
    else:
        rows = await jobs_sql.live_reservations(ctx.tx, ctx.subject)
    left = [str(r["id"]) for r in rows]
    if not left:
        ctx.detail.pop("waiting_for", None)
        ctx.detail.pop("waiting_more", None)
        return DONE
    # What it waits for, in its detail: the progress line and `bc jobs show` name them (docs/jobs.md).
    ctx.detail["waiting_for"] = [
        {"id": str(r["id"]), "tenant": str(r["tenant"]), "end_ms": None if r["end_ms"] is None else int(r["end_ms"])}
        for r in rows[:WAITING_SHOWN]
    ]
    if len(rows) > WAITING_SHOWN:
        ctx.detail["waiting_more"] = len(rows) - WAITING_SHOWN
    else:
        ctx.detail.pop("waiting_more", None)
    if ctx.now_ms >= int(ctx.detail.get("deadline_ms", 0)):
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        return Outcome(
            False, f"node {ctx.subject} still holds {len(left)} reservation(s) at the drain deadline: {shown}"
        )
    return None


# -- Command ----------------------------------------------------------------------------


async def _command_start(ctx: Ctx) -> Outcome | None:
    kind_name = str(ctx.param("kind"))
    batch_node = ctx.param("batch_node")
    if batch_node:
        batch_id = await _batch_id_of(ctx, str(batch_node))
        if not batch_id:
            return Outcome(False, f"the batch node {batch_node} created no batch")
        ctx.detail["command_id"] = await quorum.release_leaf(ctx.tx, ctx.bus, batch_id, ctx.subject)
        ctx.detail["batch_id"] = batch_id
        return await _command_check(ctx)
    kind = cmds.kind_of(kind_name)
    payload = cmds.payload_from_json(kind_name, str(ctx.param("payload_json", "{}")))
    req = cmds.EnqueueRequest(
        ctx.subject,
        kind_name,
        payload,
        idempotency_key=f"job:{ctx.dag_id}:{ctx.node.id}",
        requested_by=ctx.requested_by,
        preapproval=int(str(ctx.param("preapproval", 0))),
    )
    row = await cmds.enqueue_in(ctx.tx, ctx.bus, ctx.signer, req, kind, payload, ctx.now_ms, ctx.rng)
    ctx.detail["command_id"] = str(row["id"])
    return None


async def _command_check(ctx: Ctx) -> Outcome | None:
    row = await cmd_sql.get(ctx.tx, str(ctx.detail["command_id"]))
    if row is None:
        return Outcome(False, f"command {ctx.detail['command_id']} is gone")
    state = str(row["state"])
    if state == cs.SUCCEEDED:
        return DONE
    if state in cs.TERMINAL:
        why = str(row["reason"] or "")
        msg = str(row["message"] or "")
        text = f"{row['kind']} on {ctx.subject} {state}" + (f" ({why})" if why else "") + (f": {msg}" if msg else "")
        # Cancelled: it never ran (a command the node had started reports its own outcome instead).
        return Outcome(False, text, cancelled=state == cs.CANCELLED)
    return None


async def _command_cancel(ctx: Ctx) -> Outcome | None:
    cid = ctx.detail.get("command_id")
    if cid:
        await cmds.request_cancel_in(ctx.tx, ctx.bus, str(cid), f"job {ctx.dag_id} cancelled", ctx.now_ms)
        return await _command_check(ctx)  # a command never sent is cancelled now; one in flight reports later
    return None


# -- Batch and ResolveApproval -----------------------------------------------------------------


async def _batch_id_of(ctx: Ctx, batch_node: str) -> str:
    row = await jobs_sql.node(ctx.tx, ctx.dag_id, batch_node)
    return str(json.loads(str(row["detail"])).get("batch_id", "")) if row is not None else ""


async def _batch_start(ctx: Ctx) -> Outcome | None:
    from bc.jobs.templates import BATCH_NOT_AFTER_S

    req = quorum.BatchRequest(
        kind=str(ctx.param("kind")),
        node_ids=[str(n) for n in ctx.param("nodes", [])],
        payload_json=str(ctx.param("payload_json", "{}")),
        reason=str(ctx.param("reason", "")) or f"job {ctx.dag_id}",
        not_after_s=BATCH_NOT_AFTER_S,
    )
    ctx.detail["batch_id"] = await quorum.create_batch_in(
        ctx.tx, ctx.bus, ctx.signer, req, ctx.requested_by, ctx.rng, ctx.now_ms, dag_id=ctx.dag_id
    )
    return None


async def _bulk_start(ctx: Ctx) -> Outcome | None:
    """A provisioning job's `metal.bulk` batch (bc.control.quorum.bulk): its leaves were fixed at submit."""
    from bc.jobs.templates import BATCH_NOT_AFTER_S

    leaves = [(str(n), str(k), str(p)) for n, k, p in ctx.param("leaves", [])]
    ctx.detail["batch_id"] = await bulk.create_bulk_in(
        ctx.tx,
        ctx.bus,
        ctx.rng,
        leaves,
        reason=str(ctx.param("reason", "")) or f"job {ctx.dag_id}",
        requested_by=ctx.requested_by,
        now_ms=ctx.now_ms,
        dag_id=ctx.dag_id,
        not_after_s=BATCH_NOT_AFTER_S,
    )
    return None


async def _batch_check(ctx: Ctx) -> Outcome | None:
    batch = await q_sql.get_batch(ctx.tx, str(ctx.detail["batch_id"]))
    if batch is None:
        return Outcome(False, f"batch {ctx.detail['batch_id']} is gone")
    state = str(batch["state"])
    if state == "approved":
        return DONE
    if state == "rejected":
        return Outcome(False, f"batch {batch['id']} was rejected")
    if state == "withdrawn":  # by this job's cancel: nothing was approved, nothing ran
        return Outcome(False, f"batch {batch['id']} was withdrawn", cancelled=True)
    if int(batch["not_after_ms"]) <= ctx.now_ms:
        return Outcome(False, f"batch {batch['id']} expired before its quorum")
    return None


async def _batch_cancel(ctx: Ctx) -> Outcome | None:
    bid = ctx.detail.get("batch_id")
    if bid:
        await quorum.withdraw(ctx.tx, ctx.bus, str(bid), f"job {ctx.dag_id} cancelled", ctx.now_ms)
    return None  # the next check sees it withdrawn


async def _resolve_approval(ctx: Ctx) -> Outcome | None:
    batch_id = await _batch_id_of(ctx, str(ctx.param("batch_node", "batch")))
    if batch_id:
        outcome = deps_state(ctx.deps)
        reason = failure_reason(ctx.deps, ctx.first_error) or ""
        await quorum.resolve(ctx.tx, ctx.bus, batch_id, outcome.value, reason, ctx.now_ms)
        ctx.detail["batch_id"] = batch_id
        ctx.detail["resolved_as"] = outcome.value
    return DONE


# -- PatchSpec ------------------------------------------------------------------------------------


async def _patch_start(ctx: Ctx) -> Outcome | None:
    section = str(ctx.param("section"))
    mutate = specs.section_mutation(section, str(ctx.param("section_json", "{}")))
    refused = await _root_equivalent_refusal(ctx, section, mutate)
    if refused is not None:
        return refused
    wrote = await specs.write_spec(ctx.tx, ctx.bus, ctx.signer, ctx.subject, mutate, ctx.now_ms)
    ctx.detail["generation"] = wrote.generation
    ctx.detail["deadline_ms"] = ctx.now_ms + round(float(ctx.param("deadline_s", PATCH_DEADLINE_S)) * 1000)
    return await _patch_check(ctx)


async def _root_equivalent_refusal(
    ctx: Ctx, section: str, mutate: Callable[[spec_pb2.NodeSpec], None]
) -> Outcome | None:
    """A root-equivalent patch (bc.protocol.root_equiv) is admin's, as `bc spec set` is; once approvers exist a
    rollout cannot carry their quorum, so it is refused: `bc spec set` opens the batch per node."""
    stored, _ = await specs.load_spec(ctx.tx, ctx.subject)
    wanted = spec_pb2.NodeSpec()
    wanted.CopyFrom(stored)
    mutate(wanted)
    reasons = root_equiv.changes(section, getattr(stored, section), getattr(wanted, section))
    if not reasons:
        return None
    who = await ops_sql.get(ctx.tx, ctx.requested_by) if ctx.requested_by else None
    head = f"the {section} change on {ctx.subject} is root-equivalent (it {reasons[0]})"
    if who is None or str(who["role"]) != "admin":
        return Outcome(False, f"{head}: it needs the admin role; {ctx.requested_by or 'the requester'} is not an admin")
    if await quorum.has_approvers(ctx.tx):
        return Outcome(False, f"{head}: with approvers registered, set it with `bc spec set` (a batch they approve)")
    return None


async def _patch_check(ctx: Ctx) -> Outcome | None:
    row = await nodes_sql.get(ctx.tx, ctx.subject)
    if row is None:
        return Outcome(False, f"node {ctx.subject} was deleted")
    generation = int(ctx.detail["generation"])
    section = str(ctx.param("section"))
    status = json.loads(str(row["status"] or "{}"))
    for s in status.get("sections", []):
        if s.get("section") != section or int(s.get("generation", 0)) < generation:
            continue
        state = str(s.get("state", ""))
        if state in (_STATE[common_pb2.FAILED], _STATE[common_pb2.UNSUPPORTED]):
            why = s.get("reason") or s.get("message") or "no reason given"
            return Outcome(False, f"node {ctx.subject} answered {section} {state} ({why})")
    if int(row["observed_generation"]) >= generation:
        return DONE
    if ctx.now_ms >= int(ctx.detail.get("deadline_ms", 2**62)):
        return Outcome(False, f"node {ctx.subject} did not observe generation {generation} in time")
    return None


PATCH_DEADLINE_S = 1800.0
"""How long a PatchSpec waits for its node to observe the generation (a node that is down fails it)."""


_STATE: Mapping[int, str] = {v: k for k, v in common_pb2.SectionState.items()}


# -- the table -------------------------------------------------------------------------------------


PRIMITIVES: Mapping[str, Primitive] = {
    "SetWanted": Primitive(_set_wanted),
    "Reconcile": Primitive(_reconcile),
    "Group": Primitive(_group),
    "Emit": Primitive(_emit),
    "Drain": Primitive(_drain_start, _drain_check, _drain_cancel),
    "Command": Primitive(_command_start, _command_check, _command_cancel),
    "Batch": Primitive(_batch_start, _batch_check, _batch_cancel),
    "MetalBulk": Primitive(_bulk_start, _batch_check, _batch_cancel),
    "ResolveApproval": Primitive(_resolve_approval),
    "PatchSpec": Primitive(_patch_start, _patch_check, _patch_cancel),
    **metal_steps.PRIMITIVES,
}


async def _refusal_is_failure(step: Callable[[Ctx], Awaitable[Outcome | None]] | None, ctx: Ctx) -> Outcome | None:
    """Run a primitive's step; a refusal of the control plane (BcError) is the node's failure, not a crash."""
    if step is None:
        return None
    try:
        return await step(ctx)
    except BcError as e:
        return Outcome(False, e.message)


async def start(ctx: Ctx) -> Outcome | None:
    return await _refusal_is_failure(PRIMITIVES[ctx.node.kind].start, ctx)


async def check(ctx: Ctx) -> Outcome | None:
    return await _refusal_is_failure(PRIMITIVES[ctx.node.kind].check, ctx)


async def cancel(ctx: Ctx) -> Outcome | None:
    """Ask a running node to stop; an Outcome when it ended at once, None when its real outcome follows."""
    return await _refusal_is_failure(PRIMITIVES[ctx.node.kind].cancel, ctx)
