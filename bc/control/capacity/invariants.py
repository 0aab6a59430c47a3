"""Checkers of the capacity invariants I1, I5, I7 and I8 (reference: failure-modes.md, "The invariants").

Each takes plain facts and returns None when the invariant holds, else a counterexample: a frozen
dataclass with the facts that break it and `sentence`, one line an operator or a failing test prints.
They are written apart from the planner on purpose (a brute-force search, their own eligibility rule),
so a planner bug is not also a checker bug; the model check, the simulator and the store's own checks
reuse them.

    I1  check_no_overlap                  no atom booked by two allocations at one instant
        check_host_resources              nor more CPUs, memory or huge pages than the node has
    I5  check_no_release_on_disconnect    no allocation released only because its node went away
    I7  check_nothing_placeable_pending   nothing pending that a brute-force solver could place now
        check_estimates                   and what backfill holds for a waiting one is its earliest start
    I8  check_billing_conservation        usage = booked duration × atoms, no duplicate window keys
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from bc.control.capacity.atoms import offered_atoms_of
from bc.control.capacity.placement_plan import Booking, HostResources, NodeInfo, Request, iso
from bc.control.capacity.usage_windows import Span, UsageWindow
from bc.protocol.atoms import Atom, atoms_conflict

# ---- I1 ----


@dataclass(frozen=True)
class Overlap:
    first: Booking
    second: Booking
    atoms: tuple[Atom, Atom]
    at_ms: int

    @property
    def sentence(self) -> str:
        return (
            f"I1: {self.first.reservation_id} and {self.second.reservation_id} both book "
            f"{self.atoms[0].atom_id} / {self.atoms[1].atom_id} on {self.first.node_id} at {iso(self.at_ms)}"
        )


def check_no_overlap(bookings: Sequence[Booking]) -> Overlap | None:
    """I1: no two bookings of different reservations hold conflicting atoms at one instant (parent-aware)."""
    by_gpu: dict[tuple[str, str], list[tuple[Booking, Atom]]] = {}
    for b in bookings:
        for a in b.atoms:
            by_gpu.setdefault((b.node_id, a.gpu_uuid), []).append((b, a))
    for key in sorted(by_gpu):
        entries = by_gpu[key]
        for (b1, a1), (b2, a2) in itertools.combinations(entries, 2):
            if b1.reservation_id == b2.reservation_id or not atoms_conflict(a1, a2):
                continue
            if b1.overlaps(b2.start_ms, b2.end_ms):
                return Overlap(b1, b2, (a1, a2), max(b1.start_ms, b2.start_ms))
    return None


@dataclass(frozen=True)
class HostOverbooked:
    node_id: str
    at_ms: int
    booked: HostResources
    capacity: HostResources

    @property
    def sentence(self) -> str:
        has = self.capacity.describe() or "no host resources"
        return f"I1: {self.node_id} has {self.booked.describe()} booked at {iso(self.at_ms)}; it has {has}"


def check_host_resources(nodes: Sequence[NodeInfo], bookings: Sequence[Booking]) -> HostOverbooked | None:
    """I1 for host resources: at no instant do a node's bookings hold more CPUs, memory or huge pages than it has.

    The most a set of intervals holds is reached at one of their starts, so those are the instants checked.
    """
    for node in sorted(nodes, key=lambda n: n.node_id):
        cap = HostResources()
        for n in node.numa:
            cap = cap + n.resources
        mine = [b for b in bookings if b.node_id == node.node_id]
        for t in sorted({b.start_ms for b in mine}):
            used = HostResources()
            for b in mine:
                if b.start_ms <= t and (b.end_ms is None or t < b.end_ms):
                    used = used + b.host
            if not used.fits_in(cap):
                return HostOverbooked(node.node_id, t, used, cap)
    return None


# ---- I5 ----

DELIBERATE_RELEASES = frozenset({"released", "window-ended", "allocation-failed", "re-placed"})
"""Why a hold may end: an operator released it, its window ended, the node failed it, capacity moved it."""


@dataclass(frozen=True)
class Release:
    reservation_id: str
    node_id: str
    at_ms: int
    reason: str


@dataclass(frozen=True)
class Transition:
    node_id: str
    at_ms: int
    connectivity: str  # the state the node entered


@dataclass(frozen=True)
class ReleasedOnDisconnect:
    release: Release
    away_since_ms: int | None

    @property
    def sentence(self) -> str:
        r = self.release
        away = "" if self.away_since_ms is None else f" while {r.node_id} was away since {iso(self.away_since_ms)}"
        return f"I5: {r.reservation_id} was released at {iso(r.at_ms)} for {r.reason!r}{away}"


def check_no_release_on_disconnect(
    releases: Sequence[Release], transitions: Sequence[Transition]
) -> ReleasedOnDisconnect | None:
    """I5: every release has a deliberate reason; a release for any other reason while its node is away is one
    connectivity caused. (A deliberate release while the node is away is fine: the operator asked for it.)"""
    for r in sorted(releases, key=lambda r: (r.at_ms, r.reservation_id)):
        if r.reason in DELIBERATE_RELEASES:
            continue
        before = [t for t in transitions if t.node_id == r.node_id and t.at_ms <= r.at_ms]
        last = max(before, key=lambda t: t.at_ms, default=None)
        away = last.at_ms if last is not None and last.connectivity != "connected" else None
        return ReleasedOnDisconnect(r, away)
    return None


# ---- I7 ----


@dataclass(frozen=True)
class PlaceablePending:
    reservation_id: str
    node_id: str
    atoms: tuple[Atom, ...]
    start_ms: int

    @property
    def sentence(self) -> str:
        ids = ", ".join(a.atom_id for a in self.atoms)
        return f"I7: {self.reservation_id} is pending but fits on {self.node_id} ({ids}) from {iso(self.start_ms)}"


def _eligible(node: NodeInfo, req: Request) -> bool:
    """The checker's own reading of NoSchedule, selectors and capabilities (not the planner's code)."""
    if node.deleted or node.revoked or node.cordoned or node.job_hold or node.connectivity != "connected":
        return False
    if req.node_id is not None and node.node_id != req.node_id:
        return False
    if node.node_id in req.avoid:
        return False
    if any(node.labels.get(k) != v for k, v in req.selector.items()):
        return False
    if (req.host.cpus or req.host.memory_bytes or req.host.hugepages_1g) and "devices.limits" not in node.capabilities:
        return False
    if req.binding == "instance" and "instances.qemu" not in node.capabilities:
        return False
    return req.binding != "kubernetes" or "binding.kubernetes" in node.capabilities


def _host_fits(node: NodeInfo, over: Sequence[Booking], want: HostResources, start: int, end: int | None) -> bool:
    """Node-wide host resources at every instant of the interval (instants: its start and every booking start)."""
    cap = HostResources()
    for n in node.numa:
        cap = cap + n.resources
    for t in {start} | {b.start_ms for b in over if b.start_ms > start and (end is None or b.start_ms < end)}:
        used = want
        for b in over:
            if b.start_ms <= t and (b.end_ms is None or t < b.end_ms):
                used = used + b.host
        if not used.fits_in(cap):
            return False
    return True


def check_nothing_placeable_pending(
    nodes: Sequence[NodeInfo],
    bookings: Sequence[Booking],
    pending: Sequence[tuple[Request, Booking | None]],
    now_ms: int,
    *,
    max_combinations: int = 5000,
) -> PlaceablePending | None:
    """I7 after a quiet pass: no pending reservation fits now, by exhaustive search over every eligible node and
    every set of its atoms, against the bookings and what the pass holds for the reservations submitted before
    it (its `Wait.held`: backfill may not take those). Meant for a small fleet; `max_combinations` bounds the
    search per node so a large one stays finite (it then checks only the first sets)."""
    order = sorted(pending, key=lambda p: (p[0].seq, p[0].reservation_id))
    held_before: list[Booking] = []
    for req, held in order:
        start = now_ms if req.start_ms is None else max(now_ms, req.start_ms)
        interval = _interval(req, start)
        if interval is not None:
            found = _search(nodes, [*bookings, *held_before], req, *interval, max_combinations)
            if found is not None:
                node_id, atoms = found
                return PlaceablePending(req.reservation_id, node_id, atoms, start)
        if held is not None:
            held_before.append(held)
    return None


@dataclass(frozen=True)
class WrongEstimate:
    reservation_id: str
    claimed_ms: int | None  # the start the pass holds it for; None: no estimate
    fits_ms: int | None  # the earliest instant it fits; None: none (a hold with nothing behind it)
    node_id: str = ""
    atoms: tuple[Atom, ...] = ()

    @property
    def sentence(self) -> str:
        claimed = "has no estimate" if self.claimed_ms is None else f"is held from {iso(self.claimed_ms)}"
        if self.fits_ms is None:
            return f"I7: {self.reservation_id} {claimed} but fits at no instant"
        ids = ", ".join(a.atom_id for a in self.atoms)
        return f"I7: {self.reservation_id} {claimed} but fits on {self.node_id} ({ids}) from {iso(self.fits_ms)}"


def check_estimates(
    nodes: Sequence[NodeInfo],
    bookings: Sequence[Booking],
    pending: Sequence[tuple[Request, Booking | None]],
    now_ms: int,
    *,
    max_combinations: int = 5000,
) -> WrongEstimate | None:
    """What backfill protects is right: each pending reservation's hold starts at the earliest instant it fits
    (by exhaustive search, against the bookings and the earlier reservations' holds), and one without a hold
    fits at no bounded instant. A fit can begin only at its own start or where some booking ends, so those are
    the instants searched. Assumes a pass without `protect`."""
    order = sorted(pending, key=lambda p: (p[0].seq, p[0].reservation_id))
    held_before: list[Booking] = []
    for req, held in order:
        taken = [*bookings, *held_before]
        base = now_ms if req.start_ms is None else max(now_ms, req.start_ms)
        claimed = None if held is None else held.start_ms
        times = sorted({b.end_ms for b in taken if b.end_ms is not None and b.end_ms > base})
        for t in times:
            if claimed is not None and t >= claimed:
                break
            interval = _interval(req, t)
            if interval is None:
                break
            found = _search(nodes, taken, req, *interval, max_combinations)
            if found is not None:
                return WrongEstimate(req.reservation_id, claimed, t, *found)
        if held is not None:
            interval = _interval(req, held.start_ms)
            fits = interval is not None and _search(nodes, taken, req, *interval, max_combinations) is not None
            if held.start_ms <= base or interval != (held.start_ms, held.end_ms) or not fits:
                return WrongEstimate(req.reservation_id, claimed, None)
            held_before.append(held)
    return None


def _interval(req: Request, t: int) -> tuple[int, int | None] | None:
    """The checker's own reading of a request's interval if it starts at `t` (None: its window is over by then)."""
    end = req.end_ms
    if end is None and req.duration_ms is not None:
        end = (t if req.start_ms is None else req.start_ms) + req.duration_ms
    return (t, end) if end is None or end > t else None


def _search(
    nodes: Sequence[NodeInfo], taken: Sequence[Booking], req: Request, start: int, end: int | None, limit: int
) -> tuple[str, tuple[Atom, ...]] | None:
    for node in sorted(nodes, key=lambda n: n.node_id):
        if not _eligible(node, req):
            continue
        over = [b for b in taken if b.node_id == node.node_id and b.overlaps(start, end)]
        if not _host_fits(node, over, req.host, start, end):
            continue
        booked = [a for b in over for a in b.atoms]
        offered = offered_atoms_of(node.gpus, req.device_class)
        for combo in itertools.islice(itertools.combinations(offered, req.count), limit):
            if not any(atoms_conflict(a, b) for a in combo for b in booked):
                return node.node_id, combo
    return None


# ---- I8 ----


@dataclass(frozen=True)
class BillingMismatch:
    reservation_id: str
    booked_atom_ms: int
    usage_atom_ms: int
    duplicate_key: tuple[str, int] | None = None

    @property
    def sentence(self) -> str:
        if self.duplicate_key is not None:
            return f"I8: usage window {self.duplicate_key} of {self.reservation_id} is counted twice"
        return (
            f"I8: {self.reservation_id} booked {_seconds(self.booked_atom_ms)} atom-seconds "
            f"but usage says {_seconds(self.usage_atom_ms)}"
        )


def _seconds(ms: int) -> str:
    """Milliseconds as seconds, exactly (no rounding hides a one-millisecond mismatch)."""
    return f"{ms // 1000}" if ms % 1000 == 0 else f"{ms / 1000:.3f}".rstrip("0")


def check_billing_conservation(
    spans: Sequence[Span], windows: Sequence[UsageWindow], now_ms: int
) -> BillingMismatch | None:
    """I8: per reservation, the windows (flushed and open, up to `now_ms`) sum to its used time × atoms, and no
    two windows share a key. Sums per reservation imply the fleet-wide sum and name the one that is off."""
    seen: set[tuple[str, int]] = set()
    usage: dict[str, int] = {}
    for w in windows:
        if w.key in seen:
            return BillingMismatch(w.reservation_id, 0, 0, w.key)
        seen.add(w.key)
        usage[w.reservation_id] = usage.get(w.reservation_id, 0) + w.atom_ms
    booked: dict[str, int] = {}
    for s in spans:  # a reservation a node refused has a span per placement
        booked[s.reservation_id] = booked.get(s.reservation_id, 0) + s.atoms * s.used_ms(now_ms)
    for rid in sorted(set(booked) | set(usage)):
        if booked.get(rid, 0) != usage.get(rid, 0):
            return BillingMismatch(rid, booked.get(rid, 0), usage.get(rid, 0))
    return None


__all__ = [
    "BillingMismatch",
    "HostOverbooked",
    "Overlap",
    "PlaceablePending",
    "Release",
    "ReleasedOnDisconnect",
    "Transition",
    "WrongEstimate",
    "check_billing_conservation",
    "check_estimates",
    "check_host_resources",
    "check_no_overlap",
    "check_no_release_on_disconnect",
    "check_nothing_placeable_pending",
]
