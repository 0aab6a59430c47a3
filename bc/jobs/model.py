"""A job: a DAG of primitive nodes, its edges, the node state table and the roll-up.

Theory of operation
-------------------
A DAG is the unit of submit, cancel and approval resolution; a node is the
unit of scheduling and execution. Every node has a kind (the primitive), a
subject (the fleet node it acts on, or none), params, deps and resource
demands. Edges stay inside one DAG: cross-DAG order comes from the subject
leases (`bc.jobs.scheduler`), never from edges.

Edges (Slurm's afterok/afterany, Airflow's all_success/all_done):

* `AfterOk` (the default): the dep must end `done`; a dep that ends `failed`
  or `cancelled` cancels the dependent, and so on downstream.
* `AfterAny`: the dependent runs once the dep settles, however it ended; a
  `cancelled` dep satisfies it. This is how a tail node runs on success,
  failure and cancel alike.

A node's state moves along ONE table (`TRANSITIONS`):

    queued --claim--> running --succeed--> done
                              --fail-----> failed
                              --cancel---> cancelled   (its own report: it stopped before any effect)
    queued --cancel-> cancelled

A running node is never cancelled by the queue: it reports its real outcome.
A cancel asks it to stop; a node that was only waiting (a batch awaiting its
quorum, a drain, a command never sent) reports `cancelled`, since nothing it
would do happened; one whose effect started reports `succeed` or `fail`.
Anything else is a `JobStateError` ("can't X in state Y").

Groups. A node may name a group root (`group`): the root holds its slot
pools and the leases of every subject in its group from its claim until the
whole group is terminal, so a multi-node step (a reboot's cordon → reboot →
reconcile) holds one slot, and members re-enter it instead of taking another.
A member implicitly depends `AfterOk` on its root, and its deps stay inside
the group, so a claimed group never waits for a resource (which is what keeps
the scheduler free of deadlock). A dep on a group root from outside the group
sees the group's roll-up, so one tail edge covers a whole subtree.

Tails (`tail=True`) are spared by a DAG cancel: their edges must be
`AfterAny`, so the cancelled deps satisfy them and they still run (resolve an
approval as cancelled, emit an outcome, reconcile a cordon back to `wanted`).

Roll-up: failed > running > queued > cancelled > done, over a group or a DAG.
A node's failure reason is its own error, else the DAG's first error (a group
root that rolled up `failed` from a member carries no error of its own).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from bc.errors import ProtocolError, UsageError


class NodeState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class NodeEvent(enum.StrEnum):
    CLAIM = "claim"
    SUCCEED = "succeed"
    FAIL = "fail"
    CANCEL = "cancel"


TERMINAL: frozenset[NodeState] = frozenset({NodeState.DONE, NodeState.FAILED, NodeState.CANCELLED})

TRANSITIONS: Mapping[tuple[NodeState, NodeEvent], NodeState] = {
    (NodeState.QUEUED, NodeEvent.CLAIM): NodeState.RUNNING,
    (NodeState.QUEUED, NodeEvent.CANCEL): NodeState.CANCELLED,
    (NodeState.RUNNING, NodeEvent.SUCCEED): NodeState.DONE,
    (NodeState.RUNNING, NodeEvent.FAIL): NodeState.FAILED,
    (NodeState.RUNNING, NodeEvent.CANCEL): NodeState.CANCELLED,
}
"""The only node moves there are; every other (state, event) pair is an error."""


class JobStateError(ProtocolError):
    """An outcome or claim for a node in a state that cannot take it: the caller broke the contract."""


def next_state(state: NodeState, event: NodeEvent) -> NodeState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise JobStateError(f"can't {event.value} in state {state.value}") from None


_ROLLUP_ORDER: tuple[NodeState, ...] = (
    NodeState.FAILED,
    NodeState.RUNNING,
    NodeState.QUEUED,
    NodeState.CANCELLED,
    NodeState.DONE,
)


def rollup(states: Iterable[NodeState]) -> NodeState:
    """Failed > Running > Queued > Cancelled > Done; an empty set is done (nothing left to do)."""
    present = set(states)
    for s in _ROLLUP_ORDER:
        if s in present:
            return s
    return NodeState.DONE


class DepWhen(enum.StrEnum):
    AFTER_OK = "after_ok"
    AFTER_ANY = "after_any"


@dataclass(frozen=True)
class Dep:
    node: str
    when: DepWhen = DepWhen.AFTER_OK


@dataclass(frozen=True)
class NodeSpec:
    """One primitive node. `lease`: the node affects its subject, so the DAG takes the subject's lease.

    `pools` are slot pools (global names, or a name the DAG declares in `local_pools`); a plain node
    holds one slot of each for its run, a group root across its group, a group member re-enters its
    root's slots and must name no pool the root does not hold.
    """

    id: str
    kind: str
    subject: str | None = None
    params: Mapping[str, object] = field(default_factory=dict)
    deps: tuple[Dep, ...] = ()
    lease: bool = False
    pools: tuple[str, ...] = ()
    group: str | None = None
    tail: bool = False


@dataclass(frozen=True)
class DagSpec:
    """A submitted DAG. `subjects` may declare extra subjects a subgraph grown later will lease:
    a DAG's lease wants are fixed at submit, which is what keeps lease order free of deadlock."""

    id: str
    template: str
    nodes: tuple[NodeSpec, ...]
    local_pools: Mapping[str, int] = field(default_factory=dict)
    subjects: frozenset[str] = frozenset()
    stop_on_failure: bool = False  # a rollout: a failed node cancels every node not yet started

    def lease_subjects(self) -> frozenset[str]:
        """Every subject this DAG may ever lease: its lease nodes' subjects and the declared ones."""
        return self.subjects | {n.subject for n in self.nodes if n.lease and n.subject is not None}


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
POOL_NAME = _ID
"""Ids and pool names hold no '/': the scheduler keys a DAG-local pool as `<dag>/<pool>`."""


def validate(dag: DagSpec) -> None:
    """Everything a DAG must satisfy at submit; UsageError naming the first problem."""
    if not _ID.fullmatch(dag.id):
        raise UsageError(f"bad DAG id {dag.id!r}")
    if not dag.nodes:
        raise UsageError(f"DAG {dag.id} has no nodes")
    for name, cap in dag.local_pools.items():
        if not POOL_NAME.fullmatch(name) or cap < 1:
            raise UsageError(f"DAG {dag.id}: local pool {name!r} needs a name and a capacity of at least 1")
    check_nodes(dag.nodes, (), dag)


def check_nodes(new: Sequence[NodeSpec], existing: Sequence[NodeSpec], dag: DagSpec) -> None:
    """Validate `new` nodes joining `existing` ones (submit: none; growth: the DAG's current nodes)."""
    by_id: dict[str, NodeSpec] = {n.id: n for n in existing}
    for n in new:
        if not _ID.fullmatch(n.id):
            raise UsageError(f"bad node id {n.id!r}")
        if n.id in by_id:
            raise UsageError(f"node {n.id} appears twice in DAG {dag.id}")
        by_id[n.id] = n
    for n in new:
        _check_node(n, by_id, dag)
    cycle = find_cycle(by_id.values())
    if cycle:
        raise UsageError(f"DAG {dag.id} has a cycle: {' → '.join(cycle)}")


def _check_node(n: NodeSpec, by_id: Mapping[str, NodeSpec], dag: DagSpec) -> None:
    if n.lease and n.subject is None:
        raise UsageError(f"node {n.id} takes a lease but names no subject")
    if n.lease and n.subject not in dag.lease_subjects():
        # Only reachable by growth: the DAG did not declare this subject at submit.
        raise UsageError(f"node {n.id} leases {n.subject}, which DAG {dag.id} did not declare at submit")
    for p in n.pools:
        if not POOL_NAME.fullmatch(p):
            raise UsageError(f"node {n.id} names a bad slot pool {p!r}")
    for d in n.deps:
        if d.node not in by_id:
            raise UsageError(f"node {n.id} depends on {d.node}, which is not in DAG {dag.id}")
    if n.tail:
        if n.group is not None or any(m.group == n.id for m in by_id.values()):
            raise UsageError(f"tail node {n.id} can be neither in a group nor a group root")
        if any(d.when is not DepWhen.AFTER_ANY for d in n.deps):
            raise UsageError(f"tail node {n.id} must depend AfterAny: a cancel has to satisfy it")
    if n.group is None:
        return
    if n.group not in by_id:
        raise UsageError(f"node {n.id} is in group {n.group}, which is not in DAG {dag.id}")
    if by_id[n.group].tail:  # reachable by growth: a tail that became a root would lose its weak edges' meaning
        raise UsageError(f"node {n.id} is in group {n.group}, a tail node, which cannot root a group")
    for d in n.deps:
        if not in_group(d.node, n.group, by_id):
            raise UsageError(f"node {n.id} is in group {n.group} but depends on {d.node} outside it")
    held = {p for g in ancestors(n.id, by_id) for p in by_id[g].pools}
    missing = [p for p in n.pools if p not in held]
    if missing:
        raise UsageError(f"node {n.id} names pool {missing[0]}, which its group root does not hold")


def ancestors(node_id: str, by_id: Mapping[str, NodeSpec]) -> list[str]:
    """The group roots enclosing a node, innermost first (stops at a loop: find_cycle reports it)."""
    out: list[str] = []
    g = by_id[node_id].group
    while g is not None and g in by_id and g not in out and g != node_id:
        out.append(g)
        g = by_id[g].group
    return out


def in_group(node_id: str, root: str, by_id: Mapping[str, NodeSpec]) -> bool:
    """True when `node_id` is `root` or inside the group `root` roots."""
    return node_id == root or root in ancestors(node_id, by_id)


def edges(n: NodeSpec) -> list[str]:
    """What a node waits on: its deps and (implicitly, AfterOk) its group root."""
    return [d.node for d in n.deps] + ([n.group] if n.group is not None else [])


def find_cycle(nodes: Iterable[NodeSpec]) -> list[str]:
    """A cycle as a path that returns to its start (['a', 'b', 'a']), or [] when there is none."""
    by_id = {n.id: n for n in nodes}
    colour: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in by_id:
        if start in colour:
            continue
        # Iterative DFS: a 30-node chain is fine recursively, a grown 10,000-node one is not.
        path: list[str] = [start]
        stack: list[Iterator[str]] = [iter(edges(by_id[start]))]
        colour[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                stack.pop()
                continue
            if nxt not in by_id:
                continue
            if colour.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in colour:
                colour[nxt] = 1
                path.append(nxt)
                stack.append(iter(edges(by_id[nxt])))
    return []


@dataclass(frozen=True)
class DepOutcome:
    """How a dep ended, as the dependent sees it at its claim (a group root: its group's roll-up)."""

    node: str
    state: NodeState
    error: str | None = None


def deps_state(deps: Sequence[DepOutcome]) -> NodeState:
    return rollup(d.state for d in deps)


def failure_reason(deps: Sequence[DepOutcome], first_error: str | None) -> str | None:
    """The first error among the deps, else the DAG's first error (a rolled-up group root has none)."""
    failed = [d for d in deps if d.state is NodeState.FAILED]
    if not failed:
        return None
    return next((d.error for d in failed if d.error), first_error)
