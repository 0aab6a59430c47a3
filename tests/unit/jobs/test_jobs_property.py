"""A model check of the scheduler: random DAGs, random resources, random outcomes and cancels, driven to the end.

For up to 30 nodes over several DAGs sharing subjects, whatever the outcomes and whenever the cancels come:
every DAG settles terminal; no two DAGs ever hold one subject's lease at once; no slot pool is ever over
capacity; a claim only ever starts a node whose edges are satisfied; and every DAG's tail `ResolveApproval`
(the DAG's `Batch` head creates the approval) runs exactly once, after everything else in its DAG has settled.

The checks keep their own mirror of every node's state, built from the decisions alone, so they do not
trust the scheduler's bookkeeping (its lease map, its slot sets) to judge the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from bc.jobs.model import TERMINAL, DagSpec, Dep, DepWhen, NodeSpec, NodeState, in_group, rollup
from bc.jobs.scheduler import CancelDag, Decisions, Event, Finished, Submit, World, step

SUBJECTS = ("n0", "n1", "n2", "n3")
POOLS = ("reboots", "rollouts", "max-parallel")


@st.composite
def dag_specs(draw: st.DrawFn, dag_id: str, budget: int) -> DagSpec:
    """One DAG: a Batch head, plain nodes and groups with random edges and demands, a ResolveApproval tail."""
    nodes: list[NodeSpec] = [NodeSpec("batch", "Batch")]
    top: list[str] = ["batch"]  # nodes outside any group: what plain nodes may depend on
    for b in range(draw(st.integers(0, max(0, budget - 2)))):
        if len(nodes) >= budget - 1:
            break
        deps = tuple(
            Dep(t, draw(st.sampled_from(DepWhen)))
            for t in draw(st.lists(st.sampled_from(top), max_size=2, unique=True))
        )
        subject = draw(st.sampled_from(SUBJECTS))
        pools = tuple(draw(st.lists(st.sampled_from(POOLS), max_size=2, unique=True)))
        root = f"x{b}"
        if draw(st.booleans()):
            nodes.append(NodeSpec(root, "Command", subject, deps=deps, lease=draw(st.booleans()), pools=pools))
        else:
            nodes.append(NodeSpec(root, "Group", deps=deps, pools=pools))
            prev: str | None = None
            for m in range(draw(st.integers(1, 3))):
                if len(nodes) >= budget - 1:
                    break
                mid = f"{root}m{m}"
                mdeps = (Dep(prev, draw(st.sampled_from(DepWhen))),) if prev else ()
                sub = draw(st.sampled_from(SUBJECTS))
                # A `Pick` member grows more members into its group when it succeeds (a graft).
                kind = "Pick" if m == 0 and draw(st.booleans()) else "Command"
                nodes.append(NodeSpec(mid, kind, sub, deps=mdeps, lease=draw(st.booleans()), group=root))
                prev = mid
        top.append(root)
    tail = NodeSpec("resolve", "ResolveApproval", deps=tuple(Dep(t, DepWhen.AFTER_ANY) for t in top), tail=True)
    return DagSpec(
        dag_id,
        "model",
        (*nodes, tail),
        local_pools={"max-parallel": draw(st.integers(1, 2))},
        stop_on_failure=draw(st.booleans()),
    )


@st.composite
def workloads(draw: st.DrawFn) -> tuple[dict[str, int], list[DagSpec]]:
    capacities = {"reboots": draw(st.integers(1, 2)), "rollouts": draw(st.integers(1, 3))}
    dags: list[DagSpec] = []
    left = 30
    for i in range(draw(st.integers(1, 4))):
        if left < 3:
            break
        spec = draw(dag_specs(f"d{i}", min(left, 12)))
        left -= len(spec.nodes)
        dags.append(spec)
    return capacities, dags


@dataclass
class Mirror:
    """The checker's own view, from decisions only."""

    specs: dict[str, DagSpec]
    capacities: dict[str, int]
    states: dict[str, dict[str, NodeState]] = field(default_factory=dict)
    lease_holders: dict[str, set[str]] = field(default_factory=dict)  # subject -> DAGs that ran a lease node on it
    terminal: dict[str, NodeState] = field(default_factory=dict)
    approvals_created: set[str] = field(default_factory=set)
    approvals_resolved: list[str] = field(default_factory=list)

    def members(self, dag: str, root: str) -> list[str]:
        by_id = {n.id: n for n in self.specs[dag].nodes}
        return [m for m in by_id if in_group(m, root, by_id)]

    def settled(self, dag: str, target: str, dependent: str) -> NodeState | None:
        by_id = {n.id: n for n in self.specs[dag].nodes}
        group = [target] if in_group(dependent, target, by_id) else self.members(dag, target)
        states = [self.states[dag][m] for m in group]
        return rollup(states) if all(s in TERMINAL for s in states) else None

    def apply(self, d: Decisions) -> None:
        for dag, node in d.cancelled:
            assert self.states[dag][node] is NodeState.QUEUED
            self.states[dag][node] = NodeState.CANCELLED
        for dag, state in d.terminal:  # the step settles DAGs (and frees their leases) before it claims
            assert dag not in self.terminal, "a DAG settles once"
            assert all(s in TERMINAL for s in self.states[dag].values())
            assert state is rollup(self.states[dag].values())
            self.terminal[dag] = state
        for c in d.claims:
            self.claim(c.dag, c.node)
        self.check_slots()

    def claim(self, dag: str, node: str) -> None:
        spec = {n.id: n for n in self.specs[dag].nodes}[node]
        assert self.states[dag][node] is NodeState.QUEUED
        edges = [(x.node, x.when) for x in spec.deps] + ([(spec.group, DepWhen.AFTER_OK)] if spec.group else [])
        for target, when in edges:
            s = self.settled(dag, target, node)
            assert s is not None and (when is DepWhen.AFTER_ANY or s is NodeState.DONE), (dag, node, target)
        self.states[dag][node] = NodeState.RUNNING
        for m in self.members(dag, node):
            ms = {n.id: n for n in self.specs[dag].nodes}[m]
            if ms.lease and ms.subject is not None:
                others = self.lease_holders.setdefault(ms.subject, set()) - {dag}
                assert not (others - set(self.terminal)), f"{dag} and {others} both hold {ms.subject}"
                self.lease_holders[ms.subject].add(dag)
        if spec.kind == "Batch":
            self.approvals_created.add(dag)
        if spec.kind == "ResolveApproval":
            assert all(s in TERMINAL for n, s in self.states[dag].items() if n != node)
            self.approvals_resolved.append(dag)

    def check_slots(self) -> None:
        used: dict[str, int] = {}
        for dag in self.states:
            spec = self.specs[dag]
            for n in spec.nodes:
                if n.group is not None or self.states[dag][n.id] in (NodeState.QUEUED, NodeState.CANCELLED):
                    continue
                if all(self.states[dag][m] in TERMINAL for m in self.members(dag, n.id)):
                    continue
                for p in n.pools:
                    key = f"{dag}/{p}" if p in spec.local_pools else p
                    used[key] = used.get(key, 0) + 1
        for key, count in used.items():
            dag, _, pool = key.rpartition("/")
            cap = self.specs[dag].local_pools[pool] if dag else self.capacities[pool]
            assert count <= cap, f"pool {key} holds {count} > {cap}"


def grafts(data: st.DataObject, spec: DagSpec, node: str) -> tuple[NodeSpec, ...]:
    """What a succeeding `Pick` grows: a chain of members in its group, on its subject, inside the root's pools."""
    pick = {n.id: n for n in spec.nodes}[node]
    if pick.kind != "Pick" or pick.group is None:
        return ()
    root = {n.id: n for n in spec.nodes}[pick.group]
    out: list[NodeSpec] = []
    prev = node
    for i in range(data.draw(st.integers(0, 2))):
        pools = tuple(data.draw(st.lists(st.sampled_from(root.pools), unique=True))) if root.pools else ()
        gid = f"{node}g{i}"
        out.append(
            NodeSpec(gid, "Command", pick.subject, deps=(Dep(prev),), lease=pick.lease, pools=pools, group=root.id)
        )
        prev = gid
    return tuple(out)


@settings(max_examples=150, deadline=None)
@given(work=workloads(), data=st.data())
def test_every_dag_settles_without_overlap(work: tuple[dict[str, int], list[DagSpec]], data: st.DataObject) -> None:
    capacities, specs = work
    mirror = Mirror({s.id: s for s in specs}, capacities)
    world = World(capacities=dict(capacities))
    to_submit = list(specs)
    cancel_often = data.draw(st.booleans())

    def run(event: Event) -> None:
        nonlocal world
        world, decisions = step(world, event)
        mirror.apply(decisions)

    if data.draw(st.booleans()):  # all at once: the most contention; else submits interleave with outcomes
        for spec in to_submit:
            mirror.states[spec.id] = {n.id: NodeState.QUEUED for n in spec.nodes}
            run(Submit(spec))
        to_submit = []

    for _ in range(400):
        running = [(d, n) for d, states in mirror.states.items() for n, s in states.items() if s is NodeState.RUNNING]
        if not running and not to_submit:
            # Nothing runs and nothing is left to submit: every DAG must have settled. (A cancel here
            # would unstick a deadlock and hide it, so the driver never cancels its way out.)
            assert world.dags == [], f"stuck: {[(d.spec.id, d.states) for d in world.dags]}"
            break
        # Cancels are rare (and absent from half the runs): each one can end a wait the checks must see.
        cancels = ["cancel"] * (cancel_often and bool(world.dags))
        choices = ["finish"] * 4 * bool(running) + ["submit"] * bool(to_submit) + cancels
        what = data.draw(st.sampled_from(choices))
        if what == "submit":
            spec = to_submit.pop(0)
            mirror.states[spec.id] = {n.id: NodeState.QUEUED for n in spec.nodes}
            run(Submit(spec))
        elif what == "cancel":
            run(CancelDag(data.draw(st.sampled_from([d.spec.id for d in world.dags]))))
        else:
            dag, node = data.draw(st.sampled_from(running))
            ok = data.draw(st.integers(0, 3)) > 0  # mostly ok, so long chains get far enough to contend
            mirror.states[dag][node] = NodeState.DONE if ok else NodeState.FAILED
            grow = grafts(data, mirror.specs[dag], node) if ok else ()
            mirror.specs[dag] = replace(mirror.specs[dag], nodes=mirror.specs[dag].nodes + grow)
            mirror.states[dag] |= {g.id: NodeState.QUEUED for g in grow}
            run(Finished(dag, node, ok, None if ok else f"{node} failed", grow=grow))
    assert not to_submit and world.dags == [], "a DAG is stuck: nothing runs and it never settles"
    assert set(mirror.terminal) == {s.id for s in specs}
    assert sorted(mirror.approvals_resolved) == sorted(s.id for s in specs)  # each exactly once
    assert mirror.approvals_created <= set(mirror.approvals_resolved)
    assert world.leases == {} and all(not h for h in world.slots.values())
