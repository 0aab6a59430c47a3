"""How a simulated run fills its `FactLog`: the seams it records at, and what it reads from the store at the end.

* **Side effects started** (I2): the narrowest seam that knows the command id is the agent's outbox. The
  dispatcher sends `COMMAND_RUNNING` for a command once per execution, right before it calls the kind's
  executor (`agent.dispatch.Dispatcher._execute`), whether or not a session is open, and every execution
  follows an acceptance, which the journal records (`accept`); the only other RUNNING it sends is a
  re-attach answer for a command this same process is already running (no acceptance before it). So a
  RUNNING for which the process's journal accepted its command once more than RUNNINGs were counted (in
  one agent process: one `RecordingOutbox` and the journal it wraps, `RecordingOutbox.journal`) is one
  side effect started; a journal that lets a command be accepted again (skip-journal-dedupe) shows as a
  second one, even when the two executions interleave. Without the journal wrapped, the outbox falls
  back to its own view, a RUNNING with an ACKED of its command since the last one counted, which misses
  a second acceptance that comes before the first RUNNING (its ACKED is also a re-attach answer's).
  Its kind comes from the store at the end (the command's row).
* **Frames** (I3, I4): `bc.seams.network.SimNetwork.tap`, on every frame a receiver's `recv` returns: a
  `desired_state` the node received is a spec delivery, a `status` the gateway received is a report,
  and any frame the gateway received is hearing from the node (news of when it was sent, for a frame a stall
  held back: `bc.sim.facts`). A `hello` the gateway receives ends the
  node's open outages (the node is back).
* **Batch approvals** (Q1): the same tap keeps, for each command frame of a batch (a body with a batch id)
  a node received, the batch approval it carried; each side effect of such a command becomes a `BatchRan`
  with it at the end, for Q1 to recount by the production rule.
* **Specs applied** (I3): the journal's `store_spec` (`SpecTap`, around each agent process's journal): the
  spec in force and the applied generation move together there, whichever rule let the spec in, so it
  says what the node applied and under which journal id. The recorder also keeps the last desired states
  each node received (by generation) and the generation its open journal holds, so heavy chaos's
  `spec-replay` can send a node a spec older than the one it applies (`Recorder.stale_spec`).
* **Link faults the network draws by itself** (`LinkFaults.drop`: a direction of a connection goes dead
  silently; `reset`: the stream breaks): `bc.seams.network` counts them in `SimNetwork.stats` and tells no
  one, so `LinkWatch` (that Counter) looks, on each such count, for the connection it struck and marks its
  node away until its next Hello, as for the scheduled faults. An adapter: it reads the network's wires.
* **The store, at the end**: command outcomes, connectivity transitions (the events log), bookings of
  every placement, releases (the end events of holds, with their reasons), billing spans and usage
  windows (flushed, and each running hold's open one up to the end, as `bc usage` counts), bindings
  the nodes reported (`reservation.active` to the end of the hold, on the booked atoms), and the holds
  nodes reported released (`node.event` of kind `released`) with when the control plane had decided to end
  each (`reservation.releasing` or an end event); each batch's approve decisions, and the quorum settings in
  force (Q1).
"""

from __future__ import annotations

import json
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.journal_api import AgentJournal, StoredSpec
from agent.journal_rules import Acceptance
from agent.session.outbox import Outbox
from bc.control.capacity.invariants import Release
from bc.control.capacity.placement_pass import bookings_of, load_facts, span_of
from bc.control.capacity.placement_plan import Booking, Wait, plan
from bc.control.capacity.usage_windows import open_window
from bc.control.capacity.views import window_of
from bc.control.quorum.approvers import effective, stored
from bc.protocol.pb import session_pb2
from bc.protocol.pb.session_pb2 import NodeMessage
from bc.seams.network import FROM_NODE, TO_NODE, Direction, SimNetwork
from bc.sim.breaks import DelegatingJournal, OpenJournal
from bc.sim.facts import (
    BatchDecisions,
    BatchRan,
    Bound,
    FactLog,
    NodeRelease,
    QuietSnapshot,
    QuorumHeld,
    connectivity_from_events,
)
from bc.sim.strikes import ACCEPT, START
from bc.store import Store, Tx
from bc.store import capacity as cap_sql
from bc.store import commands as commands_sql
from bc.store import quorum as q_sql
from bc.store import reservations as res_sql

Event = tuple[int, str, str, str, int]
"""An events log row as `SessionPair.events()` reads it: seq, type, subject, data JSON, at_ms."""
Started = Callable[[str, str], None]
"""`started(command_id, boot_id)`: a side effect began in this agent process."""
Accepted = Callable[[str, str], None]
"""`accepted(command_id, kind)`: this agent process's journal accepted the command (the write is done)."""
Moment = Callable[[str, str, str, str], None]
"""`moment(what, node_id, command_id, kind)`: a command was accepted (`bc.sim.strikes.ACCEPT`) or its side
effect started (`START`) on a node: where the run may strike (`bc.sim.strikes`)."""
Applied = Callable[[str, int], None]
"""`applied(journal_id, generation)`: the agent process holds this generation in force in this journal."""
KEPT_SPECS = 8
"""The desired states the recorder keeps per node (its newest generations), for `spec-replay`."""

RELEASE_REASON = {
    "reservation.released": "released",
    "reservation.ended": "window-ended",
    "reservation.failed": "allocation-failed",
    "reservation.lost": "lost",
}
"""The release reason I5 reads for each end event that names none."""
END_EVENTS = ("reservation.released", "reservation.ended", "reservation.failed", "reservation.lost")


class RecordingOutbox(Outbox):
    """The agent's outbox, telling `started` of each RUNNING that follows an acceptance of its command (see
    the module docstring)."""

    def __init__(self, started: Started, accepted: Accepted | None = None) -> None:
        super().__init__()
        self._started = started
        self._accepted = accepted
        self._acked: set[str] = set()  # commands ACKED since their last RUNNING counted
        self._accepts: Counter[str] = Counter()  # acceptances the journal made, not yet matched by a RUNNING
        self._journaled = False  # the process's journal is wrapped: count its acceptances, not ACKs

    def journal(self, open_journal: OpenJournal) -> OpenJournal:
        """The process's journal opener, wrapped so each acceptance it makes is counted here."""
        self._journaled = True

        async def open_counting() -> AgentJournal:
            return _CountingJournal(await open_journal(), self._accepts, self._accepted)

        return open_counting

    async def send(self, msg: NodeMessage) -> None:
        if msg.WhichOneof("msg") == "command_update":
            u = msg.command_update
            if u.state == session_pb2.COMMAND_ACKED:
                self._acked.add(u.command_id)
            elif u.state == session_pb2.COMMAND_RUNNING and self._execution(u.command_id):
                self._started(u.command_id, u.boot_id)
        await super().send(msg)

    def _execution(self, command_id: str) -> bool:
        """A RUNNING starts an execution (not a re-attach answer)."""
        if self._journaled:
            if self._accepts[command_id] <= 0:
                return False
            self._accepts[command_id] -= 1
            return True
        if command_id not in self._acked:
            return False
        self._acked.discard(command_id)
        return True


class _CountingJournal(DelegatingJournal):
    """The agent's journal, counting each command it accepts (after the acceptance is written)."""

    def __init__(self, inner: AgentJournal, accepts: Counter[str], accepted: Accepted | None = None) -> None:
        super().__init__(inner)
        self._accepts = accepts
        self._accepted = accepted

    async def accept(self, a: Acceptance) -> None:
        await super().accept(a)
        self._accepts[a.command_id] += 1
        if self._accepted is not None:
            self._accepted(a.command_id, a.kind)


class SpecTap(DelegatingJournal):
    """The agent's journal, telling `applied` of each spec it stores (once stored)."""

    def __init__(self, inner: AgentJournal, applied: Applied) -> None:
        super().__init__(inner)
        self._applied = applied

    async def store_spec(self, spec: StoredSpec) -> None:
        await super().store_spec(spec)
        self._applied(self.journal_id, spec.generation)


class Recorder:
    """Appends to a `FactLog` as the run goes; `now_ms` is the store's clock (the facts' one time)."""

    def __init__(self, facts: FactLog, now_ms: Callable[[], int]) -> None:
        self.facts, self.now_ms = facts, now_ms
        self.started: list[tuple[int, str, str, str]] = []  # (t_ms, node, command id, boot id); kinds at the end
        self.frames = 0
        self._away: dict[str, set[str]] = {}  # node -> causes of its open outages that its next Hello ends
        self._kinds: dict[tuple[str, str], str] = {}  # (node, command id) a journal of the node accepted -> kind
        self._delivered: set[tuple[str, str]] = set()  # (node, command id) of every command frame delivered
        self._frames: dict[tuple[str, str], object] = {}  # (node, command id) -> its frame, until accepted
        self.accepted_frame: object | None = None
        """The command frame of the acceptance being told to `moment` (its first delivery), if recorded."""
        self.routing: Callable[[str], bool] = lambda gateway: True
        """Whether the gateway process at this address routes now by its own lease rule (`bc.gateway.fence`):
        a frame a fenced gateway reads (a stalled one waking with its lease run out) is no evidence the
        control plane could have had, so I4 does not count it as heard. The runner sets it with several
        gateways."""
        self.moment: Moment | None = None
        """Told of each acceptance and side-effect start, after it is recorded (the run's strikes)."""
        self._specs: dict[str, dict[int, session_pb2.GatewayMessage]] = {}  # node -> generation -> a delivery
        self._holds: dict[str, tuple[str, int]] = {}  # node -> (journal id, generation) its agent holds in force
        self.approvals: dict[tuple[str, str], tuple[str, bytes]] = {}
        """(node, command id) of each batch command frame delivered -> (batch id, the approval it carried)."""

    def outbox(self, node_id: str) -> RecordingOutbox:
        def started(command_id: str, boot_id: str) -> None:
            self.started.append((self.now_ms(), node_id, command_id, boot_id))
            if self.moment is not None:
                self.moment(START, node_id, command_id, self._kinds.get((node_id, command_id), ""))

        def accepted(command_id: str, kind: str) -> None:
            self._kinds[(node_id, command_id)] = kind
            self.accepted_frame = self._frames.pop((node_id, command_id), None)
            if self.moment is not None:
                self.moment(ACCEPT, node_id, command_id, kind)

        return RecordingOutbox(started, accepted)

    def spec_journal(self, node_id: str, open_journal: OpenJournal) -> OpenJournal:
        """The node's journal opener, wrapped so each spec it stores is a `SpecApplied` fact."""

        async def open_tapped() -> AgentJournal:
            journal = await open_journal()
            held = await journal.load_spec()
            self._holds[node_id] = (journal.journal_id, held.generation if held is not None else 0)
            return SpecTap(journal, applied)

        def applied(journal_id: str, generation: int) -> None:
            self._holds[node_id] = (journal_id, generation)
            self.facts.spec_applied(self.now_ms(), node_id, journal_id, generation)

        return open_tapped

    def stale_spec(self, node_id: str) -> session_pb2.GatewayMessage | None:
        """The newest desired state the node received whose generation is below the one its journal holds
        in force now (what a production agent ignores); None: it received none."""
        held = self._holds.get(node_id)
        if held is None:
            return None
        older = [g for g in self._specs.get(node_id, {}) if g < held[1]]
        return self._specs[node_id][max(older)] if older else None

    def away(self, node_id: str, cause: str) -> None:
        """The node cannot reach the gateway from now until its next Hello arrives after `back(...)`."""
        self.facts.outage_began(self.now_ms(), node_id, cause)

    def back(self, node_id: str, cause: str) -> None:
        """What kept the node away is over; its outage ends when the gateway next hears its Hello."""
        self._away.setdefault(node_id, set()).add(cause)

    def tap(
        self,
        direction: Direction,
        node_id: str,
        msg: object,
        loop_time: float,
        gateway: str = "",
        sent_time: float | None = None,
    ) -> None:
        self.frames += 1
        t = self.now_ms()  # the facts' clock is the store's; the loop's only measures how long the frame took
        if direction == TO_NODE:
            if not isinstance(msg, session_pb2.GatewayMessage):
                return
            which = msg.WhichOneof("msg")
            if which == "desired_state":
                body = session_pb2.DesiredStateBody.FromString(msg.desired_state.envelope.body)
                self.facts.spec_delivered(t, node_id, body.generation)
                kept = self._specs.setdefault(node_id, {})
                kept[body.generation] = msg
                if len(kept) > KEPT_SPECS:
                    del kept[min(kept)]
            elif which == "command":
                command = session_pb2.CommandBody.FromString(msg.command.envelope.body)
                key = (node_id, command.id)
                if command.batch_id:
                    self.approvals[key] = (command.batch_id, bytes(msg.command.batch_approval))
                if key in self._delivered:
                    self.facts.redelivered(t, node_id, key[1], accepted=key in self._kinds)
                else:
                    self._frames[key] = msg
                self._delivered.add(key)
            return
        assert direction == FROM_NODE
        if self.routing(gateway):
            sent = None if sent_time is None else t - round((loop_time - sent_time) * 1000)
            self.facts.heard(t, node_id, sent)
        if not isinstance(msg, NodeMessage):
            return
        which = msg.WhichOneof("msg")
        if which == "status":
            self.facts.status_reported(t, node_id, msg.status.observed_generation)
        elif which == "hello":
            for cause in sorted(self._away.pop(node_id, ())):
                self.facts.outage_ended(t, node_id, cause)


class LinkWatch(Counter[str]):
    """`SimNetwork.stats`, calling `struck()` whenever the network draws a dead direction or a reset."""

    STRUCK = ("drops", "resets")

    def __init__(self) -> None:
        super().__init__()
        self.struck: Callable[[], None] | None = None

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        if key in self.STRUCK and self.struck is not None:
            self.struck()


def watch_links(network: SimNetwork, recorder: Recorder) -> None:
    """Mark a node away (until its next Hello) when a link fault the network drew killed its connection."""
    stats = network.stats
    assert isinstance(stats, LinkWatch), "build the SimNetwork with stats=LinkWatch()"
    seen: weakref.WeakSet[object] = weakref.WeakSet()  # the wires already marked (not ids: those are reused)

    def struck() -> None:
        for node_id, wires in network._wires.items():
            for w in wires:
                dead = w.broken is not None or w.to_node.silenced or w.from_node.silenced
                if dead and w not in seen:
                    seen.add(w)
                    recorder.away(node_id, "link")
                    recorder.back(node_id, "link")

    stats.struck = struck


async def from_store(facts: FactLog, recorder: Recorder, store: Store, events: Sequence[Event]) -> None:
    """What the store holds at the end of the run, into `facts` (see the module docstring)."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        kinds = {str(r["id"]): r for r in await commands_sql.list_(tx, limit=1 << 62)}
        reservations = await res_sql.list_(tx, include_released=True)
        placements = [(r, await res_sql.bookings(tx, str(r["id"]))) for r in reservations]
        spans = [span_of(r) for r in await cap_sql.billing_spans(tx)]
        windows = [window_of(r) for r in await cap_sql.usage_windows(tx, None, None)]
        for span in await cap_sql.unflushed_spans(tx):  # and what running holds used since their last flush
            flushed = None if span["flushed_ms"] is None else int(span["flushed_ms"])
            w = open_window(span_of(span), flushed, now_ms)
            if w is not None:
                windows.append(w)
        placed = await load_facts(tx)
        await _quorum(facts, tx)
    for t_ms, node_id, command_id, boot_id in recorder.started:
        cmd = kinds.get(command_id)
        kind = str(cmd["kind"]) if cmd is not None else ""
        facts.side_effect(t_ms, node_id, command_id, kind, boot_id)
        batch_id, approval = recorder.approvals.get((node_id, command_id), ("", b""))
        batch_id = batch_id or (str(cmd["batch_id"] or "") if cmd is not None else "")
        if batch_id:  # a batch's command, whether or not a frame of it was seen (then it carried nothing)
            facts.batch_runs.append(BatchRan(t_ms, node_id, command_id, kind, batch_id, approval))
    for cid in sorted(kinds):
        c = kinds[cid]
        facts.outcome(cid, str(c["node_id"]), str(c["kind"]), str(c["state"]), str(c["reason"]))
    for t in connectivity_from_events(events):
        facts.connectivity_changed(t.t_ms, t.node_id, t.state, t.reason)
    facts.nodes = list(placed.nodes)
    facts.releases = _releases(events)
    facts.bookings = _bookings(placements, {r.reservation_id: r.at_ms for r in facts.releases})
    facts.bound = _bound(facts.bookings, events)
    facts.waited = list(
        dict.fromkeys(subject for _seq, type_, subject, _d, _t in events if type_ == "reservation.waiting")
    )
    facts.node_releases = _node_releases(events, {str(r["allocation_id"]): str(r["id"]) for r in reservations})
    facts.spans, facts.windows = spans, windows
    facts.finish(now_ms)


async def _quorum(facts: FactLog, tx: Tx) -> None:
    """Q1's facts from the store: the quorum settings in force and each batch's approve decisions."""
    held = effective(await stored(tx))
    facts.quorum = QuorumHeld(tuple(held.approver_keys), held.quorum_k)
    for b in sorted(await q_sql.list_batches(tx, limit=1 << 30), key=lambda r: str(r["id"])):
        rows = await q_sql.decisions(tx, str(b["id"]))
        approvals = tuple((str(r["key_id"]), str(r["operator"] or "")) for r in rows if r["decision"] == "approve")
        facts.batch_decisions.append(BatchDecisions(str(b["id"]), approvals))


async def quiet_snapshot(store: Store) -> QuietSnapshot:
    """I7's input after the quiet period: the nodes, the live bookings, and each pending reservation with
    what a pass now would hold for it (`plan`'s `Wait.held`)."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        return await _quiet(tx, now_ms)


async def _quiet(tx: Tx, now_ms: int) -> QuietSnapshot:
    f = await load_facts(tx)
    p = plan(f.nodes, f.bookings, f.pending, now_ms)
    held = {o.reservation_id: o.held for o in p.outcomes if isinstance(o, Wait)}
    pending = tuple((r, held.get(r.reservation_id)) for r in f.pending)
    return QuietSnapshot(tuple(f.nodes), tuple(f.bookings), pending, now_ms)


def _bookings(placements: Sequence[tuple[Any, Sequence[Any]]], released_at: Mapping[str, int]) -> list[Booking]:
    """Each placement's bookings. A booking released before its window started never held anything: the
    store keeps it as a 1 ms stub at its start (`release_bookings`), which is no booking at all here."""
    rows: list[dict[str, Any]] = []
    for res, atoms in placements:
        end = released_at.get(str(res["id"]))
        for a in atoms:
            if end is not None and int(a["start_ms"]) >= end:
                continue
            rows.append(
                {
                    **dict(a),
                    "reservation_id": str(res["id"]),
                    "node_id": str(res["node_id"]),
                    "cpus": res["cpus"],
                    "memory_bytes": res["memory_bytes"],
                    "hugepages_1g": res["hugepages_1g"],
                    "cpu_numa": res["cpu_numa"],
                    "mem_numa": res["mem_numa"],
                }
            )
    return bookings_of(rows)


def _releases(events: Sequence[Event]) -> list[Release]:
    """Every hold that ended on a node, with why, from the events log: released (by an operator unless the
    event names another reason), its window ended, the node failed it, or it was marked lost."""
    out = []
    for _seq, type_, subject, data, at_ms in events:
        if type_ not in END_EVENTS:
            continue
        body = json.loads(data)
        node_id = str(body.get("node_id") or "")
        if not node_id:
            continue  # never placed: nothing was held on a node
        reason = str(body.get("reason") or "") if type_ in ("reservation.released", "reservation.lost") else ""
        out.append(Release(subject, node_id, at_ms, reason or RELEASE_REASON[type_]))
    return out


DECISION_EVENTS = ("reservation.releasing", *END_EVENTS)
"""The control plane deciding a hold ends: before it, the node must keep the hold (reference I5)."""


def _node_releases(events: Sequence[Event], reservation_of: Mapping[str, str]) -> list[NodeRelease]:
    """Each `released` allocation report a node's session delivered (its `node.event`), with when the control
    plane had first decided to end that reservation's hold, if it had by then."""
    decided: dict[str, int] = {}
    out: list[NodeRelease] = []
    for _seq, type_, subject, data, at_ms in events:
        if type_ in DECISION_EVENTS:
            decided.setdefault(subject, at_ms)
        elif type_ == "node.event" and '"released"' in data:
            body = json.loads(data)
            if body.get("kind") != "released":
                continue
            aid = str(body.get("allocation_id") or "")
            rid = reservation_of.get(aid, "")
            out.append(NodeRelease(at_ms, subject, rid, aid, decided.get(rid)))
    return out


def _bound(bookings: Sequence[Booking], events: Sequence[Event]) -> list[Bound]:
    """What the nodes reported binding: from each `reservation.active` (a node's bound report the control
    plane accepted) to the hold's end event, on the atoms its current placement booked."""
    atoms = {(b.reservation_id, b.node_id): b.atoms for b in bookings}
    start: dict[str, tuple[str, int]] = {}
    out: list[Bound] = []
    for _seq, type_, subject, data, at_ms in events:
        if type_ == "reservation.active":
            start.setdefault(subject, (str(json.loads(data).get("node_id", "")), at_ms))
        elif type_ in END_EVENTS and subject in start:
            node_id, t0 = start.pop(subject)
            out.append(Bound(node_id, subject, atoms.get((subject, node_id), ()), t0, max(at_ms, t0 + 1)))
    for rid, (node_id, t0) in sorted(start.items()):
        out.append(Bound(node_id, rid, atoms.get((rid, node_id), ()), t0, None))
    return out
