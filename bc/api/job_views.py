"""Jobs on the wire: a `SubmitJobRequest` to a `JobRequest` (bounded, or one UsageError), and the job
queue's views (`bc.jobs.views`) to the Admin API's messages.

Pure functions: no store, no engine. The engine checks what needs the store (unknown nodes, the
template's own rules); what can be judged from the request alone is refused here, before anything
runs, with the option's CLI name in the sentence so an operator knows what to change.
"""

from __future__ import annotations

import json
from typing import Any

from bc.errors import NotFound, UsageError
from bc.jobs.views import TEMPLATES, DagView, JobRequest, NodeView, PoolView
from bc.protocol.limits import LIMITS, check_count, check_size, text_size
from bc.protocol.pb import admin_pb2

MAX_PARALLEL = 10_000
"""`--max-parallel` and `--max-unavailable`: at most the nodes of one batch (`max_batch_nodes`)."""

MAX_DEADLINE_S = 3650 * 86400
"""`--deadline`: ten years, like every duration the CLI takes."""

MAX_GPUS = 1024
"""`--gpus`: far more than any host has."""

MAX_SLOTS = 10_000
"""A slot pool's capacity (`bc jobs slots --set`)."""

_DEFAULTS = JobRequest(template="", nodes=())
"""Where an unset optional field of the request takes its value from: the engine's own defaults."""


def _bounded(value: int, low: int, high: int, option: str) -> int:
    if not low <= value <= high:
        raise UsageError(f"{option} must be between {low:,} and {high:,}, not {value:,}")
    return value


def job_request(req: admin_pb2.SubmitJobRequest) -> JobRequest:
    """The engine's request; a template we do not know or an option out of range is a UsageError."""
    if req.template not in TEMPLATES:
        raise UsageError(f"there is no job template {req.template[:64]!r}; the templates are {', '.join(TEMPLATES)}")
    check_count("the node list", len(req.nodes), "max_batch_nodes")
    for name in req.nodes:
        if name != name.strip():  # the name as given, never a near miss: "n1\r" is not n1
            raise NotFound(f"no node named {name[:64]!r}")
    for gpu in req.gpus:
        if gpu != gpu.strip() or not gpu:
            raise UsageError(f"--gpus names {gpu[:64]!r}, which is not a GPU UUID")
    check_count("--gpus", len(req.gpus), "max_batch_nodes")
    if len(req.gpus) > MAX_GPUS:
        raise UsageError(f"--gpus names {len(req.gpus):,} GPUs; at most {MAX_GPUS:,}")
    check_size("the reason", text_size(req.reason), "max_text_bytes")
    check_size(f"the {req.section[:64]!r} section", text_size(req.section_json), "max_section_bytes")
    max_parallel = _bounded(req.max_parallel, 1, MAX_PARALLEL, "--max-parallel") if req.HasField("max_parallel") else 0
    max_unavailable = (
        _bounded(req.max_unavailable, 1, MAX_PARALLEL, "--max-unavailable")
        if req.HasField("max_unavailable")
        else _DEFAULTS.max_unavailable
    )
    deadline_s = (
        _bounded(req.deadline_s, 1, MAX_DEADLINE_S, "--deadline (seconds)")
        if req.HasField("deadline_s")
        else _DEFAULTS.deadline_s
    )
    return JobRequest(
        template=req.template,
        nodes=tuple(req.nodes),
        reason=req.reason,
        gpus=tuple(req.gpus),
        max_parallel=max_parallel,
        section=req.section,
        section_json=req.section_json,
        max_unavailable=max_unavailable,
        deadline_s=float(deadline_s),
    )


def slot_settings(capacities: dict[str, int], known: list[PoolView]) -> list[tuple[str, int]]:
    """Every `pool=capacity` checked before any is applied, so a refused set changes nothing."""
    names = {p.name for p in known}
    out: list[tuple[str, int]] = []
    for name, capacity in sorted(capacities.items()):
        if name not in names:
            known_names = ", ".join(sorted(names)) or "none"
            raise UsageError(f"there is no slot pool {name[:64]!r}; the pools are {known_names}")
        out.append((name, _bounded(capacity, 1, MAX_SLOTS, f"the capacity of {name}")))
    return out


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str) if value else "{}"


def node_info(n: NodeView) -> admin_pb2.JobNodeInfo:
    return admin_pb2.JobNodeInfo(
        id=n.id,
        kind=n.kind,
        subject=n.subject,
        state=n.state,
        error=n.error,
        deps=[admin_pb2.JobDep(node=dep, when=when) for dep, when in n.deps],
        group=n.group,
        tail=n.tail,
        detail_json=_json(n.detail),
        started_at_ms=n.started_at_ms,
        finished_at_ms=n.finished_at_ms,
    )


def job_info(d: DagView) -> admin_pb2.JobInfo:
    return admin_pb2.JobInfo(
        id=d.id,
        template=d.template,
        state=d.state,
        terminal=d.terminal,
        subjects=list(d.subjects),
        args_json=_json(d.args),
        requested_by=d.requested_by,
        reason=d.reason,
        first_error=d.first_error,
        cancel_requested=d.cancel_requested,
        created_at_ms=d.created_at_ms,
        settled_at_ms=d.settled_at_ms,
        nodes=[node_info(n) for n in d.nodes],
        awaiting_approval=[
            admin_pb2.ApprovalWait(node=a.node, batch_id=a.batch_id, signed=a.signed, needed=a.needed)
            for a in d.awaiting_approval
        ],
    )


def pool(p: PoolView) -> admin_pb2.JobPool:
    return admin_pb2.JobPool(name=p.name, capacity=p.capacity, held=p.held)


def jobs_within(dags: list[DagView], budget: int = LIMITS.max_frame_bytes) -> tuple[list[admin_pb2.JobInfo], int]:
    """The DAGs' messages in order, leaving out the oldest terminal ones (then the oldest) past `budget`.

    Returns the kept messages and how many were left out; a live DAG goes only when the live ones alone
    outgrow the frame, and then the newest are kept.
    """
    infos = [job_info(d) for d in dags]
    sizes = [i.ByteSize() + 8 for i in infos]
    spent = sum(sizes)
    drop: set[int] = set()
    order = [i for i, d in enumerate(dags) if d.terminal] + [i for i, d in enumerate(dags) if not d.terminal]
    for i in order:
        if spent <= budget:
            break
        drop.add(i)
        spent -= sizes[i]
    return [info for i, info in enumerate(infos) if i not in drop], len(drop)
