"""The fleet invariants over what a simulated run recorded (reference: failure-modes.md, "The invariants").

I2, I3 and I4 are here, in the style of `bc.control.capacity.invariants`: pure functions over plain facts that return
None when the invariant holds, else a frozen counterexample whose `sentence` names the facts behind it and
the simulated time. I1, I5, I7 and I8 are the capacity checkers themselves (`bc.control.capacity.invariants`), run on
the same facts; I1 also runs its overlap check on the bindings nodes reported, and checks each binding
against its booking. `check_all` runs every one and returns one `InvariantResult` each.

    I1  no atom booked (or bound by a node) for two reservations at once; no binding of an unbooked atom
    I2  at most one execution per command (kinds' flags: bc.protocol.kinds)
    I3  a spec delivered while the node stays reachable is reported observed within 60 s; and a node never
        goes back: under one journal, no spec it applies is older than one it applied before
    I4  no node marked unreachable or lost within 20 s of a gateway that routes (its lease held by its own
        rule) hearing from it
    I5  no allocation released only because its node went away; no hold a node released by itself
    I7  nothing pending that a brute-force solver could place (after the quiet period; only when asked)
    I8  usage = booked duration x atoms, no duplicate window keys
    Q1  a destructive batch's command runs on a node only with approvals that the production rule
        (`bc.pki.quorum.count_approvals`: distinct keys of distinct operators, none the requester's, valid
        signatures over the batch's scope) counts as at least k; recounted from the approval its frame carried
    H1  the health reconciler within its limits, releasing no hold, resetting no held GPU, acting once per
        episode (`bc.sim.health_checker`; only in a `--health` run, whose facts carry `health`)
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import DecodeError

from bc.control.capacity import invariants
from bc.control.capacity.placement_plan import Booking, iso
from bc.control.commands.states import SUCCEEDED
from bc.pki import quorum
from bc.protocol.kinds import KINDS
from bc.protocol.pb import common_pb2
from bc.sim.facts import (
    AgentRestart,
    BatchRan,
    Bound,
    Connectivity,
    FactLog,
    GpuUse,
    HeardSpan,
    JournalLoss,
    NodeRelease,
    Outage,
    Outcome,
    QuorumHeld,
    SideEffect,
    SpecApplied,
    SpecDelivered,
    StatusReported,
)
from bc.sim.health_checker import check_h1

# ---- I1: bindings against bookings ----


@dataclass(frozen=True)
class UnbookedBinding:
    binding: Bound
    atom_id: str

    @property
    def sentence(self) -> str:
        b = self.binding
        return (
            f"I1: {b.node_id} bound {self.atom_id} for {b.reservation_id} at {iso(b.start_ms)}, "
            f"which {b.reservation_id} did not book there"
        )


def check_bound_as_booked(bound: Sequence[Bound], bookings: Sequence[Booking]) -> UnbookedBinding | None:
    """I1: every atom a node bound for a reservation is one that reservation booked on that node."""
    booked: dict[tuple[str, str], set[str]] = {}
    for bk in bookings:
        booked.setdefault((bk.reservation_id, bk.node_id), set()).update(a.atom_id for a in bk.atoms)
    for b in sorted(bound, key=lambda b: (b.start_ms, b.node_id, b.reservation_id)):
        have = booked.get((b.reservation_id, b.node_id), set())
        for a in b.atoms:
            if a.atom_id not in have:
                return UnbookedBinding(b, a.atom_id)
    return None


# ---- I2 ----


def _once_only(kind: str) -> bool:
    """Starts at most once: not retry-safe, or self-terminating; an unknown kind is held to the strict rule."""
    k = KINDS.get(kind)
    return k is None or not k.retry_safe or k.self_terminating


def _retry_safe(kind: str) -> bool:
    k = KINDS.get(kind)
    return k is not None and k.retry_safe


@dataclass(frozen=True)
class DoubleExecution:
    first: SideEffect
    second: SideEffect
    why: str  # what made the second start wrong

    @property
    def sentence(self) -> str:
        f, s = self.first, self.second
        return (
            f"I2: {f.kind} {f.command_id} started on {f.node_id} at {iso(f.t_ms)} and again on {s.node_id} "
            f"at {iso(s.t_ms)} ({self.why})"
        )

    @property
    def at_ms(self) -> int:
        return self.second.t_ms


@dataclass(frozen=True)
class RunAfterJournalLoss:
    loss: JournalLoss
    command_id: str
    kind: str
    start: SideEffect | None  # it started again after the loss; None: it ended succeeded
    outcome: Outcome | None

    @property
    def sentence(self) -> str:
        lo = self.loss
        lost = f"lost {lo.node_id}'s journal {lo.old_journal_id} at {iso(lo.t_ms)} with {self.kind} {self.command_id}"
        if self.start is not None:
            return f"I2: {lost} in flight, and it started again at {iso(self.start.t_ms)}"
        reason = f" ({self.outcome.reason})" if self.outcome is not None and self.outcome.reason else ""
        return f"I2: {lost} in flight, and it ended succeeded{reason}"

    @property
    def at_ms(self) -> int:
        """When it started again; or, for an outcome (the store keeps no time for it here), the loss."""
        return self.loss.t_ms if self.start is None else self.start.t_ms


def check_i2(
    side_effects: Sequence[SideEffect],
    restarts: Sequence[AgentRestart],
    journal_losses: Sequence[JournalLoss],
    outcomes: Sequence[Outcome],
) -> DoubleExecution | RunAfterJournalLoss | None:
    """I2, at most one execution per command. A non-retry-safe or self-terminating command starts its side
    effect at most once. A retry-safe one starts again only after a crash could have interrupted it: an
    agent restart (or a journal loss) of the node that ran it, after the earlier start and at or before the
    later one. A non-retry-safe command the lost journal held in flight never starts after the loss and never
    ends succeeded. The first violation in simulated time is returned."""
    found: list[DoubleExecution | RunAfterJournalLoss] = []
    interruptions: dict[str, list[int]] = {}
    for r in restarts:
        interruptions.setdefault(r.node_id, []).append(r.t_ms)
    for lo in journal_losses:
        interruptions.setdefault(lo.node_id, []).append(lo.t_ms)
    starts: dict[str, list[SideEffect]] = {}
    for e in sorted(side_effects, key=lambda e: (e.t_ms, e.node_id, e.command_id)):
        starts.setdefault(e.command_id, []).append(e)
    for cid in sorted(starts):
        runs = starts[cid]
        for first, second in itertools.pairwise(runs):
            if _once_only(first.kind):
                k = KINDS.get(first.kind)
                why = "unknown kind" if k is None else "self-terminating" if k.self_terminating else "not retry-safe"
                found.append(DoubleExecution(runs[0], second, why))
                break
            crashed = any(first.t_ms < t <= second.t_ms for t in interruptions.get(first.node_id, ()))
            if not crashed:
                found.append(DoubleExecution(first, second, "retry-safe, but no crash between"))
                break
    by_id = {o.command_id: o for o in outcomes}
    for lo in sorted(journal_losses, key=lambda lo: (lo.t_ms, lo.node_id)):
        for cid in sorted(set(lo.in_flight)):
            o = by_id.get(cid)
            kind = o.kind if o is not None else next((e.kind for e in starts.get(cid, ())), "")
            if _retry_safe(kind):
                continue  # replayed, and its kind allows running again
            again = next((e for e in starts.get(cid, ()) if e.t_ms > lo.t_ms), None)
            if again is not None:
                found.append(RunAfterJournalLoss(lo, cid, kind, again, o))
            elif o is not None and o.state == SUCCEEDED:
                found.append(RunAfterJournalLoss(lo, cid, kind, None, o))
    return min(found, key=lambda f: f.at_ms, default=None)


# ---- I3 ----


@dataclass(frozen=True)
class NotConverged:
    delivery: SpecDelivered
    bound_ms: int
    latest: StatusReported | None  # the newest report within the bound, if any

    @property
    def sentence(self) -> str:
        d = self.delivery
        seen = (
            "no status report"
            if self.latest is None
            else f"the last report said observed {self.latest.observed_generation} at {iso(self.latest.t_ms)}"
        )
        return (
            f"I3: {d.node_id} received spec generation {d.generation} at {iso(d.t_ms)} and stayed reachable, "
            f"but did not report it observed within {self.bound_ms // 1000} s ({seen})"
        )

    @property
    def at_ms(self) -> int:
        return self.delivery.t_ms + self.bound_ms


def check_i3(
    deliveries: Sequence[SpecDelivered],
    reports: Sequence[StatusReported],
    outages: Sequence[Outage],
    restarts: Sequence[AgentRestart],
    end_ms: int,
    *,
    bound_ms: int = 60_000,
) -> NotConverged | None:
    """I3: each delivered spec of generation G is followed, within `bound_ms`, by a status report reaching the
    gateway with observed_generation >= G, after it in the taps' order (`seq`; hand-made facts without one
    count a report at the delivery's very instant as sent before the spec arrived: on the virtual clock a
    whole exchange can take no time at all); unless the same agent had already reported G observed before the
    delivery (an agent does not repeat a status that says nothing new), the node was not reachable (an outage)
    or its agent restarted during that time, or the run ended first. The earliest missed deadline is
    returned."""
    by_node: dict[str, list[StatusReported]] = {}
    for r in sorted(reports, key=lambda r: (r.t_ms, r.seq)):
        by_node.setdefault(r.node_id, []).append(r)
    restarted: dict[str, list[int]] = {}
    for a in restarts:
        restarted.setdefault(a.node_id, []).append(a.t_ms)
    for d in sorted(deliveries, key=lambda d: (d.t_ms, d.node_id, d.generation)):
        deadline = d.t_ms + bound_ms
        if deadline > end_ms:
            continue
        mine = by_node.get(d.node_id, ())
        window = [r for r in mine if (d.t_ms, d.seq) < (r.t_ms, r.seq) and r.t_ms <= deadline]
        if any(r.observed_generation >= d.generation for r in window):
            continue
        before = [r for r in mine if (r.t_ms, r.seq) < (d.t_ms, d.seq)]
        if (
            before
            and before[-1].observed_generation >= d.generation
            and not any(before[-1].t_ms < t <= d.t_ms for t in restarted.get(d.node_id, ()))
        ):
            continue  # a spec sent again (a duplicate, a new session) that the same agent had already reported
        if any(o.overlaps(d.node_id, d.t_ms, deadline) for o in outages):
            continue
        if any(d.t_ms <= t <= deadline for t in restarted.get(d.node_id, ())):
            continue
        return NotConverged(d, bound_ms, window[-1] if window else None)
    return None


@dataclass(frozen=True)
class WentBack:
    newer: SpecApplied  # the newest generation the journal held before
    older: SpecApplied  # applied after it

    @property
    def sentence(self) -> str:
        n, o = self.newer, self.older
        return (
            f"I3: {o.node_id} applied spec generation {o.generation} at {iso(o.t_ms)}, after it had applied "
            f"generation {n.generation} at {iso(n.t_ms)} (journal {o.journal_id}): a node never goes back"
        )

    @property
    def at_ms(self) -> int:
        return self.older.t_ms


def check_spec_order(applied: Sequence[SpecApplied]) -> WentBack | None:
    """I3's second half: under one journal (a node's journal id), each spec the agent applies is of a
    generation at least as new as every one it applied before; the same generation again is no step back.
    A fresh journal (a journal loss) starts over: it holds nothing, and the control plane sends it the
    newest. The earliest step back is returned."""
    newest: dict[tuple[str, str], SpecApplied] = {}
    for a in sorted(applied, key=lambda a: (a.t_ms, a.seq)):
        key = (a.node_id, a.journal_id)
        before = newest.get(key)
        if before is not None and a.generation < before.generation:
            return WentBack(before, a)
        if before is None or a.generation > before.generation:
            newest[key] = a
    return None


# ---- I4 ----


@dataclass(frozen=True)
class FalseUnreachable:
    transition: Connectivity
    heard: HeardSpan  # the frames the gateway heard from the node up to the mark
    gap_ms: int  # frames of one span are each less than this after the one before
    bound_ms: int
    delivered_ms: int | None = None  # a late frame, sent at `heard.last_ms`, delivered then

    @property
    def sentence(self) -> str:
        c, h = self.transition, self.heard
        marked = f"I4: {c.node_id} was marked {c.state} at {iso(c.t_ms)}"
        if self.delivered_ms is not None:
            ago = (c.t_ms - h.last_ms) / 1000
            return (
                f"{marked}, {ago:g} s after it sent a frame a gateway received late, at {iso(self.delivered_ms)} "
                f"(the bound is {self.bound_ms / 1000:g} s)"
            )
        if h.last_ms >= c.t_ms:
            return (
                f"{marked} while a gateway was hearing from it (frames from {iso(h.first_ms)} to {iso(h.last_ms)}, "
                f"each less than {self.gap_ms / 1000:g} s after the one before; "
                f"the bound is {self.bound_ms / 1000:g} s)"
            )
        ago = (c.t_ms - h.last_ms) / 1000
        return f"{marked}, {ago:g} s after a gateway last heard from it (the bound is {self.bound_ms / 1000:g} s)"

    @property
    def at_ms(self) -> int:
        return self.transition.t_ms


def check_i4(facts: FactLog, *, bound_ms: int = 20_000) -> FalseUnreachable | None:
    """I4: no node goes `unreachable` or `lost` within `bound_ms` after a frame from it reached a gateway,
    by the frames the transport delivered (`facts.heard`), whatever any clock said. Frames at the mark's
    very instant do not count: the gateway had not handled them yet. A frame delivered late (held by a stall)
    counts from when it was sent, not from its delivery (`bc.sim.facts`: it is old news)."""
    if bound_ms < facts.heard_gap_ms:
        raise ValueError(f"I4's bound ({bound_ms} ms) is below the log's heard gap ({facts.heard_gap_ms} ms)")
    for c in sorted(facts.connectivity, key=lambda c: (c.t_ms, c.node_id)):
        if c.state not in ("unreachable", "lost"):
            continue
        heard = facts.last_heard(c.node_id, c.t_ms - 1)
        if heard is not None and (heard.last_ms >= c.t_ms - 1 or c.t_ms - heard.last_ms < bound_ms):
            return FalseUnreachable(c, heard, facts.heard_gap_ms, bound_ms)
        late = facts.last_late(c.node_id, c.t_ms - 1)
        if late is not None and c.t_ms - late[1] < bound_ms:
            delivered, sent = late
            return FalseUnreachable(c, HeardSpan(c.node_id, sent, sent), facts.heard_gap_ms, bound_ms, delivered)
    return None


# ---- I5: the node's side ----


@dataclass(frozen=True)
class NodeDroppedHold:
    release: NodeRelease

    @property
    def sentence(self) -> str:
        r = self.release
        return (
            f"I5: {r.node_id} released {r.reservation_id or 'an unknown reservation'}'s hold "
            f"(allocation {r.allocation_id}) by itself: its report reached the store at {iso(r.t_ms)}, and the "
            "control plane had not decided to end that hold"
        )

    @property
    def at_ms(self) -> int:
        return self.release.t_ms


def check_node_kept_holds(node_releases: Sequence[NodeRelease]) -> NodeDroppedHold | None:
    """I5 on the node's side: a node releases a hold only after the control plane decided to end it (released,
    ended, failed, lost); never on its own, as after a journal loss (reference: "the daemon ... keeps every
    device assignment: it never drops one on its own"). The first violation in time is returned."""
    for r in sorted(node_releases, key=lambda r: (r.t_ms, r.node_id, r.allocation_id)):
        if r.decided_ms is None or r.decided_ms > r.t_ms:
            return NodeDroppedHold(r)
    return None


def _i5(facts: FactLog) -> InvariantResult:
    found = invariants.check_no_release_on_disconnect(facts.releases, facts.transitions())
    if found is not None:
        return _result("I5", found, found.release.at_ms)
    dropped = check_node_kept_holds(facts.node_releases)
    return _result("I5", dropped, None if dropped is None else dropped.at_ms)


# ---- Q1: the destructive-batch quorum ----


@dataclass(frozen=True)
class UnderQuorum:
    """A batch command ran with approvals the production rule counts fewer than k of."""

    run: BatchRan
    counted: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]
    k: int

    @property
    def sentence(self) -> str:
        r = self.run
        why = "; ".join(f"{kid[:19]}…: {reason}" for kid, reason in self.refused)
        return (
            f"Q1: {r.kind} {r.command_id} of batch {r.batch_id} started on {r.node_id} at {iso(r.t_ms)} with "
            f"{len(self.counted)} approval(s) that count of the {self.k} it needs"
            + (f" (not counted: {why})" if why else "")
        )

    @property
    def at_ms(self) -> int:
        return self.run.t_ms


def approval_of(run: BatchRan) -> common_pb2.BatchApproval | None:
    """The approval the run's frame carried, when it decodes and names the run's batch."""
    try:
        approval = common_pb2.BatchApproval.FromString(run.approval)
    except DecodeError:
        return None
    return approval if run.approval and approval.batch_id == run.batch_id else None


def check_q1(runs: Sequence[BatchRan], held: QuorumHeld | None) -> UnderQuorum | None:
    """Q1: every batch command a node started carried approvals that `bc.pki.quorum.count_approvals` (the rule
    both ends apply in production) counts as at least k under the quorum settings in force. Expiry is not
    judged again: the node judges it on its own reckoning of the server's clock, which clock skew moves, and
    Q1 is about who signed. The first violation in time is returned; with no approver keys nothing is enforced
    (nor recorded: hand-made facts)."""
    if held is None or not held.approvers:
        return None
    need = max(1, held.k)
    for r in sorted(runs, key=lambda r: (r.t_ms, r.node_id, r.command_id)):
        approval = approval_of(r)
        if approval is None:
            return UnderQuorum(r, (), (("-", "no approval of this batch"),), need)
        tally = quorum.count_approvals(approval, held.approvers, None)
        if len(tally.counted) < need:
            return UnderQuorum(r, tuple(tally.counted), tuple(tally.refused), need)
    return None


# ---- V1: no GPU both held and passed through ----


@dataclass(frozen=True)
class HeldAndPassed:
    use: GpuUse
    gpu: str
    instance: str

    @property
    def sentence(self) -> str:
        return (
            f"V1: GPU {self.gpu} on {self.use.node_id} is both held (a CDI hold names it) and passed through to"
            f" instance {self.instance}"
        )

    @property
    def node_id(self) -> str:
        return self.use.node_id


def check_v1(uses: Sequence[GpuUse]) -> HeldAndPassed | None:
    """The first sample in which a GPU a CDI hold names is also passed through to a VM, or None."""
    for use in sorted(uses, key=lambda u: (u.at_ms, u.node_id)):
        for gpu, instance in use.passed:
            if gpu in use.held:
                return HeldAndPassed(use, gpu, instance)
    return None


# ---- all of them ----

NAMES: dict[str, str] = {
    "I1": "no overlapping bookings or bindings",
    "I2": "at most one execution per command",
    "I3": "convergence within 60 s, never backwards",
    "I4": "no false liveness positives",
    "I5": "no release because a node disconnected",
    "I7": "nothing placeable pending",
    "I8": "billing conservation",
    "Q1": "destructive batches run only with k approvers",
    "H1": "health remediation within limits, no hold released or reset, once per episode",
    "V1": "no GPU both held and passed through",
}


@dataclass(frozen=True)
class InvariantResult:
    id: str
    name: str
    ok: bool
    counterexample: str | None  # its sentence
    at_ms: int | None  # the simulated time of the violation, when it has one
    entities: tuple[str, ...] = ()
    """The nodes, commands and reservations the counterexample names (for the trace: `bc.sim.trace`)."""


class Counterexample(Protocol):
    @property
    def sentence(self) -> str: ...


ENTITY_FIELDS = ("node_id", "command_id", "reservation_id", "batch_id", "episode_id")


def entities_of(found: object, depth: int = 3) -> tuple[str, ...]:
    """The node, command and reservation ids a counterexample names, in its fields and theirs, each once."""
    out: dict[str, None] = {}

    def walk(obj: object, left: int) -> None:
        if left < 0:
            return
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if f.name in ENTITY_FIELDS and isinstance(value, str) and value:
                    out.setdefault(value)
                else:
                    walk(value, left - 1)
        elif isinstance(obj, list | tuple):
            for item in obj:
                walk(item, left - 1)

    walk(found, depth)
    return tuple(out)


def _result(id_: str, found: Counterexample | None, at_ms: int | None) -> InvariantResult:
    if found is None:
        return InvariantResult(id_, NAMES[id_], True, None, None)
    return InvariantResult(id_, NAMES[id_], False, found.sentence, at_ms, entities_of(found))


def _i1(facts: FactLog) -> InvariantResult:
    overlap = invariants.check_no_overlap(facts.bookings)
    if overlap is not None:
        return _result("I1", overlap, overlap.at_ms)
    host = invariants.check_host_resources(facts.nodes, facts.bookings)
    if host is not None:
        return _result("I1", host, host.at_ms)
    bound_overlap = invariants.check_no_overlap([b.as_booking() for b in facts.bound])
    if bound_overlap is not None:
        return _result("I1", bound_overlap, bound_overlap.at_ms)
    unbooked = check_bound_as_booked(facts.bound, facts.bookings)
    return _result("I1", unbooked, None if unbooked is None else unbooked.binding.start_ms)


def check_all(
    facts: FactLog, *, i7: bool = False, i3_bound_ms: int = 60_000, i4_bound_ms: int = 20_000
) -> list[InvariantResult]:
    """One result per checker, in order I1..I8 then Q1 (and H1 when the run recorded `facts.health`); I7 only
    with `i7` (after the quiet period: `facts.quiet`)."""
    out = [_i1(facts)]
    i2 = check_i2(facts.side_effects, facts.restarts, facts.journal_losses, facts.outcomes)
    out.append(_result("I2", i2, None if i2 is None else i2.at_ms))
    i3 = check_i3(facts.deliveries, facts.reports, facts.outages, facts.restarts, facts.end_ms, bound_ms=i3_bound_ms)
    back = check_spec_order(facts.applied)
    i3_found = min((f for f in (i3, back) if f is not None), key=lambda f: f.at_ms, default=None)
    out.append(_result("I3", i3_found, None if i3_found is None else i3_found.at_ms))
    i4 = check_i4(facts, bound_ms=i4_bound_ms)
    out.append(_result("I4", i4, None if i4 is None else i4.at_ms))
    out.append(_i5(facts))
    if i7:
        q = facts.quiet
        if q is None:
            raise ValueError("I7 was asked for, but the run recorded no quiet-period snapshot (facts.quiet)")
        i7_found = invariants.check_nothing_placeable_pending(q.nodes, q.bookings, q.pending, q.now_ms)
        out.append(_result("I7", i7_found, None if i7_found is None else i7_found.start_ms))
    i8 = invariants.check_billing_conservation(facts.spans, facts.windows, facts.end_ms)
    out.append(_result("I8", i8, None if i8 is None else facts.end_ms))
    q1 = check_q1(facts.batch_runs, facts.quorum)
    out.append(_result("Q1", q1, None if q1 is None else q1.at_ms))
    if facts.health is not None:
        h1 = check_h1(facts.health)
        out.append(_result("H1", h1, None if h1 is None else h1.at_ms))
    if facts.gpu_uses is not None:
        v1 = check_v1(facts.gpu_uses)
        out.append(_result("V1", v1, None if v1 is None else v1.use.at_ms))
    return out


__all__ = [
    "NAMES",
    "Counterexample",
    "DoubleExecution",
    "FalseUnreachable",
    "HeldAndPassed",
    "InvariantResult",
    "NodeDroppedHold",
    "NotConverged",
    "RunAfterJournalLoss",
    "UnbookedBinding",
    "UnderQuorum",
    "WentBack",
    "check_all",
    "check_bound_as_booked",
    "check_i2",
    "check_i3",
    "check_i4",
    "check_node_kept_holds",
    "check_q1",
    "check_spec_order",
    "check_v1",
]
