"""The `metal.provision` template (`bc metal provision` / `reprovision`; docs/metal.md). Pure, like
`bc.jobs.templates`: the machines' plans come resolved in the request (`bc.control.metal.plan`).

Per machine m, on the subject `metal:m` (the machine's lease), at most --max-parallel machines at once:

    group metal:m (pool: the DAG's "parallel" of --max-parallel) {
      power-off:m → prepare:m → pxe:m → power-on:m → ramdisk:m (join) → inventory:m
        → wipe:m → deploy:m → kexec:m → os:m (join, labels) }
    cleanup:m (boot.cleanUp, tail) ⇢ metal:m
    settle:m (the machine's outcome, tail) ⇢ metal:m, cleanup:m

`reprovision NODE` puts set:NODE (SetWanted cordoned) → drain:NODE (Drain) before the group, and
reconcile:NODE (tail) after it, as the drain template does: the node stays cordoned (uncordon it after).
A machine that fails fails its own group only: the others go on (no stop on failure).

With approvers registered, every destructive step (power-off, pxe, power-on, wipe, deploy of every machine) is a
leaf of one `metal.bulk` batch asked for first: bulk (MetalBulk) → every metal:m, and resolve (ResolveApproval,
tail) ⇢ bulk, every metal:m; each such step releases its own leaf when it runs (so --max-parallel holds after
the quorum), and the disk must be named at submit (the approvers sign each wipe's and deploy's payload).
"""

from __future__ import annotations

import json

from bc.errors import NotFound, UsageError
from bc.jobs.metal_steps import BULK_STEPS, COMMAND_STEPS, STEPS, bulk_leaves
from bc.jobs.model import DagSpec, Dep, DepWhen, NodeSpec
from bc.jobs.views import JobRequest

TEMPLATE = "metal.provision"
POOL = "parallel"
MAX_MACHINES = 1000
ANY = DepWhen.AFTER_ANY


def _kind(step: str) -> str:
    if step in COMMAND_STEPS:
        return "MetalCommand"
    return "MetalInventory" if step == "inventory" else "MetalJoin"


def build(req: JobRequest, dag_id: str, nodes: frozenset[str], has_approvers: bool) -> DagSpec:
    try:
        plans = json.loads(req.metal_json or "[]")
    except ValueError:
        raise UsageError("a metal.provision job needs its machines' plans") from None
    if not isinstance(plans, list) or not plans:
        raise UsageError("a metal.provision job needs its machines' plans (bc metal provision)")
    if len(plans) > MAX_MACHINES:
        raise UsageError(f"a job provisions at most {MAX_MACHINES} machines")
    if not 0 <= req.max_parallel <= MAX_MACHINES:
        raise UsageError(f"--max-parallel must be between 1 and {MAX_MACHINES}")
    local = {POOL: req.max_parallel} if req.max_parallel else {}
    head: tuple[Dep, ...] = ()
    out: list[NodeSpec] = []
    leaf_of: dict[tuple[str, str], int] = {}
    if has_approvers:  # one metal.bulk batch over every destructive step, asked for first
        if any(not p.get("disk") for p in plans):
            raise UsageError(
                "with approvers registered, name the disk (--disk NAME): the approvers sign each wipe and deploy"
            )
        leaves = bulk_leaves(plans)
        for i, plan in enumerate(plans):
            for j, step in enumerate(BULK_STEPS):
                leaf_of[(str(plan["machine"]), step)] = i * len(BULK_STEPS) + j
        bulk = {"leaves": [list(x) for x in leaves], "reason": req.reason}
        out.append(NodeSpec("bulk", "MetalBulk", params=bulk))
        head = (Dep("bulk"),)
    n = req.reprovision
    if n:
        if n not in nodes:
            raise NotFound(f"no node named {n!r}")
        out += [
            NodeSpec(f"set:{n}", "SetWanted", subject=n, params={"cordoned": True}, lease=True),
            NodeSpec(
                f"drain:{n}",
                "Drain",
                subject=n,
                params={"deadline_s": req.deadline_s},
                deps=(Dep(f"set:{n}"),),
                lease=True,
            ),
        ]
        head = (*head, Dep(f"drain:{n}"))
    roots: list[str] = []
    for plan in plans:
        m = str(plan["machine"])
        subject, root = f"metal:{m}", f"metal:{m}"
        roots.append(root)
        out.append(NodeSpec(root, "Group", subject=subject, lease=True, pools=tuple(local), deps=head))
        prev: str | None = None
        for step in STEPS:
            params = {**plan, "step": step}
            if (m, step) in leaf_of:
                params |= {"batch_node": "bulk", "leaf": leaf_of[(m, step)]}
            deps = (Dep(prev),) if prev else ()
            out.append(
                NodeSpec(f"{step}:{m}", _kind(step), subject=subject, params=params, deps=deps, lease=True, group=root)
            )
            prev = f"{step}:{m}"
        cleanup = {**plan, "step": "cleanup"}
        out += [
            NodeSpec(
                f"cleanup:{m}",
                "MetalCommand",
                subject=subject,
                params=cleanup,
                deps=(Dep(root, ANY),),
                lease=True,
                tail=True,
            ),
            NodeSpec(
                f"settle:{m}",
                "MetalSettle",
                subject=subject,
                params=plan,
                deps=(Dep(root, ANY), Dep(f"cleanup:{m}", ANY)),
                lease=True,
                tail=True,
            ),
        ]
    if leaf_of:
        after = (Dep("bulk", ANY), *(Dep(r, ANY) for r in roots))
        out.append(NodeSpec("resolve", "ResolveApproval", params={"batch_node": "bulk"}, deps=after, tail=True))
    if n:
        tail = (Dep(f"set:{n}", ANY), Dep(f"drain:{n}", ANY), *(Dep(r, ANY) for r in roots))
        out.append(NodeSpec(f"reconcile:{n}", "Reconcile", subject=n, deps=tail, lease=True, tail=True))
    return DagSpec(dag_id, TEMPLATE, tuple(out), local_pools=local)
