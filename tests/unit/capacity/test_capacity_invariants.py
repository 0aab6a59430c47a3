"""The checkers catch what they exist for: planted violations, and planners or wirings broken on purpose."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from bc.control.capacity.invariants import (
    BillingMismatch,
    HostOverbooked,
    Overlap,
    PlaceablePending,
    Release,
    ReleasedOnDisconnect,
    Transition,
    WrongEstimate,
    check_billing_conservation,
    check_estimates,
    check_host_resources,
    check_no_overlap,
    check_no_release_on_disconnect,
    check_nothing_placeable_pending,
)
from bc.control.capacity.placement_plan import Booking, HostResources, NodeInfo, Plan, Request, Wait, plan
from bc.control.capacity.usage_windows import Span, UsageWindow, windows_to_flush
from bc.protocol.atoms import GPU_SLOT, parse_atom
from tests.unit.capacity.fleet import H, booking, node, req
from tests.unit.capacity.model import Lab

T0 = 1_800_000_000_000


# ---- I1 ----


def test_overlap_is_over_intervals_and_parent_aware() -> None:
    assert check_no_overlap([booking("a", "n1", [0], T0, T0 + H), booking("b", "n1", [0], T0 + H, None)]) is None
    assert check_no_overlap([booking("a", "n1", [0]), booking("b", "n2", [0])]) is None
    slot = Booking("s", "n1", (parse_atom(GPU_SLOT, "n1-gpu0/s1"),), T0 + 30 * 60_000, T0 + 2 * H)
    found = check_no_overlap([booking("a", "n1", [0], T0, T0 + H), slot])
    assert isinstance(found, Overlap)
    assert found.sentence == "I1: a and s both book n1-gpu0 / n1-gpu0/s1 on n1 at 2027-01-15T08:30:00Z"


def _ignores_intervals(
    nodes: Sequence[NodeInfo], bookings: Sequence[Booking], pending: Sequence[Request], now: int
) -> Plan:
    """A broken pass: it forgets bookings that have not started yet (as if a booking were 'live' or not)."""
    return plan(nodes, [b for b in bookings if b.start_ms <= now], pending, now)


def test_a_pass_that_ignores_intervals_is_caught_by_i1() -> None:
    lab = Lab({"n1": node("n1", 1)}, T0, planner=_ignores_intervals)
    lab.reserve("tonight", count=1, start_ms=T0 + 10 * H, duration_ms=8 * H)
    assert lab.violations() == []
    lab.reserve("now", count=1)  # open-ended: it overlaps tonight's window, which the broken pass cannot see
    assert lab.violations() == ["I1: tonight and now both book n1-gpu0 / n1-gpu0 on n1 at 2027-01-15T18:00:00Z"]
    # The real pass keeps it waiting for the window to end.
    lab = Lab({"n1": node("n1", 1)}, T0)
    lab.reserve("tonight", count=1, start_ms=T0 + 10 * H, duration_ms=8 * H)
    lab.reserve("now", count=1)
    assert lab.violations() == [] and "now" in lab.pending


def test_host_resources_booked_past_what_a_node_has_are_caught() -> None:
    n1 = node("n1", cpus=32)
    a = booking("a", "n1", [0], T0, T0 + 2 * H, host=HostResources(cpus=20))
    b = booking("b", "n1", [1], T0 + H, None, host=HostResources(cpus=20))
    found = check_host_resources([n1], [a, b])
    assert isinstance(found, HostOverbooked) and (found.at_ms, found.booked.cpus) == (T0 + H, 40)
    assert found.sentence == "I1: n1 has 40 CPUs booked at 2027-01-15T09:00:00Z; it has 32 CPUs, 256 GiB memory"
    assert check_host_resources([n1], [a, dataclasses.replace(b, start_ms=T0 + 2 * H)]) is None


# ---- I5 ----


class _ReleasesOnDisconnect(Lab):
    """A broken wiring: it frees the holds of a node that went away."""

    def set_node(self, node_id: str, **facts: object) -> None:
        if facts.get("connectivity", "connected") != "connected":
            for rid in [r for r, b in self.live.items() if b.node_id == node_id]:
                self._end(rid, "node-disconnected")
        super().set_node(node_id, **facts)


def test_a_release_because_a_node_went_away_is_caught_by_i5() -> None:
    lab = _ReleasesOnDisconnect({"n1": node("n1")}, T0)
    lab.reserve("r1", count=2)
    lab.set_node("n1", connectivity="disconnected")
    assert lab.violations() == [
        "I5: r1 was released at 2027-01-15T08:00:00Z for 'node-disconnected' while n1 was away since"
        " 2027-01-15T08:00:00Z"
    ]
    # An operator's release while the node is away is theirs to make.
    ok = [Release("r1", "n1", T0 + H, "released")]
    assert check_no_release_on_disconnect(ok, [Transition("n1", T0, "unreachable")]) is None
    found = check_no_release_on_disconnect(
        [Release("r1", "n1", T0 + H, "lease-expired")], [Transition("n1", T0, "unreachable")]
    )
    assert isinstance(found, ReleasedOnDisconnect) and found.away_since_ms == T0
    assert found.sentence.endswith("for 'lease-expired' while n1 was away since 2027-01-15T08:00:00Z")


# ---- I7 ----


def test_a_pending_reservation_that_fits_is_caught_by_i7() -> None:
    fleet = [node("n1", 2, caps=frozenset())]
    r = req("r", 2)
    assert check_nothing_placeable_pending(fleet, [], [(r, None)], T0) == PlaceablePending(
        "r", "n1", tuple(booking("", "n1", [0, 1]).atoms), T0
    )
    # What the pass holds for an earlier reservation (backfill protection) is not free: "e" waits for GPU 0,
    # so an open-ended "r" may not take GPU 1, while a short one may.
    x = booking("x", "n1", [0], T0, T0 + H)
    e = (req("e", 2, seq=0), booking("e", "n1", [0, 1], T0 + H, None))
    assert check_nothing_placeable_pending(fleet, [x], [e, (req("r", 1), None)], T0) is None
    short = check_nothing_placeable_pending(fleet, [x], [e, (req("s", 1, duration_ms=H), None)], T0)
    assert short is not None and short.sentence == "I7: s is pending but fits on n1 (n1-gpu1) from 2027-01-15T08:00:00Z"
    # Nor does it fit a node without a capability it needs.
    assert check_nothing_placeable_pending(fleet, [], [(req("c", 1, host=HostResources(cpus=1)), None)], T0) is None


def test_a_pass_that_leaves_placeable_work_waiting_is_caught_by_i7() -> None:
    def lazy(nodes: Sequence[NodeInfo], bookings: Sequence[Booking], pending: Sequence[Request], now: int) -> Plan:
        p = plan(nodes, bookings, pending, now)
        return Plan(tuple(Wait(o.reservation_id, "lazy") for o in p.outcomes), p.ended, p.next_wake_ms)

    lab = Lab({"n1": node("n1")}, T0, planner=lazy)
    lab.reserve("r1", count=1)
    assert lab.violations() == ["I7: r1 is pending but fits on n1 (n1-gpu0) from 2027-01-15T08:00:00Z"]


def test_a_late_or_missing_estimate_is_caught() -> None:
    fleet = [node("n1", 2)]
    x = booking("x", "n1", [0, 1], T0, T0 + H)
    r = req("r", 2, duration_ms=H)
    right = plan(fleet, [x], [r], T0).waits[0]
    assert right.held is not None and check_estimates(fleet, [x], [(r, right.held)], T0) is None
    late = dataclasses.replace(right.held, start_ms=T0 + 2 * H, end_ms=T0 + 3 * H)
    found = check_estimates(fleet, [x], [(r, late)], T0)
    assert isinstance(found, WrongEstimate)
    assert found.sentence == (
        "I7: r is held from 2027-01-15T10:00:00Z but fits on n1 (n1-gpu0, n1-gpu1) from 2027-01-15T09:00:00Z"
    )
    missing = check_estimates(fleet, [x], [(r, None)], T0)
    assert missing is not None and missing.claimed_ms is None and missing.fits_ms == T0 + H
    bogus = dataclasses.replace(right.held, end_ms=None)  # not the interval the request books
    assert check_estimates(fleet, [x], [(r, bogus)], T0) == WrongEstimate("r", T0 + H, None)


# ---- I8 ----


def _span() -> Span:
    return Span("r1", "n1", "t", "gpu", 2, None, None, T0, T0 + 2 * H + 5)


def test_usage_that_does_not_add_up_or_counts_twice_is_caught_by_i8() -> None:
    s = _span()
    ws = windows_to_flush(s, None, T0 + 3 * H)
    assert check_billing_conservation([s], ws, T0 + 3 * H) is None
    missing = check_billing_conservation([s], ws[:-1], T0 + 3 * H)
    assert missing == BillingMismatch("r1", 2 * (2 * H + 5), 2 * 2 * H)
    assert missing.sentence == "I8: r1 booked 14400.01 atom-seconds but usage says 14400"
    twice = check_billing_conservation([s], [*ws, ws[0]], T0 + 3 * H)
    assert twice is not None and twice.sentence == f"I8: usage window ('r1', {T0}) of r1 is counted twice"
    stray = UsageWindow("r9", "n1", "t", "gpu", 1, T0, T0 + 1000)
    assert check_billing_conservation([s], [*ws, stray], T0 + 3 * H) == BillingMismatch("r9", 0, 1000)


def test_a_flush_that_restarts_from_the_usage_start_is_caught_by_i8() -> None:
    """A broken flush that ignores where the last one ended writes new keys for used time: counted twice."""
    s = _span()
    first = windows_to_flush(s, None, T0 + H + 10)
    shifted = [
        UsageWindow(w.reservation_id, w.node_id, w.tenant, w.device_class, w.atoms, w.start_ms + 1, w.end_ms)
        for w in windows_to_flush(s, None, T0 + 2 * H)
    ]
    found = check_billing_conservation([s], [*first, *shifted], T0 + 2 * H)
    assert found is not None and found.reservation_id == "r1" and found.duplicate_key is None
