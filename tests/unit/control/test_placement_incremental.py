"""The incremental pass, pure: a queue planned, then its extension decided on the kept state (`Planned.extend`),
gives the new reservations exactly what `plan` over the whole queue gives them at the later instant, and leaves
the earlier ones as they were; and the kept state refuses to go on (`Planned.matches`) when anything it planned
from has changed. The wired pass (`PlacementPass.step`) relies on both (docs/capacity.md)."""

from __future__ import annotations

import dataclasses

from hypothesis import event, given, settings
from hypothesis import strategies as st

from bc.control.capacity.placement_plan import (
    Booking,
    HostResources,
    NodeInfo,
    Plan,
    Planned,
    Request,
    Wait,
    plan,
    plan_and_keep,
)
from tests.unit.capacity.fleet import H, M, booking, node
from tests.unit.capacity.test_capacity_model import NODE_IDS, T0, fleets, requests


@st.composite
def bookings(draw: st.DrawFn, fleet: list[NodeInfo]) -> list[Booking]:
    """Holds booked before the first pass: some over, some running, some later, some open-ended."""
    out = []
    for k in range(draw(st.integers(0, 4))):
        n = draw(st.sampled_from(fleet))
        idx = draw(st.lists(st.integers(0, len(n.gpus) - 1), min_size=1, max_size=2, unique=True))
        start = T0 + draw(st.integers(-4, 4)) * 30 * M
        end = draw(st.one_of(st.none(), st.integers(1, 8).map(lambda d, s=start: s + d * 30 * M)))
        out.append(booking(f"b{k}", n.node_id, idx, start, end))
    return out


def queue(draw: st.DrawFn, prefix: str, first_seq: int, now: int) -> list[Request]:
    return [
        Request(f"{prefix}{i}", seq=first_seq + i, **draw(requests(f"{prefix}{i}", now)))  # type: ignore[arg-type]
        for i in range(draw(st.integers(0, 6)))
    ]


def later(draw: st.DrawFn, planned: Planned) -> int:
    """An instant from the kept pass's now up to (not including) its next wake."""
    room = 10 * H if planned.next_wake_ms is None else planned.next_wake_ms - planned.now_ms
    return planned.now_ms + draw(st.integers(0, room - 1))


def after_commit(live: list[Booking], p: Plan, now: int) -> list[Booking]:
    """The store's bookings once the pass committed: the ended ones released, its placements booked."""
    return [b for b in live if b.end_ms is None or b.end_ms > now] + [o.booking() for o in p.placements]


@settings(max_examples=300, deadline=None)
@given(fleet=fleets(), data=st.data())
def test_an_extension_decided_on_the_kept_state_is_what_a_full_plan_decides(
    fleet: list[NodeInfo], data: st.DataObject
) -> None:
    draw = data.draw
    booked = draw(bookings(fleet))
    old = queue(draw, "a", 1, T0)
    p, planned = plan_and_keep(fleet, booked, old, T0)
    store = after_commit(booked, p, T0)
    first = {o.reservation_id: o for o in p.outcomes}
    waiting = [r for r in old if isinstance(first[r.reservation_id], Wait)]
    seq, now = len(old) + 1, T0
    for batch in range(3):  # extensions on extensions: each goes on from the last one's state
        now = later(draw, planned)
        new = queue(draw, f"x{batch}-", seq, now)
        seq += len(new)
        if not planned.matches(fleet, store, now):
            # A wait's NUMA pins a full pass would choose otherwise, next to a later pinned placement: the
            # next pass is a full one (`_Pass._note_pinned`).
            assert not planned.state.stable
            event("a full pass again: pins")
            return
        got, planned = planned.extend(store, new, now)
        full = plan(fleet, store, waiting + new, now)
        by_id = {o.reservation_id: o for o in full.outcomes}
        assert got.outcomes == tuple(by_id[r.reservation_id] for r in new)
        assert all(by_id[r.reservation_id] == first[r.reservation_id] for r in waiting)  # the old ones unchanged
        assert (got.ended, got.next_wake_ms) == (full.ended, full.next_wake_ms)
        first.update({o.reservation_id: o for o in got.outcomes})
        waiting += [r for r in new if isinstance(first[r.reservation_id], Wait)]
        store = after_commit(store, got, now)
        event(f"placed in an extension: {bool(got.placements)}")
        event(f"waits with a hold in an extension: {any(o.held for o in got.waits)}")


@settings(max_examples=200, deadline=None)
@given(fleet=fleets(), data=st.data())
def test_the_kept_state_goes_on_only_while_nothing_it_planned_from_changed(
    fleet: list[NodeInfo], data: st.DataObject
) -> None:
    draw = data.draw
    booked = draw(bookings(fleet))
    p, planned = plan_and_keep(fleet, booked, queue(draw, "a", 1, T0), T0)
    store = after_commit(booked, p, T0)
    now = later(draw, planned)
    assert planned.matches(fleet, store, now) == planned.state.stable
    assert not planned.matches(fleet, store, T0 - 1)  # the clock went back
    if planned.next_wake_ms is not None:
        assert not planned.matches(fleet, store, planned.next_wake_ms)  # something starts, ends or opens
    n = draw(st.integers(0, len(fleet) - 1))
    changed = dataclasses.replace(fleet[n], cordoned=not fleet[n].cordoned)
    assert not planned.matches([*fleet[:n], changed, *fleet[n + 1 :]], store, now)
    assert not planned.matches([f for f in fleet if f.node_id != NODE_IDS[n]], store, now)
    assert not planned.matches(fleet, [*store, booking("extra", NODE_IDS[n], [0], T0 - H, T0 + 20 * H)], now)
    if store:
        k = draw(st.integers(0, len(store) - 1))
        assert not planned.matches(fleet, store[:k] + store[k + 1 :], now)  # one released


def test_a_pinned_placement_over_an_earlier_pinned_hold_makes_the_next_pass_a_full_one() -> None:
    """Found by the property above. n2 has two NUMA nodes of 16 CPUs and is full for an hour. `w` (1 GPU, 2
    CPUs) waits with a hold on GPU 0 pinned to NUMA node 0; `p`, later in the queue, is booked over it on the
    other three GPUs pinned to both NUMA nodes (20 CPUs of their 32, `w`'s 2 counted). A full pass decides `w`
    again with `p` booked, which counts its 20 against NUMA node 0 alone: `w`'s hold is no longer pinned, so
    what new reservations would be fitted around differs, and the kept state must not go on."""
    n2 = node("n2", 4, numa=2, cpus=32)
    booked = [booking("b", "n2", [0, 1, 2, 3], T0 - H, T0 + H)]
    w = Request("w", seq=1, count=1, host=HostResources(cpus=2))
    p = Request("p", seq=2, count=3, node_id="n2", start_ms=T0 + 2 * H, duration_ms=H, host=HostResources(cpus=20))
    first, planned = plan_and_keep([n2], booked, [w, p], T0)
    held = first.waits[0].held
    assert held is not None and held.cpu_numa == (0,)
    assert [(o.reservation_id, o.cpu_numa) for o in first.placements] == [("p", (0, 1))]
    store = after_commit(booked, first, T0)
    again = plan([n2], store, [w], T0).waits[0].held
    assert again is not None and again.cpu_numa == ()  # what a full pass would hold for `w` now
    assert not planned.matches([n2], store, T0)
