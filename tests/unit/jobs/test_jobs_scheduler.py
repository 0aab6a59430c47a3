"""The scheduler's step, by example: edges, tails, leases, slots, FIFO, cancel, groups and growth.

Pure: no loop, no clock. Each test drives `step` the way the scheduler task will, one event at a time.
"""

from __future__ import annotations

import pytest

from bc.errors import Conflict, NotFound, UsageError
from bc.jobs.model import DagSpec, Dep, DepWhen, JobStateError, NodeSpec, NodeState, failure_reason
from bc.jobs.scheduler import CancelDag, Decisions, Event, Finished, SetCapacity, Submit, World, live_view, step

ANY = DepWhen.AFTER_ANY


def n(id: str, *deps: str | Dep, **kw: object) -> NodeSpec:
    kind = str(kw.pop("kind", "Command"))
    return NodeSpec(id, kind, deps=tuple(d if isinstance(d, Dep) else Dep(d) for d in deps), **kw)  # type: ignore[arg-type]


class Run:
    """The world plus every decision so far, so a test reads like an operator's timeline."""

    def __init__(self, **capacities: int) -> None:
        self.world = World(capacities=dict(capacities))
        self.last = Decisions()

    def __call__(self, event: Event) -> Decisions:
        self.world, self.last = step(self.world, event)
        return self.last

    def submit(self, id: str, *nodes: NodeSpec, **kw: object) -> Decisions:
        return self(Submit(DagSpec(id, "t", nodes, **kw)))  # type: ignore[arg-type]

    def ok(self, dag: str, node: str, **kw: object) -> Decisions:
        return self(Finished(dag, node, True, **kw))  # type: ignore[arg-type]

    def fail(self, dag: str, node: str, error: str) -> Decisions:
        return self(Finished(dag, node, False, error))

    def states(self, dag: str) -> dict[str, NodeState]:
        return dict(self.world.dag(dag).states)


def claimed(d: Decisions) -> list[tuple[str, str]]:
    return [(c.dag, c.node) for c in d.claims]


def test_after_ok_runs_in_order() -> None:
    r = Run()
    assert claimed(r.submit("d1", n("a"), n("b", "a"), n("c", "b"))) == [("d1", "a")]
    assert claimed(r.ok("d1", "a")) == [("d1", "b")]
    assert claimed(r.ok("d1", "b")) == [("d1", "c")]
    assert r.ok("d1", "c").terminal == [("d1", NodeState.DONE)]
    assert r.world.dags == []


def test_after_ok_cancels_downstream() -> None:
    r = Run()
    r.submit("d1", n("a"), n("b", "a"), n("c", "b"), n("side"))
    d = r.fail("d1", "a", "drain deadline: 2 holds left")
    assert d.cancelled == [("d1", "b"), ("d1", "c")]
    assert d.terminal == []  # `side` is still running
    assert r.ok("d1", "side").terminal == [("d1", NodeState.FAILED)]


@pytest.mark.parametrize("how", ["ok", "fail", "cancel"])
def test_after_any_tail_runs_on_success_failure_and_cancel(how: str) -> None:
    r = Run()
    r.submit("d1", n("head"), n("work", "head"), n("resolve", Dep("head", ANY), Dep("work", ANY), tail=True))
    if how == "ok":
        r.ok("d1", "head")
        d = r.ok("d1", "work")
    elif how == "fail":
        d = r.fail("d1", "head", "boom")  # `work` is cancelled by its AfterOk edge
    else:
        d = r(CancelDag("d1"))
        assert d.cancel_answer is True and d.cancel_running == [("d1", "head")]
        d = r.fail("d1", "head", "cancelled by operator")  # the side effect reports its real outcome
    assert claimed(d) == [("d1", "resolve")]
    states = {o.node: o.state for o in d.claims[0].deps}
    assert states["work"] is (NodeState.DONE if how == "ok" else NodeState.CANCELLED)
    assert states["head"] is (NodeState.DONE if how == "ok" else NodeState.FAILED)
    assert r.ok("d1", "resolve").terminal


def test_cancel_before_start_spares_the_tail_and_runs_it() -> None:
    r = Run()
    r.submit("d0", n("x", subject="n1", lease=True))
    r.submit("d1", n("set", subject="n1", lease=True), n("resolve", Dep("set", ANY), tail=True))
    d = r(CancelDag("d1"))
    assert d.cancelled == [("d1", "set")]
    assert claimed(d) == [("d1", "resolve")]  # the approval never dangles
    assert d.cancel_answer is True
    assert r(CancelDag("d1")).cancel_answer is False  # nothing left to cancel: the tail is not cancellable
    assert r.ok("d1", "resolve").terminal == [("d1", NodeState.CANCELLED)]
    with pytest.raises(NotFound, match="no live DAG d1"):
        r(CancelDag("d1"))


def test_two_dags_never_interleave_on_a_subject() -> None:
    r = Run()
    r.submit("d1", n("cordon", subject="n1", lease=True), n("reboot", "cordon", subject="n1", lease=True))
    d = r.submit("d2", n("drain", subject="n1", lease=True))
    assert claimed(d) == []
    assert r.world.leases == {"n1": "d1"}
    assert claimed(r.ok("d1", "cordon")) == [("d1", "reboot")]  # d1 keeps the lease between its nodes
    d = r.ok("d1", "reboot")
    assert d.released_leases == [("n1", "d1")]
    assert claimed(d) == [("d2", "drain")] and d.claims[0].leases == ("n1",)


def test_a_younger_dag_waits_for_a_subject_an_older_one_will_need() -> None:
    # d1 does not hold n1 yet (its lease node waits on `head`), but it will: d2 must not slip in between.
    r = Run()
    r.submit("d1", n("head"), n("cordon", "head", subject="n1", lease=True))
    assert claimed(r.submit("d2", n("x", subject="n1", lease=True), n("y", subject="n2", lease=True))) == [("d2", "y")]
    assert claimed(r.ok("d1", "head")) == [("d1", "cordon")]


def test_slot_capacity() -> None:
    r = Run(reboots=2)
    d = r.submit("d1", *(n(f"r{i}", subject=f"n{i}", lease=True, pools=("reboots",)) for i in range(4)))
    assert claimed(d) == [("d1", "r0"), ("d1", "r1")]
    d = r.ok("d1", "r1")
    assert d.released_slots == [("reboots", ("d1", "r1"))]
    assert claimed(d) == [("d1", "r2")]
    d = r(SetCapacity("reboots", 3))
    assert claimed(d) == [("d1", "r3")]


def test_a_dag_local_pool_is_max_parallel() -> None:
    r = Run(reboots=10)
    nodes = [n(f"r{i}", subject=f"n{i}", lease=True, pools=("reboots", "max-parallel")) for i in range(3)]
    d = r.submit("d1", *nodes, local_pools={"max-parallel": 1})
    assert claimed(d) == [("d1", "r0")]
    assert d.claims[0].slots == ("reboots", "d1/max-parallel")
    assert claimed(r.fail("d1", "r0", "reboot timed out")) == [("d1", "r1")]


def test_fifo_among_competitors() -> None:
    r = Run(reboots=1)
    r.submit("d1", n("head"), n("a", "head", pools=("reboots",)))
    assert claimed(r.submit("d2", n("b", pools=("reboots",)))) == [("d2", "b")]  # d1 is not ready: no wait
    r.submit("d3", n("c", pools=("reboots",)))
    r.ok("d1", "head")  # now d1 and d3 both wait for the slot d2 holds
    assert claimed(r.ok("d2", "b")) == [("d1", "a")]
    assert claimed(r.ok("d1", "a")) == [("d3", "c")]


def test_a_cycle_is_refused_at_submit_and_nothing_is_stored() -> None:
    r = Run()
    with pytest.raises(UsageError, match="cycle: a → b → a"):
        r.submit("d1", n("a", "b"), n("b", "a"))
    assert r.world.dags == []


def test_unknown_pool_and_duplicate_dag_are_refused() -> None:
    r = Run()
    with pytest.raises(UsageError, match="slot pool reboots, which does not exist"):
        r.submit("d1", n("a", pools=("reboots",)))
    r.submit("d1", n("a"))
    with pytest.raises(Conflict, match="DAG d1 is already live"):
        r.submit("d1", n("a"))
    with pytest.raises(UsageError, match="at least 1"):
        r(SetCapacity("reboots", 0))
    with pytest.raises(UsageError, match="bad slot pool name"):
        r(SetCapacity("d1/max-parallel", 3))
    with pytest.raises(UsageError, match="bad slot pool"):
        r.submit("d2", n("a", pools=("d1/x",)))


def test_an_outcome_for_a_node_not_running_is_a_protocol_error_and_changes_nothing() -> None:
    r = Run()
    r.submit("d1", n("a"), n("b", "a"))
    before = r.states("d1")
    with pytest.raises(JobStateError, match="can't succeed in state queued"):
        r.ok("d1", "b")
    assert r.states("d1") == before


def test_rollup_of_the_terminal_dag() -> None:
    r = Run()
    r.submit("d1", n("a"), n("b", "a"))
    assert r.world.dag("d1").state() is NodeState.RUNNING
    r(CancelDag("d1"))
    assert r.world.dag("d1").state() is NodeState.RUNNING  # `a` runs on until it reports
    assert live_view(r.world) == {"d1": NodeState.RUNNING}
    assert r.ok("d1", "a").terminal == [("d1", NodeState.CANCELLED)]
    assert live_view(r.world) == {}


def reboot_group(i: int) -> list[NodeSpec]:
    """A per-node reboot subgraph under a group root that holds the `reboots` slot across it."""
    g = f"g{i}"
    return [
        n(g, kind="Group", pools=("reboots",)),
        n(f"cordon{i}", kind="SetWanted", subject=f"n{i}", lease=True, group=g),
        n(f"reboot{i}", f"cordon{i}", subject=f"n{i}", lease=True, group=g),
        n(f"reconcile{i}", Dep(f"reboot{i}", ANY), kind="Reconcile", subject=f"n{i}", lease=True, group=g),
    ]


def test_a_group_root_holds_its_slot_and_leases_across_its_group() -> None:
    r = Run(reboots=1)
    tail = n("resolve", Dep("g0", ANY), Dep("g1", ANY), kind="ResolveApproval", tail=True)
    d = r.submit("d1", *reboot_group(0), *reboot_group(1), tail)
    assert claimed(d) == [("d1", "g0")] and d.claims[0].leases == ("n0",)
    assert claimed(r.ok("d1", "g0")) == [("d1", "cordon0")]
    r.ok("d1", "cordon0")
    r.fail("d1", "reboot0", "reboot timed out")
    d = r.ok("d1", "reconcile0")  # the group settles: its slot goes to the next group
    assert d.released_slots == [("reboots", ("d1", "g0"))]
    assert claimed(d) == [("d1", "g1")]
    r.ok("d1", "g1")
    r.ok("d1", "cordon1")
    r.ok("d1", "reboot1")
    d = r.ok("d1", "reconcile1")
    assert claimed(d) == [("d1", "resolve")]
    # The tail sees g0 as its group's roll-up, with no error of its own: the reason falls back to the DAG's.
    outcomes = {o.node: o for o in d.claims[0].deps}
    assert outcomes["g0"].state is NodeState.FAILED and outcomes["g0"].error is None
    assert outcomes["g1"].state is NodeState.DONE
    assert failure_reason(d.claims[0].deps, d.claims[0].first_error) == "reboot timed out"


def test_a_failed_group_root_cancels_its_members() -> None:
    r = Run(reboots=1)
    r.submit("d1", *reboot_group(0))
    d = r.fail("d1", "g0", "no slot")
    assert d.cancelled == [("d1", "cordon0"), ("d1", "reboot0"), ("d1", "reconcile0")]
    assert d.terminal == [("d1", NodeState.FAILED)]


def test_stop_on_failure_cancels_every_node_not_yet_started() -> None:
    r = Run()
    nodes = [n(f"p{i}", subject=f"n{i}", lease=True, pools=("max-unavailable",)) for i in range(3)]
    emit = n("emit", *(Dep(f"p{i}", ANY) for i in range(3)), tail=True)
    d = r.submit("d1", *nodes, emit, local_pools={"max-unavailable": 2}, stop_on_failure=True)
    assert claimed(d) == [("d1", "p0"), ("d1", "p1")]
    d = r.fail("d1", "p0", "section host: UNSUPPORTED")
    assert d.cancelled == [("d1", "p2")]  # p1 had started: it reports its own outcome
    assert claimed(d) == []
    d = r.ok("d1", "p1")
    assert claimed(d) == [("d1", "emit")]
    assert r.ok("d1", "emit").terminal == [("d1", NodeState.FAILED)]


def test_stop_on_failure_in_a_chain() -> None:
    r = Run()
    r.submit("d1", n("a"), n("b"), n("c", Dep("a", ANY)), stop_on_failure=True)
    d = r.fail("d1", "a", "UNSUPPORTED")
    assert d.cancelled == [("d1", "c")]  # its AfterAny edge would have let it run; the rollout stops it


def test_a_node_grows_a_subgraph_into_its_own_dag() -> None:
    r = Run()
    r.submit("d1", n("pick"), subjects=frozenset({"n1", "n2"}))
    grown = (n("p1", "pick", subject="n1", lease=True), n("p2", "p1", subject="n2", lease=True))
    d = r.ok("d1", "pick", grow=grown)
    assert claimed(d) == [("d1", "p1")]
    assert claimed(r.ok("d1", "p1")) == [("d1", "p2")]


def test_growth_is_refused_onto_an_undeclared_subject_and_changes_nothing() -> None:
    r = Run()
    r.submit("d1", n("pick"))
    before = r.world
    with pytest.raises(UsageError, match="leases n9, which DAG d1 did not declare"):
        r.ok("d1", "pick", grow=(n("p", "pick", subject="n9", lease=True),))
    assert r.world is before and r.states("d1") == {"pick": NodeState.RUNNING}
    with pytest.raises(UsageError, match="cycle"):
        r.ok("d1", "pick", grow=(n("p", "pick", "q"), n("q", "p")))
    with pytest.raises(UsageError, match="a failed node grows nothing"):
        r(Finished("d1", "pick", False, "x", grow=(n("p", "pick"),)))


def test_a_grafted_member_re_enters_its_claimed_group() -> None:
    # The reference's deploy graft: nodes grown under a claimed root run in its slot, never wait for another.
    r = Run(reboots=1)
    r.submit("d1", n("g", kind="Group", pools=("reboots",)), n("plan", subject="n1", lease=True, group="g"))
    r.submit("d2", n("other", pools=("reboots",)))
    r.ok("d1", "g")
    d = r.ok("d1", "plan", grow=(n("apply", "plan", subject="n1", lease=True, group="g", pools=("reboots",)),))
    assert claimed(d) == [("d1", "apply")] and d.claims[0].slots == () and d.claims[0].leases == ()
    assert claimed(r.ok("d1", "apply")) == [("d2", "other")]


def test_a_graft_that_would_wait_inside_a_claimed_group_is_refused() -> None:
    r = Run()
    r.submit("d1", n("g", kind="Group"), n("plan", group="g"), subjects=frozenset({"n2"}))
    r.ok("d1", "g")
    with pytest.raises(Conflict, match="joins claimed group g but d1 holds no lease on n2"):
        r.ok("d1", "plan", grow=(n("apply", "plan", subject="n2", lease=True, group="g"),))


def test_a_graft_into_a_cancelled_dag_is_recorded_and_cancelled() -> None:
    # The node's success must land; what it planned is kept for `bc jobs show`, cancelled.
    r = Run()
    r.submit("d1", n("pick"), n("resolve", Dep("pick", ANY), tail=True))
    assert r(CancelDag("d1")).cancel_running == [("d1", "pick")]
    d = r.ok("d1", "pick", grow=(n("p1", "pick"),))
    assert d.cancelled == [("d1", "p1")]
    assert claimed(d) == [("d1", "resolve")]


def test_a_graft_cannot_make_a_tail_a_group_root() -> None:
    r = Run()
    r.submit("d1", n("pick"), n("later"), n("resolve", Dep("later", ANY), tail=True))
    with pytest.raises(UsageError, match="resolve, a tail node, which cannot root a group"):
        r.ok("d1", "pick", grow=(n("p1", group="resolve"),))


def test_a_cancel_leaves_running_nodes_running_until_they_report_and_a_waiting_one_reports_cancelled() -> None:
    spec = DagSpec(
        "d1",
        "t",
        (
            NodeSpec("wait", "Batch"),
            NodeSpec("after", "Command", deps=(Dep("wait"),)),
            NodeSpec("tail", "Emit", deps=(Dep("wait", DepWhen.AFTER_ANY), Dep("after", DepWhen.AFTER_ANY)), tail=True),
        ),
    )
    w, _ = step(World(), Submit(spec))
    w, out = step(w, CancelDag("d1"))
    assert out.cancel_running == [("d1", "wait")] and out.cancelled == [("d1", "after")]
    assert w.dag("d1").states["wait"] is NodeState.RUNNING  # the queue never moves a running node itself
    w, out = step(w, Finished("d1", "wait", ok=False, error="batch withdrawn", cancelled=True))
    assert [c.node for c in out.claims] == ["tail"]
    assert w.dag("d1").states["wait"] is NodeState.CANCELLED
    assert w.dag("d1").first_error is None  # a node that stopped on a cancel is no failure
    w, out = step(w, Finished("d1", "tail", ok=True))
    assert out.terminal == [("d1", NodeState.CANCELLED)]
