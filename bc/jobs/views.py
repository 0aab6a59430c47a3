"""What clients see of a job: one DAG document, its nodes, the slot pools. Plain data, built by
`bc.jobs.queries` and mapped to the wire by `bc.api`; the CLI, the TUI and tests read these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TEMPLATES: tuple[str, ...] = ("remediate", "reboot", "rollout", "drain", "cordon", "uncordon", "release")
"""Every template `bc jobs run` takes, in the order `bc jobs run --help` lists them."""


@dataclass(frozen=True)
class JobRequest:
    """What an operator asks for; `bc.jobs.templates` turns it into a DAG (or one UsageError).

    `nodes`: the subjects (every template); `gpus`: remediate's GPU UUIDs (empty: every GPU);
    `max_parallel`: reboot's DAG-local pool (0: unlimited within the global `reboots` pool);
    `section`, `section_json`: a rollout's spec section and its JSON (release: "daemon" and the
    daemon.upgrade payload, the release record as `bc release rollout` read it); `max_unavailable`: a
    rollout's (and a release's) DAG-local pool (default 1); `deadline_s`: drain's (and remediate's,
    reboot's) drain deadline. `gpu_scope`: remediate only, set by the health reconciler and by no Admin
    call: its drain waits for the holds on the named GPUs alone and holds no node out of placement (the
    GPUs are cordoned already), and without approvers its `gpu.reset` is sent directly, as `reboot`'s
    `node.reboot` is (docs/health.md). `preapproved`: remediate's and reboot's, set by the health reconciler
    alone: the health policy version whose signed pre-approval covers the destructive step on this node, so
    the job asks for no batch and its command carries that version (the node checks it, docs/health.md).
    """

    template: str
    nodes: tuple[str, ...]
    reason: str = ""
    gpus: tuple[str, ...] = ()
    max_parallel: int = 0
    section: str = ""
    section_json: str = ""
    max_unavailable: int = 1
    deadline_s: float = 1800.0
    gpu_scope: bool = False
    preapproved: int = 0
    metal_json: str = ""  # metal.provision: the machines' plans (bc.control.metal.plan), as a JSON list
    reprovision: str = ""  # metal.provision: the node to cordon and drain first (`bc metal reprovision NODE`)


@dataclass(frozen=True)
class NodeView:
    id: str
    kind: str
    subject: str
    state: str  # queued | running | done | failed | cancelled
    error: str
    deps: tuple[tuple[str, str], ...]  # (dep id, "after_ok" | "after_any")
    group: str
    tail: bool
    detail: dict[str, Any] = field(default_factory=dict)  # command_id, batch_id, generation, ...
    started_at_ms: int = 0
    finished_at_ms: int = 0


@dataclass(frozen=True)
class ApprovalWait:
    """A Batch node of the DAG waiting for its quorum: "awaiting approval: batch B, 1 of 2 signed"."""

    node: str
    batch_id: str
    signed: int  # approvals that count now
    needed: int  # k

    def sentence(self) -> str:
        return f"awaiting approval: batch {self.batch_id}, {self.signed} of {self.needed} signed"


@dataclass(frozen=True)
class DagView:
    id: str
    template: str
    state: str  # the roll-up
    terminal: bool
    subjects: tuple[str, ...]
    args: dict[str, Any]
    requested_by: str
    reason: str
    first_error: str
    cancel_requested: bool
    created_at_ms: int
    settled_at_ms: int
    nodes: tuple[NodeView, ...]
    seq: int = 0  # the event seq read in the same transaction (watch from here)
    awaiting_approval: tuple[ApprovalWait, ...] = ()  # its Batch nodes waiting for their quorum now


@dataclass(frozen=True)
class PoolView:
    name: str
    capacity: int
    held: int  # slots held now
