"""The job model: one node state table, the roll-up, the failure-reason fallback, and what submit refuses."""

from __future__ import annotations

import pytest

from bc.errors import UsageError
from bc.jobs.model import (
    TRANSITIONS,
    DagSpec,
    Dep,
    DepOutcome,
    DepWhen,
    JobStateError,
    NodeEvent,
    NodeSpec,
    NodeState,
    failure_reason,
    find_cycle,
    next_state,
    rollup,
    validate,
)

Q, R, D, F, C = (NodeState.QUEUED, NodeState.RUNNING, NodeState.DONE, NodeState.FAILED, NodeState.CANCELLED)


def test_the_table_is_the_only_way_to_move() -> None:
    assert TRANSITIONS == {
        (Q, NodeEvent.CLAIM): R,
        (Q, NodeEvent.CANCEL): C,
        (R, NodeEvent.SUCCEED): D,
        (R, NodeEvent.FAIL): F,
        (R, NodeEvent.CANCEL): C,  # only on the node's own report that it stopped before any effect
    }
    for state in NodeState:
        for event in NodeEvent:
            if (state, event) in TRANSITIONS:
                assert next_state(state, event) is TRANSITIONS[(state, event)]
                continue
            with pytest.raises(JobStateError, match=f"^can't {event.value} in state {state.value}$"):
                next_state(state, event)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([D, C, Q, R, F], F),
        ([D, C, Q, R], R),
        ([D, C, Q], Q),
        ([D, C], C),
        ([D, D], D),
        ([], D),
        ([F, D], F),  # a failure outranks everything, even work still running elsewhere
    ],
)
def test_rollup(states: list[NodeState], expected: NodeState) -> None:
    assert rollup(states) is expected


def test_failure_reason_is_the_deps_own_error_first() -> None:
    deps = [DepOutcome("a", D), DepOutcome("b", F, "gpu.reset failed: GPU-1 busy")]
    assert failure_reason(deps, "drain deadline: 2 holds left") == "gpu.reset failed: GPU-1 busy"


def test_failure_reason_falls_back_to_the_dags_first_error() -> None:
    # A group root that rolled up failed from a member carries no error of its own.
    deps = [DepOutcome("group", F, None)]
    assert failure_reason(deps, "drain deadline: 2 holds left") == "drain deadline: 2 holds left"


def test_no_failure_no_reason() -> None:
    assert failure_reason([DepOutcome("a", D), DepOutcome("b", C)], "older error") is None


def n(id: str, *deps: str | Dep, **kw: object) -> NodeSpec:
    return NodeSpec(id, "Command", deps=tuple(d if isinstance(d, Dep) else Dep(d) for d in deps), **kw)  # type: ignore[arg-type]


def test_a_cycle_is_refused_and_named() -> None:
    dag = DagSpec("d1", "t", (n("a"), n("b", "a", "d"), n("c", "b"), n("d", "c")))
    with pytest.raises(UsageError, match=r"^DAG d1 has a cycle: b → d → c → b$"):
        validate(dag)


def test_a_self_edge_is_a_cycle() -> None:
    with pytest.raises(UsageError, match="cycle: a → a"):
        validate(DagSpec("d1", "t", (n("a", "a"),)))


def test_find_cycle_on_a_dag_is_empty() -> None:
    assert find_cycle([n("a"), n("b", "a"), n("c", "a", "b")]) == []


@pytest.mark.parametrize(
    ("dag", "message"),
    [
        (DagSpec("d1", "t", ()), "DAG d1 has no nodes"),
        (DagSpec("d 1", "t", (n("a"),)), "bad DAG id"),
        (DagSpec("d1", "t", (n("a"), n("a"))), "node a appears twice"),
        (DagSpec("d1", "t", (n("a", "zz"),)), "depends on zz, which is not in DAG d1"),
        (DagSpec("d1", "t", (n("a", lease=True),)), "takes a lease but names no subject"),
        (DagSpec("d1", "t", (n("a"), n("t", "a", tail=True))), "must depend AfterAny"),
        (DagSpec("d1", "t", (n("a"), n("b", group="zz"))), "group zz, which is not in DAG d1"),
        (DagSpec("d1", "t", (n("a"), n("g"), n("b", "a", group="g"))), "depends on a outside it"),
        (DagSpec("d1", "t", (n("g"), n("b", group="g", pools=("reboots",)))), "pool reboots, which its group root"),
        (DagSpec("d1", "t", (n("a"),), local_pools={"max-parallel": 0}), "capacity of at least 1"),
        (DagSpec("d1", "t", (n("g"), n("t", group="g", tail=True))), "neither in a group nor a group root"),
    ],
)
def test_submit_refuses(dag: DagSpec, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        validate(dag)


def test_a_good_dag_passes() -> None:
    validate(
        DagSpec(
            "d1",
            "reboot",
            (
                n("g", pools=("reboots",)),
                n("cordon", group="g", subject="n1", lease=True),
                n("reboot", "cordon", group="g", subject="n1", lease=True, pools=("reboots",)),
                n("emit", Dep("g", DepWhen.AFTER_ANY), tail=True),
            ),
        )
    )
