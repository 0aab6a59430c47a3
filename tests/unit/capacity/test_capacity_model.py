"""A model check of the capacity core: random reserve / release / time / node-down / node-up / crash sequences
over a small fleet, with I1, I5, I7 and I8 checked after every step (each step ends with a quiet pass).

The checkers are the ones in `bc.control.capacity.invariants`, written apart from the planner (I7 is a brute-force
search), and the lab (`model.py`) carries plans out the way the store wiring must. A second property pins
backfill down directly: what the pass decides for the first k reservations never depends on the ones
submitted after them, so a later reservation can never delay an earlier one.
"""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from bc.control.capacity.placement_plan import (
    CAP_KUBERNETES,
    CAP_LIMITS,
    Booking,
    HostResources,
    NodeInfo,
    Placement,
    Request,
    Wait,
    plan,
)
from tests.unit.capacity.fleet import H, M, booking, node
from tests.unit.capacity.model import Lab

T0 = 1_800_000_000_000
NODE_IDS = ("n0", "n1", "n2")


@st.composite
def fleets(draw: st.DrawFn) -> list[NodeInfo]:
    out = []
    for nid in NODE_IDS:
        gpus = draw(st.integers(1, 4))
        out.append(
            node(
                nid,
                gpus,
                numa=draw(st.sampled_from([1, 2])) if gpus > 1 else 1,
                cpus=draw(st.sampled_from([8, 16, 32])),
                unhealthy=draw(st.lists(st.integers(0, gpus - 1), max_size=1)),
                slots=draw(st.sampled_from([0, 0, 2])),
                mig=draw(st.lists(st.integers(0, gpus - 1), max_size=1)),
                caps=frozenset(draw(st.lists(st.sampled_from([CAP_LIMITS, CAP_KUBERNETES]), unique=True))),
                labels={"pool": draw(st.sampled_from(["a", "b"]))},
            )
        )
    return out


@st.composite
def requests(draw: st.DrawFn, rid: str, now: int) -> dict[str, object]:
    kw: dict[str, object] = {"count": draw(st.integers(1, 5))}
    if draw(st.integers(0, 3)) == 0:  # parts of GPUs: conflicts are parent-aware
        kw["device_class"] = draw(st.sampled_from(["gpu.slot", "gpu.mig"]))
    if draw(st.integers(0, 4)) == 0:
        kw["node_id"] = draw(st.sampled_from(NODE_IDS))
    if draw(st.integers(0, 4)) == 0:
        kw["selector"] = {"pool": draw(st.sampled_from(["a", "b"]))}
    shape = draw(st.sampled_from(["open", "duration", "window", "until"]))
    if shape == "duration":
        kw["duration_ms"] = draw(st.integers(1, 8)) * 30 * M
    elif shape == "window":
        kw["start_ms"] = now + draw(st.integers(-2, 12)) * 30 * M
        kw["duration_ms"] = draw(st.integers(1, 8)) * 30 * M
    elif shape == "until":
        kw["end_ms"] = now + draw(st.integers(1, 12)) * 30 * M
    if draw(st.integers(0, 3)) == 0:
        kw["host"] = HostResources(cpus=draw(st.sampled_from([2, 8, 20])))
    if draw(st.integers(0, 5)) == 0:
        kw["binding"] = "kubernetes"
    return kw


@settings(max_examples=120, deadline=None)
@given(fleet=fleets(), data=st.data())
def test_invariants_hold_after_every_step(fleet: list[NodeInfo], data: st.DataObject) -> None:
    lab = Lab({n.node_id: n for n in fleet}, T0)
    lab.step()
    for i in range(data.draw(st.integers(5, 40))):
        booked = sorted([*lab.live, *lab.pending])
        what = data.draw(
            st.sampled_from(["reserve"] * 4 + ["release"] * bool(booked) + ["advance"] * 3 + ["down", "up", "crash"])
        )
        if what == "reserve":
            lab.reserve(f"r{i:02}", **data.draw(requests(f"r{i:02}", lab.now)))
        elif what == "release":
            lab.release(data.draw(st.sampled_from(booked)))
        elif what == "advance":
            lab.advance(data.draw(st.sampled_from([1, 7 * M, 30 * M, H, 150 * M])))
        elif what == "down":
            facts = data.draw(
                st.sampled_from([{"connectivity": "disconnected"}, {"connectivity": "unreachable"}, {"cordoned": True}])
            )
            lab.set_node(data.draw(st.sampled_from(NODE_IDS)), **facts)
        elif what == "up":
            lab.set_node(data.draw(st.sampled_from(NODE_IDS)), connectivity="connected", cordoned=False)
        else:
            lab.crash(lose_flushes=data.draw(st.booleans()))
        assert lab.violations() == [], f"after {what} at step {i}"
        for o in lab.last.outcomes if lab.last else ():  # what the runs reach, for --hypothesis-show-statistics
            event(type(o).__name__ + ("" if not isinstance(o, Wait) else " bounded" if o.held else " unbounded"))
    event(f"windows flushed: {min(len(lab.windows), 5)}+")


@settings(max_examples=150, deadline=None)
@given(fleet=fleets(), data=st.data())
def test_no_later_reservation_changes_what_an_earlier_one_gets(fleet: list[NodeInfo], data: st.DataObject) -> None:
    held = [
        booking(f"x{i}", nid, [0], T0 + data.draw(st.integers(-2, 2)) * H, data.draw(st.sampled_from([None, T0 + H])))
        for i, nid in enumerate(data.draw(st.lists(st.sampled_from(NODE_IDS), max_size=2, unique=True)))
    ]
    reqs = [Request(f"r{i}", seq=i, **data.draw(requests(f"r{i}", T0))) for i in range(data.draw(st.integers(1, 8)))]  # type: ignore[arg-type]
    full = plan(fleet, held, reqs, T0)
    for k in range(1, len(reqs)):
        assert plan(fleet, held, reqs[:k], T0).outcomes == full.outcomes[:k]


@settings(max_examples=150, deadline=None)
@given(fleet=fleets(), data=st.data())
def test_a_pass_decides_each_reservation_as_if_it_were_alone_behind_the_ones_before(
    fleet: list[NodeInfo], data: st.DataObject
) -> None:
    """What the pass remembers between reservations (shapes that fit nowhere, starts already searched) changes no
    decision: each outcome equals a pass over that reservation alone, given what the ones before it booked or hold."""
    shapes = [data.draw(requests("shape", T0)) for _ in range(data.draw(st.integers(1, 3)))]
    reqs = [Request(f"r{i}", seq=i, **data.draw(st.sampled_from(shapes))) for i in range(data.draw(st.integers(1, 10)))]  # type: ignore[arg-type]
    full = plan(fleet, [], reqs, T0)
    before: list[Booking] = []
    for r, out in zip(reqs, full.outcomes, strict=True):
        assert plan(fleet, before, [r], T0).outcomes == (out,)
        if isinstance(out, Placement):
            before.append(out.booking())
        elif isinstance(out, Wait) and out.held is not None:
            before.append(out.held)


def test_protect_bounds_how_many_waiting_reservations_are_looked_ahead_for() -> None:
    held = [booking("x", "n0", [0, 1], T0, T0 + H), booking("y", "n1", [0, 1], T0, T0 + 2 * H)]
    fleet = [node("n0", 2), node("n1", 2)]
    reqs = [Request(f"r{i}", seq=i, count=2) for i in range(3)]
    assert [w.earliest_start_ms for w in plan(fleet, held, reqs, T0).waits] == [T0 + H, T0 + 2 * H, None]
    assert [w.earliest_start_ms for w in plan(fleet, held, reqs, T0, protect=1).waits] == [T0 + H, None, None]
    assert [w.held for w in plan(fleet, held, reqs, T0, protect=0).waits] == [None, None, None]
