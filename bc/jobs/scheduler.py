"""The scheduler as one pure step: the live DAGs and the resources held, plus one event, in; decisions out.

Theory of operation
-------------------
`step(world, event)` never mutates `world`: it returns the next world and the
`Decisions` the caller must carry out (and, later, persist in the same
transaction): nodes claimed with the resources they took and their deps'
outcomes, nodes cancelled, running nodes whose command should be asked to
cancel, resources released, DAGs that became terminal. The persisted
scheduler task will load the world, call `step` and write the result; the
simulator and the property tests drive it directly. Events: `Submit`,
`Finished` (a node's outcome, optionally growing a subgraph on success),
`CancelDag`, `SetCapacity`, and `None` (re-evaluate only).

A node is ready when it is queued, every edge is satisfied (`AfterOk`: the dep
is done; `AfterAny`: the dep is terminal; a dep on a group root from outside
its group is the group's roll-up) and its resources are free:

* the subject lease, taken by a lease node (or, for a whole group, by its
  root) and held by the DAG until the DAG is terminal, so two DAGs never
  interleave on a fleet node. A lease goes to the *oldest* live DAG that may
  want it (`DagSpec.lease_subjects`, fixed at submit): a younger DAG never
  takes a subject an older one will need, so every lease wait points from a
  younger DAG to an older one and lease waits cannot form a cycle;
* slot pools: global (`World.capacities`, `bc jobs slots`) or DAG-local
  (`DagSpec.local_pools`, `--max-parallel N`); a plain node holds one slot of
  each of its pools for its run, a group root across its group.

A node takes all of its resources at once or none, a claimed group needs
nothing more (its members re-enter the root's slots and leases), and running
nodes end by themselves, so the oldest live DAG always progresses: every DAG
settles. Among ready nodes competing for a resource, DAG-submit order wins
(FIFO): the claim pass walks the DAGs in submit order.

Cancel (`CancelDag`) cancels the DAG's queued nodes except tails, asks its
running non-tail nodes to cancel (they still report their real outcome), and
answers whether it did anything. Spared tails run once their `AfterAny` deps
settle, so an approval never dangles. With `stop_on_failure` (a rollout), a
failed node cancels every queued non-tail node of its DAG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from bc.errors import Conflict, NotFound, UsageError
from bc.jobs.model import (
    POOL_NAME,
    TERMINAL,
    DagSpec,
    DepOutcome,
    DepWhen,
    NodeEvent,
    NodeSpec,
    NodeState,
    ancestors,
    check_nodes,
    in_group,
    next_state,
    rollup,
    validate,
)

Ref = tuple[str, str]
"""(dag id, node id)."""


@dataclass
class DagRun:
    """One live DAG: its spec (grown nodes included) and each node's state and error."""

    spec: DagSpec
    states: dict[str, NodeState]
    errors: dict[str, str] = field(default_factory=dict)
    first_error: str | None = None
    cancel_requested: bool = False

    @classmethod
    def submitted(cls, spec: DagSpec) -> DagRun:
        return cls(spec, dict.fromkeys((n.id for n in spec.nodes), NodeState.QUEUED))

    def copy(self) -> DagRun:
        return replace(self, states=dict(self.states), errors=dict(self.errors))

    _index: tuple[DagSpec, dict[str, NodeSpec], dict[str, list[str]]] | None = field(
        default=None, repr=False, compare=False
    )

    def _indexed(self) -> tuple[dict[str, NodeSpec], dict[str, list[str]]]:
        """Nodes by id and each group's members, built once per spec (a graft replaces the spec)."""
        if self._index is None or self._index[0] is not self.spec:
            by_id = {n.id: n for n in self.spec.nodes}
            members: dict[str, list[str]] = {n: [] for n in by_id}
            for n in by_id:
                for g in [n, *ancestors(n, by_id)]:
                    members[g].append(n)
            self._index = (self.spec, by_id, members)
        return self._index[1], self._index[2]

    @property
    def nodes(self) -> dict[str, NodeSpec]:
        return self._indexed()[0]

    def members(self, root: str) -> list[str]:
        """The group `root` roots (itself included, in node order); just [root] for a node that roots nothing."""
        return self._indexed()[1][root]

    _wants: tuple[DagSpec, frozenset[str]] | None = field(default=None, repr=False, compare=False)

    def wants(self) -> frozenset[str]:
        """`spec.lease_subjects()`, once per spec."""
        if self._wants is None or self._wants[0] is not self.spec:
            self._wants = (self.spec, self.spec.lease_subjects())
        return self._wants[1]

    def stopped(self) -> bool:
        """Cancelled, or a stop-on-failure DAG with a failure: nothing new starts but tails."""
        failed = any(s is NodeState.FAILED for s in self.states.values())
        return self.cancel_requested or (self.spec.stop_on_failure and failed)

    def is_terminal(self) -> bool:
        return all(s in TERMINAL for s in self.states.values())

    def state(self) -> NodeState:
        return rollup(self.states.values())


@dataclass
class World:
    """Everything the scheduler decides over: live DAGs in submit order and the resources held."""

    dags: list[DagRun] = field(default_factory=list)
    capacities: dict[str, int] = field(default_factory=dict)
    leases: dict[str, str] = field(default_factory=dict)  # subject -> dag id
    slots: dict[str, set[Ref]] = field(default_factory=dict)  # pool key -> holders
    _by_id: dict[str, int] | None = field(default=None, repr=False, compare=False)
    _owned: set[int] | None = field(default=None, repr=False, compare=False)  # DagRuns this step copied

    def copy(self) -> World:
        return World(
            [d.copy() for d in self.dags],
            dict(self.capacities),
            dict(self.leases),
            {k: set(v) for k, v in self.slots.items()},
        )

    def cow(self) -> World:
        """A copy that shares every DagRun until `mutable` copies it (what a step changes is a few DAGs)."""
        return World(
            list(self.dags),
            dict(self.capacities),
            dict(self.leases),
            {k: set(v) for k, v in self.slots.items()},
            _owned=set(),
        )

    def _index(self) -> dict[str, int]:
        if self._by_id is None or len(self._by_id) != len(self.dags):
            self._by_id = {d.spec.id: i for i, d in enumerate(self.dags)}
        return self._by_id

    def has(self, dag_id: str) -> bool:
        return dag_id in self._index()

    def dag(self, dag_id: str) -> DagRun:
        i = self._index().get(dag_id)
        if i is None or self.dags[i].spec.id != dag_id:
            raise NotFound(f"no live DAG {dag_id}")
        return self.dags[i]

    def mutable(self, dag_id: str) -> DagRun:
        """The DAG, copied first when this (copy-on-write) world still shares it with the one it came from."""
        i = self._index()[dag_id]
        return self._own(i)

    def _own(self, i: int) -> DagRun:
        d = self.dags[i]
        if self._owned is not None and id(d) not in self._owned:
            d = d.copy()
            self.dags[i] = d
            self._owned.add(id(d))
        return d

    def append(self, run: DagRun) -> None:
        self.dags.append(run)
        if self._owned is not None:
            self._owned.add(id(run))
        self._by_id = None

    def remove(self, dag_ids: set[str]) -> None:
        self.dags = [d for d in self.dags if d.spec.id not in dag_ids]
        self._by_id = None


def pool_key(dag_id: str, pool: str, spec: DagSpec) -> str:
    """A DAG-local pool is keyed under its DAG (ids and pool names hold no '/')."""
    return f"{dag_id}/{pool}" if pool in spec.local_pools else pool


# -- events --------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    spec: DagSpec


@dataclass(frozen=True)
class Finished:
    """A running node's outcome; on success it may grow a subgraph into its own DAG."""

    dag: str
    node: str
    ok: bool
    error: str | None = None
    grow: tuple[NodeSpec, ...] = ()
    cancelled: bool = False  # the node stopped on a cancel before any effect (ok is False)


@dataclass(frozen=True)
class CancelDag:
    dag: str


@dataclass(frozen=True)
class SetCapacity:
    pool: str
    capacity: int


Event = Submit | Finished | CancelDag | SetCapacity | None


# -- decisions -------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A node that starts now, the resources it newly took, and how its deps ended."""

    dag: str
    node: str
    kind: str
    subject: str | None
    leases: tuple[str, ...]
    slots: tuple[str, ...]
    deps: tuple[DepOutcome, ...]
    first_error: str | None  # the DAG's, for `model.failure_reason`


@dataclass
class Decisions:
    claims: list[Claim] = field(default_factory=list)
    cancelled: list[Ref] = field(default_factory=list)
    cancel_running: list[Ref] = field(default_factory=list)
    released_slots: list[tuple[str, Ref]] = field(default_factory=list)
    released_leases: list[tuple[str, str]] = field(default_factory=list)  # (subject, dag id)
    terminal: list[tuple[str, NodeState]] = field(default_factory=list)  # (dag id, roll-up)
    cancel_answer: bool | None = None  # set by CancelDag: did it cancel or ask anything


def step(world: World, event: Event) -> tuple[World, Decisions]:
    """Apply one event and schedule; `world` is left as it was (also when this raises)."""
    return step_all(world, [event])


def step_all(world: World, events: Sequence[Event]) -> tuple[World, Decisions]:
    """Apply events in order, then schedule once: what a persisted step does with the outcomes of the
    nodes it started (many trivial nodes settle in one step instead of one step each).

    Only the DAGs an event touched can have a node newly ready, unless a resource came free (a slot or
    lease released, a DAG ended so its wants are gone, a capacity set): then every DAG is looked at."""
    w = world.cow()
    out = Decisions()
    touched: dict[str, None] = {}
    everything = False
    for event in events:
        _apply(w, event, out)
        if isinstance(event, Submit):
            touched[event.spec.id] = None
        elif isinstance(event, (Finished, CancelDag)):
            touched[event.dag] = None
        else:
            everything = True
    for dag_id in touched:
        if w.has(dag_id):
            _propagate(w.mutable(dag_id), out)
    _release(w, out)
    everything = everything or bool(out.released_slots or out.released_leases or out.terminal)
    _claim(w, out, None if everything else set(touched))
    w._owned = None
    return w, out


def _apply(w: World, event: Event, out: Decisions) -> None:
    if isinstance(event, Submit):
        _submit(w, event.spec)
    elif isinstance(event, Finished):
        _finished(w, event, out)
    elif isinstance(event, CancelDag):
        _cancel(w, event.dag, out)
    elif isinstance(event, SetCapacity):
        if not POOL_NAME.fullmatch(event.pool):
            raise UsageError(f"bad slot pool name {event.pool!r}")
        if event.capacity < 1:
            raise UsageError(f"slot pool {event.pool} needs a capacity of at least 1")
        w.capacities[event.pool] = event.capacity


def _submit(w: World, spec: DagSpec) -> None:
    validate(spec)
    if w.has(spec.id):
        raise Conflict(f"DAG {spec.id} is already live")
    _check_pools(w, spec, spec.nodes)
    w.append(DagRun.submitted(spec))


def _check_pools(w: World, spec: DagSpec, nodes: Sequence[NodeSpec]) -> None:
    for n in nodes:
        for p in n.pools:
            if p not in spec.local_pools and p not in w.capacities:
                raise UsageError(f"node {n.id} names slot pool {p}, which does not exist")


def _finished(w: World, ev: Finished, out: Decisions) -> None:
    w.dag(ev.dag)  # NotFound
    d = w.mutable(ev.dag)
    if ev.node not in d.states:
        raise NotFound(f"DAG {ev.dag} has no node {ev.node}")
    event = NodeEvent.SUCCEED if ev.ok else NodeEvent.CANCEL if ev.cancelled else NodeEvent.FAIL
    state = next_state(d.states[ev.node], event)
    if ev.grow:
        if not ev.ok:
            raise UsageError(f"node {ev.node} failed: a failed node grows nothing")
        # Grown while the node still runs: its group has not settled, so the graft may join it.
        _grow(w, d, ev.grow, out)
    d.states[ev.node] = state
    if state is NodeState.FAILED:
        if ev.error:
            d.errors[ev.node] = ev.error
            d.first_error = d.first_error or ev.error
        if d.spec.stop_on_failure:
            _cancel_queued(d, out)


def _grow(w: World, d: DagRun, new: tuple[NodeSpec, ...], out: Decisions) -> None:
    check_nodes(new, d.spec.nodes, d.spec)
    _check_pools(w, d.spec, new)
    for n in new:
        if n.group is None or n.group not in d.states:
            continue  # ungrouped, or in a group that is itself new: it claims like any other
        if all(d.states[m] in TERMINAL for m in d.members(n.group)):
            raise Conflict(f"node {n.id} joins group {n.group}, which has settled")
        claimed = d.states[n.group] is not NodeState.QUEUED
        if claimed and n.lease and w.leases.get(n.subject or "") != d.spec.id:
            # A claimed group must never wait for a lease: that is the one wait that could deadlock.
            raise Conflict(f"node {n.id} joins claimed group {n.group} but {d.spec.id} holds no lease on {n.subject}")
    d.spec = replace(d.spec, nodes=d.spec.nodes + new)
    d.states.update(dict.fromkeys((n.id for n in new), NodeState.QUEUED))
    if d.stopped():
        # The node's outcome must land, so the graft is not refused: a cancelled (or stopped) DAG
        # records it and cancels it at once, and `bc jobs show` still shows what was planned.
        _cancel_queued(d, out, only={n.id for n in new})


def _cancel(w: World, dag_id: str, out: Decisions) -> None:
    w.dag(dag_id)  # NotFound
    d = w.mutable(dag_id)
    before = len(out.cancelled)
    d.cancel_requested = True
    _cancel_queued(d, out)
    running = [n.id for n in d.spec.nodes if not n.tail and d.states[n.id] is NodeState.RUNNING]
    out.cancel_running += [(dag_id, n) for n in running]
    out.cancel_answer = len(out.cancelled) > before or bool(running)


def _cancel_queued(d: DagRun, out: Decisions, only: set[str] | None = None) -> None:
    for n in d.spec.nodes:
        if only is not None and n.id not in only:
            continue
        if not n.tail and d.states[n.id] is NodeState.QUEUED:
            d.states[n.id] = next_state(NodeState.QUEUED, NodeEvent.CANCEL)
            out.cancelled.append((d.spec.id, n.id))


# -- readiness -------------------------------------------------------------------


def outcome(d: DagRun, target: str, dependent: str) -> DepOutcome | None:
    """How `target` ended as `dependent` sees it, or None while it has not settled.

    From outside its group a group root is its group's roll-up; a member sees its root's own state.
    """
    by_id = d.nodes
    group = [target] if in_group(dependent, target, by_id) else d.members(target)
    states = [d.states[m] for m in group]
    if any(s not in TERMINAL for s in states):
        return None
    return DepOutcome(target, rollup(states), d.errors.get(target))


def _edges(n: NodeSpec) -> list[tuple[str, DepWhen]]:
    return [(x.node, x.when) for x in n.deps] + ([(n.group, DepWhen.AFTER_OK)] if n.group is not None else [])


def _propagate(d: DagRun, out: Decisions) -> None:
    """AfterOk: a failed or cancelled dep cancels the dependent, and on downstream until nothing moves."""
    moved = True
    while moved:
        moved = False
        for n in d.spec.nodes:
            if d.states[n.id] is not NodeState.QUEUED:
                continue
            for target, when in _edges(n):
                o = outcome(d, target, n.id)
                if when is DepWhen.AFTER_OK and o is not None and o.state is not NodeState.DONE:
                    d.states[n.id] = next_state(NodeState.QUEUED, NodeEvent.CANCEL)
                    out.cancelled.append((d.spec.id, n.id))
                    moved = True
                    break


def _deps_ready(d: DagRun, n: NodeSpec) -> bool:
    for target, when in _edges(n):
        o = outcome(d, target, n.id)
        if o is None or (when is DepWhen.AFTER_OK and o.state is not NodeState.DONE):
            return False
    return True


# -- resources -------------------------------------------------------------------


def _release(w: World, out: Decisions) -> None:
    live = {d.spec.id: d for d in w.dags}
    for key, holders in w.slots.items():
        for ref in sorted(holders):
            d = live[ref[0]]
            if all(d.states[m] in TERMINAL for m in d.members(ref[1])):
                holders.discard(ref)
                out.released_slots.append((key, ref))
    ended = [d for d in w.dags if (w._owned is None or id(d) in w._owned) and d.is_terminal()]
    for d in ended:
        for subject in sorted(s for s, holder in w.leases.items() if holder == d.spec.id):
            del w.leases[subject]
            out.released_leases.append((subject, d.spec.id))
        for key in [k for k in w.slots if k.startswith(f"{d.spec.id}/")]:
            del w.slots[key]
        out.terminal.append((d.spec.id, d.state()))
    if ended:
        w.remove({d.spec.id for d in ended})


def _capacity(w: World, d: DagRun, pool: str) -> int:
    return d.spec.local_pools.get(pool, w.capacities.get(pool, 0))


def _claim(w: World, out: Decisions, only: set[str] | None) -> None:
    """The claim pass in submit order; `only`: the DAGs that may have a node newly ready (None: all)."""
    older_wants: set[str] = set()  # grown DAG by DAG: the subjects every older live DAG may want
    for i, d in enumerate(w.dags):
        if only is None or d.spec.id in only:
            _claim_in(w, i, older_wants, out)
        older_wants |= d.wants()


def _claim_in(w: World, i: int, older_wants: set[str], out: Decisions) -> None:
    """One DAG's part of the claim pass, in node order (the DAG is copied at its first claim)."""
    d = w.dags[i]
    by_id = d.nodes
    for n in d.spec.nodes:
        if d.states[n.id] is not NodeState.QUEUED or not _deps_ready(d, n):
            continue
        group = [by_id[m] for m in d.members(n.id)]
        wanted = {m.subject for m in group if m.lease and m.subject is not None}
        leases = sorted(s for s in wanted if w.leases.get(s) != d.spec.id)
        if any(s in w.leases or s in older_wants for s in leases):
            continue
        # A group member re-enters its root's slots; validation keeps its pools inside the root's.
        pools = n.pools if n.group is None else ()
        if any(len(w.slots.get(pool_key(d.spec.id, p, d.spec), ())) >= _capacity(w, d, p) for p in pools):
            continue
        keys = tuple(pool_key(d.spec.id, p, d.spec) for p in pools)
        for s in leases:
            w.leases[s] = d.spec.id
        for k in keys:
            w.slots.setdefault(k, set()).add((d.spec.id, n.id))
        d = w._own(i)
        d.states[n.id] = next_state(NodeState.QUEUED, NodeEvent.CLAIM)
        deps = tuple(o for x in n.deps if (o := outcome(d, x.node, n.id)) is not None)
        out.claims.append(Claim(d.spec.id, n.id, n.kind, n.subject, tuple(leases), keys, deps, d.first_error))


def live_view(w: World) -> Mapping[str, NodeState]:
    """Each live DAG's roll-up, in submit order (what `bc jobs list` will show)."""
    return {d.spec.id: d.state() for d in w.dags}
