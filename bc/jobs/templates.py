"""Templates: what `bc jobs run TEMPLATE …` asks for, as a DAG of primitives. Pure: the facts it needs
(which nodes exist, whether approvers exist, each node's GPUs) are read by the engine and passed in.

The shapes (docs/jobs.md draws each one):

    cordon n     SetWanted(n, cordoned) → Reconcile(n)                      + Emit(n) tail
    uncordon n   SetWanted(n, schedulable) → Reconcile(n)                   + Emit(n) tail
    drain n      SetWanted(n, cordoned) → Drain(n) ⇢ Reconcile(n) tail      + Emit(n) tail
    reboot n…    per wave of --max-parallel nodes i (all nodes without it), when approvers exist:
                 Batch:i(node.reboot, the wave) → [after Batch:i-1, ⇢ wave i-1's groups] and ResolveApproval:i tail;
                 per n: group reboot:n {Drain(n) → Command(n, node.reboot)} ⇢ Reconcile(n) tail, Emit(n) tail
    remediate n  group remediate:n {Drain(n) ∥ Batch(gpu.reset, n)} → Command(n, gpu.reset) → Command(n, diag.nvml)}
                 ⇢ Reconcile(n) tail, ResolveApproval tail, Emit(n) tail; the health reconciler's (`gpu_scope`)
                 drains the named GPUs' holds only, and without approvers (or with a signed pre-approval, whose
                 policy version its gpu.reset carries) has no Batch and no ResolveApproval
    rollout …    per n (in order, at most --max-unavailable at once): PatchSpec(n, section) ⇢ Emit(n) tail;
                 stop on the first failure
    release …    per n (in order, at most --max-unavailable at once): Command(n, daemon.upgrade) ⇢ Emit(n)
                 tail; stop on the first failure (`bc release rollout`, docs/self-update.md)

(→ AfterOk, ⇢ AfterAny.) `cordon` and `uncordon` write the operator's durable wanted state; `drain`,
`reboot` and `remediate` hold the node out of placement only for their run (Drain sets the job's hold,
the tail Reconcile clears it), so the node ends as the operator wanted it, whatever happened.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from bc.errors import Conflict, NotFound, UsageError
from bc.jobs import metal_template
from bc.jobs.model import DagSpec, Dep, DepWhen, NodeSpec
from bc.jobs.views import TEMPLATES, JobRequest

ANY = DepWhen.AFTER_ANY

MAX_SUBJECTS = 10_000
MAX_PARALLEL = 10_000
MAX_DEADLINE_S = 7 * 86_400
ROLLOUT_POOL = "unavailable"
REBOOT_POOL = "parallel"
UPGRADE_KIND = "daemon.upgrade"
BATCH_NOT_AFTER_S = 6 * 3600.0  # a job's batch waits for its quorum and then for its turn under the pools


@dataclass(frozen=True)
class Facts:
    """What a template needs to know of the fleet at submit."""

    nodes: frozenset[str]
    has_approvers: bool
    gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def build(req: JobRequest, dag_id: str, facts: Facts) -> DagSpec:
    """The DAG for `req`, or one UsageError / NotFound / Conflict naming what is wrong."""
    if req.template == metal_template.TEMPLATE:  # `bc metal provision`'s, never `bc jobs run`'s
        return metal_template.build(req, dag_id, facts.nodes, facts.has_approvers)
    if req.template not in TEMPLATES:
        raise UsageError(f"unknown job template {req.template!r}; templates are {', '.join(TEMPLATES)}")
    subjects = _subjects(req, facts)
    if not 0 < req.deadline_s <= MAX_DEADLINE_S:
        raise UsageError("the deadline must be more than 0 s and at most 7 days")
    if len(req.reason) > 500:
        raise UsageError("the reason is longer than 500 characters")
    if req.template in ("cordon", "uncordon"):
        return _wanted(dag_id, req.template, subjects, cordoned=req.template == "cordon")
    if req.template == "drain":
        return _drain(dag_id, subjects, req.deadline_s)
    if req.template == "reboot":
        return _reboot(dag_id, subjects, req, facts)
    if req.template == "remediate":
        return _remediate(dag_id, subjects, req, facts)
    if req.template == "release":
        return _release(dag_id, subjects, req)
    return _rollout(dag_id, subjects, req)


def _subjects(req: JobRequest, facts: Facts) -> tuple[str, ...]:
    nodes = tuple(req.nodes)
    if any(not n or n != n.strip() for n in nodes):
        raise UsageError("a node name is empty or has spaces around it")
    if not nodes:
        raise UsageError(f"{req.template} needs at least one node")
    if len(nodes) > MAX_SUBJECTS:
        raise UsageError(f"a job takes at most {MAX_SUBJECTS:,} nodes")
    seen: set[str] = set()
    for n in nodes:
        if n in seen:
            raise UsageError(f"node {n} appears twice; a job acts on each node once")
        seen.add(n)
        if n not in facts.nodes:
            raise NotFound(f"no node named {n!r}")
    if req.template in ("cordon", "uncordon", "drain", "remediate") and len(nodes) != 1:
        raise UsageError(f"{req.template} acts on one node; run one job per node")
    return nodes


def _emit(n: str, after: list[str]) -> NodeSpec:
    return NodeSpec(f"emit:{n}", "Emit", subject=n, deps=tuple(Dep(a, ANY) for a in after), tail=True)


def _wanted(dag_id: str, template: str, subjects: tuple[str, ...], *, cordoned: bool) -> DagSpec:
    (n,) = subjects
    nodes = (
        NodeSpec(f"set:{n}", "SetWanted", subject=n, params={"cordoned": cordoned}, lease=True),
        NodeSpec(f"reconcile:{n}", "Reconcile", subject=n, deps=(Dep(f"set:{n}"),), lease=True),
        _emit(n, [f"set:{n}", f"reconcile:{n}"]),
    )
    return DagSpec(dag_id, template, nodes)


def _drain(dag_id: str, subjects: tuple[str, ...], deadline_s: float) -> DagSpec:
    (n,) = subjects
    nodes = (
        NodeSpec(f"set:{n}", "SetWanted", subject=n, params={"cordoned": True}, lease=True),
        NodeSpec(
            f"drain:{n}", "Drain", subject=n, params={"deadline_s": deadline_s}, deps=(Dep(f"set:{n}"),), lease=True
        ),
        NodeSpec(
            f"reconcile:{n}",
            "Reconcile",
            subject=n,
            deps=(Dep(f"set:{n}", ANY), Dep(f"drain:{n}", ANY)),
            lease=True,
            tail=True,
        ),
        _emit(n, [f"set:{n}", f"drain:{n}", f"reconcile:{n}"]),
    )
    return DagSpec(dag_id, "drain", nodes)


def _reboot(dag_id: str, subjects: tuple[str, ...], req: JobRequest, facts: Facts) -> DagSpec:
    if not 0 <= req.max_parallel <= MAX_PARALLEL:
        raise UsageError(f"--max-parallel must be at least 1 (and at most {MAX_PARALLEL:,})")
    local = {REBOOT_POOL: req.max_parallel} if req.max_parallel else {}
    pools = ("reboots", *local)
    nodes: list[NodeSpec] = []
    batched = facts.has_approvers and not req.preapproved  # a signed pre-approval stands in for the batch
    waves = reboot_waves(subjects, req.max_parallel) if batched else [subjects]
    previous: tuple[str, list[str]] | None = None  # the wave before: its batch node and group roots
    for i, wave in enumerate(waves, start=1):
        batch = _wave_node("batch", i, len(waves))
        head: tuple[Dep, ...] = ()
        if batched:
            params = {
                "kind": "node.reboot",
                "nodes": list(wave),
                "payload_json": _reason_payload(req),
                "reason": req.reason,
            }
            # Asked for when due: after the wave before ended (and only if its batch was approved), so its
            # approvals are as fresh as the wave's first reboot, however long the waves before took.
            due = (Dep(previous[0]), *(Dep(r, ANY) for r in previous[1])) if previous else ()
            nodes.append(NodeSpec(batch, "Batch", params=params, deps=due))
            head = (Dep(batch),)
        roots: list[str] = []
        for n in wave:
            root = f"reboot:{n}"
            roots.append(root)
            command: dict[str, object] = {"kind": "node.reboot", "payload_json": _reason_payload(req)}
            if batched:
                command["batch_node"] = batch
            elif req.preapproved:
                command["preapproval"] = req.preapproved
            nodes += [
                NodeSpec(root, "Group", subject=n, lease=True, pools=pools, deps=head),
                NodeSpec(
                    f"drain:{n}", "Drain", subject=n, params={"deadline_s": req.deadline_s}, lease=True, group=root
                ),
                NodeSpec(
                    f"cmd:{n}", "Command", subject=n, params=command, deps=(Dep(f"drain:{n}"),), lease=True, group=root
                ),
                NodeSpec(f"reconcile:{n}", "Reconcile", subject=n, deps=(Dep(root, ANY),), lease=True, tail=True),
                _emit(n, [root, f"reconcile:{n}"]),
            ]
        if batched:
            deps = (Dep(batch, ANY), *(Dep(r, ANY) for r in roots))
            resolve = _wave_node("resolve", i, len(waves))
            nodes.append(NodeSpec(resolve, "ResolveApproval", params={"batch_node": batch}, deps=deps, tail=True))
        previous = (batch, roots)
    return DagSpec(dag_id, "reboot", tuple(nodes), local_pools=local)


def reboot_waves(subjects: tuple[str, ...], max_parallel: int) -> list[tuple[str, ...]]:
    """A rolling reboot's batches: `--max-parallel` nodes each, in the order given (all at once without it).

    Each wave's batch is asked for when the wave is due, so no approval has to outlive the waves before it
    (an approval counts for the hour its signer gave it, and nodes check that hour themselves).
    """
    size = max_parallel or len(subjects)
    return [subjects[i : i + size] for i in range(0, len(subjects), size)]


def _wave_node(prefix: str, i: int, waves: int) -> str:
    """`batch` / `resolve` for a job with one batch (as remediate's), `batch:1`, `batch:2`, … for several."""
    return prefix if waves == 1 else f"{prefix}:{i}"


def _reason_payload(req: JobRequest) -> str:
    return json.dumps({"reason": req.reason}) if req.reason else "{}"


def _remediate(dag_id: str, subjects: tuple[str, ...], req: JobRequest, facts: Facts) -> DagSpec:
    (n,) = subjects
    if not facts.has_approvers and not req.gpu_scope:
        raise Conflict(
            "remediate resets GPUs through a quorum batch, and no approvers are configured:"
            " add them first (bc approve keygen, bc approvers add)"
        )
    if any(not g or g != g.strip() for g in req.gpus):
        raise UsageError("a GPU UUID is empty or has spaces around it")
    gpus = tuple(req.gpus) or tuple(facts.gpus.get(n, ()))
    if not gpus:
        raise UsageError(f"node {n} reports no GPUs; name them with --gpus")
    known = set(facts.gpus.get(n, ()))
    unknown = [g for g in gpus if known and g not in known]
    if unknown:
        raise UsageError(f"node {n} has no GPU {unknown[0]}")
    root = f"remediate:{n}"
    reset_payload = json.dumps({"gpu_uuids": list(gpus)})
    batched = facts.has_approvers and not req.preapproved  # a signed pre-approval stands in for the batch
    batch = {"kind": "gpu.reset", "nodes": [n], "payload_json": reset_payload, "reason": req.reason}
    reset: dict[str, object] = {"kind": "gpu.reset", "payload_json": reset_payload}
    if batched:
        reset["batch_node"] = "batch"
    elif req.preapproved:
        reset["preapproval"] = req.preapproved
    diag = {"kind": "diag.nvml", "payload_json": json.dumps({"gpu_uuids": list(gpus)})}
    drain: dict[str, object] = {"deadline_s": req.deadline_s}
    if req.gpu_scope:  # the GPUs' holds alone; the GPUs are cordoned, the node's other GPUs keep working
        drain |= {"gpus": list(gpus), "hold": False}
    nodes = (
        NodeSpec(root, "Group", subject=n, lease=True, pools=("remediations",)),
        NodeSpec(f"drain:{n}", "Drain", subject=n, params=drain, lease=True, group=root),
        *((NodeSpec("batch", "Batch", params=batch, group=root),) if batched else ()),
        NodeSpec(
            f"reset:{n}",
            "Command",
            subject=n,
            params=reset,
            deps=(Dep(f"drain:{n}"), *((Dep("batch"),) if batched else ())),
            lease=True,
            group=root,
        ),
        NodeSpec(f"diag:{n}", "Command", subject=n, params=diag, deps=(Dep(f"reset:{n}"),), lease=True, group=root),
        NodeSpec(f"reconcile:{n}", "Reconcile", subject=n, deps=(Dep(root, ANY),), lease=True, tail=True),
        *(
            (NodeSpec("resolve", "ResolveApproval", params={"batch_node": "batch"}, deps=(Dep(root, ANY),), tail=True),)
            if batched
            else ()
        ),
        _emit(n, [root, f"reconcile:{n}"]),
    )
    return DagSpec(dag_id, "remediate", nodes)


def _rollout(dag_id: str, subjects: tuple[str, ...], req: JobRequest) -> DagSpec:
    if not req.section:
        raise UsageError("a rollout needs --section")
    if req.section == "devices":
        raise UsageError("a rollout cannot patch the devices section: reservations own it")
    if not 1 <= req.max_unavailable <= MAX_PARALLEL:
        raise UsageError(f"--max-unavailable must be at least 1 (and at most {MAX_PARALLEL:,})")
    params = {"section": req.section, "section_json": req.section_json}
    nodes: list[NodeSpec] = []
    for n in subjects:
        nodes += [
            NodeSpec(f"patch:{n}", "PatchSpec", subject=n, params=params, lease=True, pools=("rollouts", ROLLOUT_POOL)),
            _emit(n, [f"patch:{n}"]),
        ]
    return DagSpec(
        dag_id, "rollout", tuple(nodes), local_pools={ROLLOUT_POOL: req.max_unavailable}, stop_on_failure=True
    )


def _release(dag_id: str, subjects: tuple[str, ...], req: JobRequest) -> DagSpec:
    from bc.control.commands.queue import payload_from_json

    if req.section != "daemon" or not req.section_json:
        raise UsageError("a release rollout needs the daemon section's release (bc release rollout VERSION)")
    payload_from_json(UPGRADE_KIND, req.section_json)  # a payload that cannot parse never starts
    if not 1 <= req.max_unavailable <= MAX_PARALLEL:
        raise UsageError(f"--max-unavailable must be at least 1 (and at most {MAX_PARALLEL:,})")
    command = {"kind": UPGRADE_KIND, "payload_json": req.section_json}
    nodes: list[NodeSpec] = []
    for n in subjects:
        nodes += [
            # Only the DAG's own pool: --max-unavailable is the bound (the global `rollouts` pool is for specs).
            NodeSpec(f"upgrade:{n}", "Command", subject=n, params=command, lease=True, pools=(ROLLOUT_POOL,)),
            _emit(n, [f"upgrade:{n}"]),
        ]
    return DagSpec(
        dag_id, "release", tuple(nodes), local_pools={ROLLOUT_POOL: req.max_unavailable}, stop_on_failure=True
    )
