"""What a simulated run records for the invariant checkers, and `FactLog`, the recorder the runner appends to.

Every time is the store's (the loop's) clock in integer milliseconds: the facts are what the simulator saw
happen, never what a skewed node or gateway clock said. The runner records as the run goes (side effects
from the fake hardware, frames from the link taps, faults from chaos) and reads the rest from the store at
the end (outcomes, connectivity transitions, bookings, releases, usage). The capacity facts are the input
types of `bc.control.capacity.invariants` as they are, so I1, I5, I7 and I8 run the capacity checkers themselves.

Memory: at 10,000 nodes over hours the frames the gateway hears are the one fact that grows with every
heartbeat. I4 needs only "did the gateway hear from this node less than W before T", and frames closer together
than W answer that as well as one span of them does: a T inside a span is less than the gap after some frame
of it. So `FactLog` keeps per node the spans of frames each less than `heard_gap_ms` after the one before
(a node that heartbeats without a break is one span); the I4 bound must be at least that gap for the answer
to stay exact (the checker asserts it).

A frame is news of the node at the moment it was *sent*; the gateway learns it at delivery. Nearly every frame
arrives within milliseconds, and those count at their delivery (later than sent by less than `LATE_MS`: the
stricter reading). A frame a stall held back (a frozen gateway, a stalled link) can arrive long after: such a
*late* frame is kept apart, with both times, and I4 counts it only for a mark after its delivery, as news of
its send time: a gateway waking from a 50 s stall reads frames its nodes sent before they lost power, and that
is no evidence they were alive since (found by `bc sim --chaos storm --gateways 3`, seeds 5, 12, 37). Late
frames are rare, so the list stays short.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bc.control.capacity.invariants import Release, Transition
from bc.control.capacity.placement_plan import Booking, NodeInfo, Request
from bc.control.capacity.usage_windows import Span, UsageWindow
from bc.protocol.atoms import Atom
from bc.protocol.pb import common_pb2
from bc.sim.health_facts import HealthFacts

# ---- commands (I2) ----


@dataclass(frozen=True)
class SideEffect:
    """A command's side effect STARTED on a node (the fake hardware records it as it begins)."""

    t_ms: int
    node_id: str
    command_id: str
    kind: str
    boot_id: str


@dataclass(frozen=True)
class NodeRelease:
    """A node reported it released a reservation's hold (its `released` allocation report reached the store at
    `t_ms`); `decided_ms`: when the control plane had decided to end that hold (released, ended, failed,
    lost), None if it never had by then."""

    t_ms: int
    node_id: str
    reservation_id: str
    allocation_id: str
    decided_ms: int | None


@dataclass(frozen=True)
class Redelivery:
    """A command frame reached a node that had been sent it before (a duplicate frame, a replay after a
    reconnect or a crash): I2's dangerous moment, where the journal must find it rather than run it again.
    `accepted`: a journal of the node had accepted it by then."""

    t_ms: int
    node_id: str
    command_id: str
    accepted: bool


@dataclass(frozen=True)
class JournalLoss:
    """The node's journal was lost; `in_flight`: the commands the lost journal held `accepted` or `running`
    (the runner reads them from the old journal as it drops it; they are the ones I2 says never run again)."""

    t_ms: int
    node_id: str
    old_journal_id: str
    new_journal_id: str
    in_flight: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentRestart:
    """The node's agent process started again (after a crash, or a reboot when `boot_changed`)."""

    t_ms: int
    node_id: str
    boot_changed: bool


@dataclass(frozen=True)
class Outcome:
    """A command's final state as the store holds it at the end of the run."""

    command_id: str
    node_id: str
    kind: str
    state: str  # succeeded | failed | expired | cancelled | ... (bc.control.commands.states)
    reason: str


# ---- specs and liveness (I3, I4) ----


@dataclass(frozen=True)
class SpecDelivered:
    """A DesiredState (a spec of `generation`) reached the agent (the link tap on the node's end)."""

    t_ms: int
    node_id: str
    generation: int
    seq: int = 0  # the order the taps saw it in, among deliveries and reports (0 in hand-made facts)


@dataclass(frozen=True)
class StatusReported:
    """A status frame saying `observed_generation` reached the gateway (the link tap on the gateway's end)."""

    t_ms: int
    node_id: str
    observed_generation: int
    seq: int = 0  # as SpecDelivered.seq: a report in the same virtual instant as a delivery can follow it


@dataclass(frozen=True)
class SpecApplied:
    """The agent applied a spec of `generation`, written to its journal `journal_id` (the journal's
    `store_spec`: the spec in force and the applied generation move together)."""

    t_ms: int
    node_id: str
    journal_id: str
    generation: int
    seq: int = 0  # as SpecDelivered.seq: after the delivery that brought it, in the same virtual instant


LATE_MS = 1_000
"""A frame delivered this long or more after it was sent is a late one (see the module docstring)."""


@dataclass(frozen=True)
class HeardFrom:
    """Some frame from the node reached the gateway. `FactLog.heard` keeps these as spans, not one by one."""

    t_ms: int
    node_id: str


@dataclass(frozen=True)
class HeardSpan:
    """Frames from a node from `first_ms` to `last_ms`, each less than the log's `heard_gap_ms` after the one
    before it."""

    node_id: str
    first_ms: int
    last_ms: int


@dataclass(frozen=True)
class Connectivity:
    """The node's connectivity changed to `state` (a `node.connectivity` event of the store's log)."""

    t_ms: int
    node_id: str
    state: str  # connected | disconnected | unreachable | lost
    reason: str = ""


@dataclass(frozen=True)
class Outage:
    """The node could not reach the gateway from `start_ms` to `end_ms` (None: still at the end): a partition,
    a half-open link, its agent down, the control plane down. `node_id` None: every node (the control plane
    or the gateway was down). The runner knows these; I3 does not ask a node to report while in one."""

    start_ms: int
    end_ms: int | None
    node_id: str | None
    cause: str

    def overlaps(self, node_id: str, start_ms: int, end_ms: int) -> bool:
        if self.node_id is not None and self.node_id != node_id:
            return False
        return self.start_ms <= end_ms and (self.end_ms is None or self.end_ms >= start_ms)


# ---- capacity (I1 bindings; I1, I5, I7, I8 run the capacity checkers on the types they take) ----


@dataclass(frozen=True)
class Bound:
    """A node reported holding `atoms` for a reservation from `start_ms` to `end_ms` (None: still at the end)."""

    node_id: str
    reservation_id: str
    atoms: tuple[Atom, ...]
    start_ms: int
    end_ms: int | None

    def as_booking(self) -> Booking:
        """The binding as a booking, so the capacity overlap check (I1) runs on what nodes bound as well."""
        return Booking(self.reservation_id, self.node_id, self.atoms, self.start_ms, self.end_ms)


@dataclass(frozen=True)
class QuietSnapshot:
    """The capacity state after the quiet period at the end of a run, for I7: the nodes as placement sees
    them, the bookings, and each pending reservation with what its pass holds for it."""

    nodes: tuple[NodeInfo, ...]
    bookings: tuple[Booking, ...]
    pending: tuple[tuple[Request, Booking | None], ...]
    now_ms: int


# ---- the destructive-batch quorum (Q1) ----


@dataclass(frozen=True)
class BatchRan:
    """A command of a destructive batch started on a node (a `SideEffect` whose command has a batch id), with
    the batch approval its command frame carried to the node (b"" when no frame of it was seen)."""

    t_ms: int
    node_id: str
    command_id: str
    kind: str
    batch_id: str
    approval: bytes


@dataclass(frozen=True)
class BatchDecisions:
    """A batch's approve decisions as the store holds them at the end: (key id, operator) each, in order."""

    batch_id: str
    approvals: tuple[tuple[str, str], ...]

    @property
    def repeats(self) -> bool:
        """One key, or one operator, approved it more than once (Q1's dangerous situation)."""
        keys = [k for k, _ in self.approvals]
        operators = [o for _, o in self.approvals if o]
        return len(set(keys)) < len(keys) or len(set(operators)) < len(operators)


@dataclass(frozen=True)
class QuorumHeld:
    """The quorum settings in force (the store's, at the end: the workload sets them only as it starts): the
    approver keys and k."""

    approvers: tuple[common_pb2.ApproverKey, ...]
    k: int


# ---- the recorder ----


@dataclass(frozen=True)
class GpuUse:
    """One node's GPUs at one instant (`bc sim --instances`, `bc.sim.instances.sample`): those its CDI holds
    name, and those passed through to a VM (GPU -> instance), read from its machine's files."""

    at_ms: int
    node_id: str
    held: frozenset[str]
    passed: tuple[tuple[str, str], ...]


@dataclass
class FactLog:
    """Everything a run recorded. The runner appends with the methods below; the checkers read the fields."""

    heard_gap_ms: int = 20_000
    late_ms: int = LATE_MS
    side_effects: list[SideEffect] = field(default_factory=list)
    journal_losses: list[JournalLoss] = field(default_factory=list)
    restarts: list[AgentRestart] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    deliveries: list[SpecDelivered] = field(default_factory=list)
    reports: list[StatusReported] = field(default_factory=list)
    applied: list[SpecApplied] = field(default_factory=list)
    connectivity: list[Connectivity] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    redeliveries: list[Redelivery] = field(default_factory=list)
    node_releases: list[NodeRelease] = field(default_factory=list)
    waited: list[str] = field(default_factory=list)
    """Reservations the placement pass made wait (a `reservation.waiting`), each once."""
    batch_runs: list[BatchRan] = field(default_factory=list)
    batch_decisions: list[BatchDecisions] = field(default_factory=list)
    quorum: QuorumHeld | None = None
    """None: not recorded (hand-made facts); Q1 then has nothing to count against."""
    # capacity, in bc.control.capacity.invariants' own types
    nodes: list[NodeInfo] = field(default_factory=list)
    bookings: list[Booking] = field(default_factory=list)
    bound: list[Bound] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    windows: list[UsageWindow] = field(default_factory=list)
    quiet: QuietSnapshot | None = None
    end_ms: int = 0
    health: HealthFacts | None = None
    """`bc sim --health` only (`bc.sim.health_record`); None: H1 is not checked."""
    gpu_uses: list[GpuUse] | None = None
    """`bc sim --instances` only (`bc.sim.instances`); None: V1 is not checked."""
    # per node: parallel sorted lists of span starts and ends (see the module docstring)
    _heard_first: dict[str, list[int]] = field(default_factory=dict, repr=False)
    _heard_last: dict[str, list[int]] = field(default_factory=dict, repr=False)
    # per node: (delivered, sent) of each late frame
    _heard_late: dict[str, list[tuple[int, int]]] = field(default_factory=dict, repr=False)
    _open_outages: dict[tuple[str | None, str], int] = field(default_factory=dict, repr=False)
    # per node: the observed generation of the last report kept, and the deliveries no kept report came after
    _last_observed: dict[str, int] = field(default_factory=dict, repr=False)
    _unanswered: dict[str, list[tuple[int, int]]] = field(default_factory=dict, repr=False)
    _tap_seq: int = field(default=0, repr=False)

    # -- appends

    def side_effect(self, t_ms: int, node_id: str, command_id: str, kind: str, boot_id: str) -> None:
        self.side_effects.append(SideEffect(t_ms, node_id, command_id, kind, boot_id))

    def redelivered(self, t_ms: int, node_id: str, command_id: str, *, accepted: bool) -> None:
        self.redeliveries.append(Redelivery(t_ms, node_id, command_id, accepted))

    def journal_loss(
        self, t_ms: int, node_id: str, old_journal_id: str, new_journal_id: str, in_flight: Iterable[str] = ()
    ) -> None:
        self.journal_losses.append(JournalLoss(t_ms, node_id, old_journal_id, new_journal_id, tuple(in_flight)))

    def agent_restart(self, t_ms: int, node_id: str, boot_changed: bool) -> None:
        self.restarts.append(AgentRestart(t_ms, node_id, boot_changed))
        self._last_observed.pop(node_id, None)  # I3 reads the first report of the new agent: keep it

    def outcome(self, command_id: str, node_id: str, kind: str, state: str, reason: str) -> None:
        self.outcomes.append(Outcome(command_id, node_id, kind, state, reason))

    def spec_delivered(self, t_ms: int, node_id: str, generation: int) -> None:
        self._tap_seq += 1
        self.deliveries.append(SpecDelivered(t_ms, node_id, generation, self._tap_seq))
        self._unanswered.setdefault(node_id, []).append((t_ms, self._tap_seq))

    def status_reported(self, t_ms: int, node_id: str, observed_generation: int) -> None:
        """A status report reached the gateway. Kept only when it can tell I3 something new: another observed
        generation than the node's last kept report, or the first report after a delivery (I3 counts reports
        strictly after their delivery, in the taps' order). Any other report repeats the last kept one, which
        is itself after every delivery before it, so it answers the same deliveries. Appends come in time order
        (the tap)."""
        self._tap_seq += 1
        waiting = self._unanswered.get(node_id, [])
        if self._last_observed.get(node_id) == observed_generation and not waiting:
            return
        self._last_observed[node_id] = observed_generation
        self._unanswered[node_id] = []  # every delivery the taps saw so far came before this report
        self.reports.append(StatusReported(t_ms, node_id, observed_generation, self._tap_seq))

    def spec_applied(self, t_ms: int, node_id: str, journal_id: str, generation: int) -> None:
        self._tap_seq += 1
        self.applied.append(SpecApplied(t_ms, node_id, journal_id, generation, self._tap_seq))

    def connectivity_changed(self, t_ms: int, node_id: str, state: str, reason: str = "") -> None:
        self.connectivity.append(Connectivity(t_ms, node_id, state, reason))

    def heard(self, t_ms: int, node_id: str, sent_ms: int | None = None) -> None:
        """A frame from the node, sent at `sent_ms` (None: at `t_ms`), reached the gateway at `t_ms`: extend its
        last span, or start one after a silence; a late frame is kept apart (see the module docstring)."""
        if sent_ms is not None and t_ms - sent_ms >= self.late_ms:
            self._heard_late.setdefault(node_id, []).append((t_ms, sent_ms))
            return
        firsts = self._heard_first.setdefault(node_id, [])
        lasts = self._heard_last.setdefault(node_id, [])
        if lasts and lasts[-1] <= t_ms:  # the common case: frames arrive in time order
            if t_ms - lasts[-1] < self.heard_gap_ms:
                lasts[-1] = t_ms
            else:
                firsts.append(t_ms)
                lasts.append(t_ms)
            return
        self._heard_insert(firsts, lasts, t_ms)

    def _heard_insert(self, firsts: list[int], lasts: list[int], t_ms: int) -> None:
        """Out of order (or the first frame): insert, then merge the neighbours it now bridges."""
        i = bisect.bisect_right(firsts, t_ms)
        firsts.insert(i, t_ms)
        lasts.insert(i, t_ms)
        j = i
        if j > 0 and t_ms - lasts[j - 1] < self.heard_gap_ms:  # joins the span before
            lasts[j - 1] = max(lasts[j - 1], t_ms)
            del firsts[j], lasts[j]
            j -= 1
        while j + 1 < len(firsts) and firsts[j + 1] - lasts[j] < self.heard_gap_ms:  # reaches the next
            lasts[j] = max(lasts[j], lasts[j + 1])
            del firsts[j + 1], lasts[j + 1]

    def outage(self, start_ms: int, end_ms: int | None, node_id: str | None, cause: str) -> None:
        self.outages.append(Outage(start_ms, end_ms, node_id, cause))

    def outage_began(self, t_ms: int, node_id: str | None, cause: str) -> None:
        """An outage starts now; `outage_ended` with the same node and cause closes it."""
        self._open_outages.setdefault((node_id, cause), t_ms)

    def outage_ended(self, t_ms: int, node_id: str | None, cause: str) -> None:
        start = self._open_outages.pop((node_id, cause), None)
        if start is not None:
            self.outages.append(Outage(start, t_ms, node_id, cause))

    def finish(self, end_ms: int) -> None:
        """The run ended at `end_ms`: outages still open stay open-ended."""
        self.end_ms = end_ms
        for (node_id, cause), start in sorted(self._open_outages.items(), key=lambda kv: (kv[1], str(kv[0]))):
            self.outages.append(Outage(start, None, node_id, cause))
        self._open_outages.clear()

    # -- reads

    def heard_spans(self, node_id: str) -> list[HeardSpan]:
        firsts = self._heard_first.get(node_id, [])
        lasts = self._heard_last.get(node_id, [])
        return [HeardSpan(node_id, f, la) for f, la in zip(firsts, lasts, strict=True)]

    def last_heard(self, node_id: str, t_ms: int) -> HeardSpan | None:
        """The last span of frames from the node that began at or before `t_ms` (it may run on past it: then
        some frame of it came less than `heard_gap_ms` before `t_ms`). None: nothing heard from it by then."""
        firsts = self._heard_first.get(node_id, [])
        i = bisect.bisect_right(firsts, t_ms) - 1
        if i < 0:
            return None
        return HeardSpan(node_id, firsts[i], self._heard_last[node_id][i])

    def last_late(self, node_id: str, t_ms: int) -> tuple[int, int] | None:
        """(delivered, sent) of the late frame delivered at or before `t_ms` that was sent last; None: none."""
        best: tuple[int, int] | None = None
        for delivered, sent in self._heard_late.get(node_id, ()):
            if delivered > t_ms:
                continue
            if best is None or sent > best[1]:
                best = (delivered, sent)
        return best

    def transitions(self) -> list[Transition]:
        """The connectivity changes as I5's `Transition`s."""
        return [Transition(c.node_id, c.t_ms, c.state) for c in self.connectivity]


def release_fact(reservation_id: str, node_id: str, state: str, reason: str, at_ms: int) -> Release | None:
    """A reservation's end, as the store's row says it (state, reason, and when), as I5's `Release`; None when
    it is not a release (still live, or failed before any node held it). The store writes a reason only where
    one is not implied: a node's `released` report leaves it empty (the operator's release), a window's end
    writes `window-ended`, and a hold a node failed is the node's decision (`allocation-failed`, whatever
    reason it gave). A component that releases for any other reason must write it, and I5 refuses it."""
    if state == "released":
        return Release(reservation_id, node_id, at_ms, reason or "released")
    if state == "ended":
        return Release(reservation_id, node_id, at_ms, reason or "window-ended")
    if state == "failed" and node_id:
        return Release(reservation_id, node_id, at_ms, "allocation-failed")
    return None


def connectivity_from_events(events: Sequence[tuple[int, str, str, str, int]]) -> list[Connectivity]:
    """The `node.connectivity` events of a store's log (`SessionPair.events()` rows: seq, type, subject, data
    JSON, at_ms) as `Connectivity` facts, in log order."""
    out: list[Connectivity] = []
    for _seq, type_, subject, data, at_ms in events:
        if type_ != "node.connectivity":
            continue
        body = json.loads(data)
        out.append(Connectivity(at_ms, subject, str(body.get("state", "")), str(body.get("reason", ""))))
    return out


__all__ = [
    "AgentRestart",
    "BatchDecisions",
    "BatchRan",
    "Bound",
    "Connectivity",
    "FactLog",
    "HeardFrom",
    "HeardSpan",
    "JournalLoss",
    "NodeRelease",
    "Outage",
    "Outcome",
    "QuietSnapshot",
    "QuorumHeld",
    "Redelivery",
    "SideEffect",
    "SpecApplied",
    "SpecDelivered",
    "StatusReported",
    "connectivity_from_events",
    "release_fact",
]
