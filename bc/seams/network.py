"""The one in-memory network: session streams with seeded faults and partitions, on the loop's clock.

`SimNetwork` carries every in-process session: `bc sim`'s fleet and gateway processes (`bc.sim.fleet`,
`bc.sim.gateways`), the in-process harness (`bc.sim.pair.SessionPair`) and the tests; `link_pair()` is one
fault-free connection of it for a test that plays the gateway itself.

Theory of operation
-------------------
The session protocol is written for gRPC: one bidirectional stream per session, each direction ordered
and reliable for as long as the stream lives. What the real network does to such a stream is therefore
not "lose frame 7 and carry on"; it is one of:

* **latency**: every frame arrives late by a varying amount, but in order (TCP, then HTTP/2);
* **a dead connection**: from some frame on, nothing more arrives in one direction and nobody is told
  (a blackholed route, a NAT that forgot the flow, a peer whose host froze). Only the heartbeat rules
  (three missed intervals, `agent.session_core` and `bc.gateway.core`) notice it;
* **a reset**: the stream breaks and both ends are told (RST, GOAWAY, a proxy restarting): each end's
  `recv` raises `LinkClosed("UNAVAILABLE")` and the node redials;
* **a stall**: a GC pause, a retransmission timeout, a congested link: frames are held, then all arrive
  at once, in order.

So a `drop` drawn for a frame is modelled as the first of these: that frame and every later one in the
same direction are lost silently (`LinkFaults.drop`), and a `reset` drawn for a frame breaks the stream
(`LinkFaults.reset`). A frame lost *inside* a stream that then goes on would be a fault no gRPC stream
shows, and one the protocol is not built for: results, events and acks are sent once per session and
resent only by the next session's Hello and flush, so such a loss stalls progress until the next
reconnect (it never breaks safety, but a checker of convergence would rightly fail).

Duplicates and reordering really happen one level up: a result resent in the next session's Hello, a
command replayed after a reconnect, a stale session's frame arriving after the new session's. The
protocol produces those itself whenever a stream dies, so drops and resets already exercise them. The
issue also asks for duplicates and reordering *within* a stream, as a harder stress than the real
world: `LinkFaults.duplicate` delivers a frame twice, `LinkFaults.reorder` lets a frame be overtaken by
the next one in its direction. The session cores tolerate that for most messages (read from the cores):

* node -> gateway: heartbeats (the applied generation is a max); a duplicated status report (the same
  report again, latest-wins); command updates (results are facts, applied by the state table, acked by
  id); spec requests (answered with the stored spec); a duplicated event batch (events at or under the
  cumulative ack are skipped).
* gateway -> node: heartbeats and acks (the time mark only moves forward; acks are cumulative or by id);
  desired state (a generation not above the applied one is ignored; a patch on the wrong base asks for
  a full spec); commands and cancels (the journal's duplicate rules; a cancel that overtakes its command
  finds nothing to cancel and the real outcome wins, as for a cancel that arrives after the start);
  revocations (the session ends); a duplicated trust bundle (the same bundle again is "unchanged").

Not tolerated, by design or by finding, and so never overtaken (`TOLERANT` leaves them out; a test may
put them back to show why); Hello and Welcome are never duplicated either:

* `hello` and `welcome`: a session says Hello once and is welcomed once, first; a second one, or a frame
  before Welcome, is a `ProtocolError` that ends the session (safe: the node redials, but it is noise).
* `event_batch` overtaken: the gateway acks events cumulatively (`bc.gateway.ingest`), so a batch that
  overtakes an earlier one advances the ack past the earlier batch's events, which are then skipped
  when they arrive and dropped by the node when it reads the ack: **the events are lost**. A gRPC stream
  never reorders, so this is no bug in production; it is why in-stream reordering is not the real
  world's fault (`test_finding_event_batches_overtaken_in_a_stream_lose_the_earlier_events` in
  tests/unit/sim/test_sim_links.py shows it through the real agent and gateway). A duplicated batch is
  fine (the copy is ingested after the original, so its events are at or under the ack and skipped), so
  `event_batch` is in `DUPLICABLE_ONLY`.
* `status` overtaken: the gateway keeps the last report it received (latest-wins), and an agent sends a
  status only when it says something new (`agent.session.outbox.status_key`), so an older report that
  overtook a newer one would be the control plane's view until the node's next change. A duplicate is
  fine: `status` is in `DUPLICABLE_ONLY`.
* `trust` overtaken: the gateway pushes a changed bundle once per session (`push_trust_if_changed`), and
  `agent.trust.decide_bundle` checks an offered bundle's signature and that the quorum settings' version
  does not go back, not that the bundle is newer than the one held. So an older bundle that overtook a
  newer one would be held until the next Welcome, with the old command-signing roots (read from the
  code, not run). Duplicates are fine (the same bundle again is "unchanged"): `trust` is in
  `DUPLICABLE_ONLY` too.

The list above is read from the cores and checked end to end: three real agents and the gateway under 30%
duplicates and 30% reordering of those kinds keep every session (none ends), converge every spec, bind
every reservation and run every command exactly once (in tests/unit/sim/test_sim_links.py:
`test_in_stream_duplicates_and_reordering_never_end_a_session_nor_run_a_command_twice`).

The stale send one level up is also made to happen on purpose: `SimNetwork.replay(node_id, frame)` (a
control, heavy chaos's `spec-replay` in `bc.sim.chaos`) delivers a desired state the node was sent before
on its live connection again, after newer ones: the agent must ignore a generation not above its own.

Partitions (`SimNetwork.partition`) lose every frame in the cut direction, also one sent before the cut
that arrives after it, and refuse new dials (a TCP handshake needs both directions). A frame that reached
the receiver's queue before the cut is delivered (the harness's former `FaultyLink` dropped it when read,
so `python -m bc.sim.pair` digests moved once when the harness came onto this network). A
half-open link (`SimNetwork.half_open`) loses everything in flight and to come on that connection,
closes included: each end sees silence, never a close. Closes travel in order behind the frames sent
before them, and are lost the same way frames are.

What the checkers hear: `tap(direction, node_id, msg, loop_time, gateway, sent_time)` runs when a receiver's
`recv` returns a frame (what the session code saw, when it saw it: a dead process hears nothing; and when it
was sent, since a frame held by a stall is news of the moment it left, not of its delivery); `on_drawn(kind,
node_id, loop_time)` when the links draw a fault by themselves, once it is in effect. `stats` counts
those faults and the frames they lost; the controls (`partition`, `half_open`, `reset`, `stall`) are the
caller's and are not counted.

Cost. A frame on a fault-free link with nothing in flight is appended to the receiver's queue at once
(no timer, no task, no draw; one clock read, its send time). A faulty frame costs its draws and, while frames are in
flight, one loop timer per direction (the head's arrival): no task is ever created per frame. Measured
on the virtual loop (one sender, one reader, 2 shared cores, best of 5): fault-free about 250-750k
frames/s against a bare pair of asyncio queues' 330-550k (the same, within the host's noise); with `light`'s latency
about 150-220k, `heavy`'s 130-200k, where every frame waits on a timer.

Every draw comes from the `random.Random` the network is given, in the order frames are sent; on the
virtual loop the order of sends is a function of the seed, so the same seed gives the same fates.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from bc.protocol import closing
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.seams.link import Link, LinkClosed

if TYPE_CHECKING:
    from bc.gateway.sessions import Gateway
    from bc.pki.identity import PeerIdentity

In = TypeVar("In")
Out = TypeVar("Out")

Direction = Literal["to_node", "from_node"]
TO_NODE: Direction = "to_node"
FROM_NODE: Direction = "from_node"

Tap = Callable[[Direction, str, object, float, str, float], None]
"""`tap(direction, node_id, msg, loop_time, gateway, sent_time)`: called when a receiver's `recv` returns a frame;
`gateway` is the address of the gateway process the wire reaches ("" with one gateway), `sent_time` the loop time
its sender sent it (a replayed frame: when it was replayed)."""

TOLERANT: frozenset[str] = frozenset(
    {
        "heartbeat",
        "command_update",
        "spec_request",
        "desired_state",
        "ack",
        "command",
        "cancel",
        "revocation",
    }
)
"""Message kinds (the `msg` oneof of either direction) that may be duplicated or overtaken in a stream."""

DUPLICABLE_ONLY: frozenset[str] = frozenset({"event_batch", "trust", "status"})
"""Kinds that may be duplicated but never overtaken (the cumulative event ack, the trust bundle pushed once,
the status sent once per change; see the module docstring)."""


@dataclass(frozen=True)
class LinkFaults:
    """What happens to each frame of one node's links, per direction; probabilities are per frame."""

    delay_ms: tuple[float, float] = (0.0, 0.0)
    """Uniform latency per frame; frames still arrive in order (a later frame never lands before an earlier)."""
    drop: float = 0.0
    """The frame and every later one in its direction are lost silently: a dead connection."""
    reset: float = 0.0
    """The stream breaks at this frame: both ends' `recv` raise `LinkClosed("UNAVAILABLE")`."""
    duplicate: float = 0.0
    """The frame arrives twice (kinds in `tolerant` or `duplicable`)."""
    reorder: float = 0.0
    """The frame is held and overtaken by the next one in its direction (kinds in `tolerant`)."""
    reorder_window_ms: float = 50.0
    """A held frame that no later frame overtakes within this long goes on alone."""
    stall: float = 0.0
    """The direction stalls at this frame for `stall_ms`: frames are held, then arrive in order."""
    stall_ms: tuple[float, float] = (0.0, 0.0)
    tolerant: frozenset[str] = TOLERANT
    duplicable: frozenset[str] = DUPLICABLE_ONLY
    quiet: bool = field(init=False, repr=False, compare=False)
    """No fault and no latency: frames go straight through without a draw (computed once: read per frame)."""

    def __post_init__(self) -> None:
        quiet = self.delay_ms[1] <= 0 and not (self.drop or self.reset or self.duplicate or self.reorder or self.stall)
        object.__setattr__(self, "quiet", quiet)

    @classmethod
    def none(cls) -> LinkFaults:
        return cls()

    @classmethod
    def light(cls) -> LinkFaults:
        """A healthy datacenter network: a few ms of latency, a dead connection per thousand frames."""
        return cls(delay_ms=(0.5, 5.0), drop=0.001, reset=0.0002, stall=0.0005, stall_ms=(100.0, 1000.0))

    @classmethod
    def heavy(cls) -> LinkFaults:
        """A bad WAN: up to ~200 ms of latency, 1% of frames kill their direction, 1% duplicated or overtaken."""
        return cls(
            delay_ms=(1.0, 200.0),
            drop=0.01,
            reset=0.002,
            duplicate=0.01,
            reorder=0.01,
            reorder_window_ms=200.0,
            stall=0.002,
            stall_ms=(500.0, 5000.0),
        )


@dataclass(frozen=True)
class _Close:
    """A close travelling down a direction, behind the frames sent before it."""

    code: str
    details: str
    reason: CloseReason
    retry_after_ms: int | None = None

    def error(self) -> LinkClosed:
        return LinkClosed(self.code, self.details, self.reason, self.retry_after_ms)


def _kind(msg: object) -> str | None:
    which: Callable[[str], str | None] | None = getattr(msg, "WhichOneof", None)
    return which("msg") if which is not None else None


class _Pipe:
    """One direction of one connection: frames in flight (arrival times never decrease) and frames arrived,
    each with the loop time it was sent."""

    __slots__ = (
        "arrived_close",
        "delivered",
        "direction",
        "held",
        "held_timer",
        "in_flight",
        "last_due",
        "loop",
        "ready",
        "receiver_closed",
        "silenced",
        "stall_until",
        "timer",
        "waiter",
        "wire",
    )

    def __init__(self, wire: _Wire, direction: Direction) -> None:
        self.wire, self.direction = wire, direction
        self.loop = wire.loop
        self.in_flight: deque[tuple[float, float, object]] = deque()  # (due, sent, frame)
        self.timer: asyncio.TimerHandle | None = None
        self.ready: deque[tuple[float, object]] = deque()  # (sent, frame)
        self.waiter: asyncio.Future[None] | None = None
        self.last_due = 0.0
        self.stall_until = 0.0  # this direction's own stall (a drawn one); the node's is on the network
        self.silenced = False  # a drop was drawn: nothing more gets through
        self.held: tuple[float, float, object] | None = None  # (due, sent, frame) waiting to be overtaken
        self.held_timer: asyncio.TimerHandle | None = None
        self.arrived_close: _Close | None = None
        self.receiver_closed = False
        self.delivered = False  # the receiver read a frame (to a node: the Welcome came first)

    # -- sending -------------------------------------------------------------------------
    def push(self, item: object) -> None:
        w = self.wire
        net = w.net
        if self.silenced or w.lost(self.direction):
            net.stats["frames_lost"] += 1
            return
        f = net.node_faults.get(w.node_id, net.faults) if net.node_faults else net.faults
        now = self.loop.time()
        if f.quiet and not (self.in_flight or self.held or self.stall_until or net.stalled or self.receiver_closed):
            # The common case, kept to a few attribute reads: straight to the receiver.
            self.ready.append((now, item))
            waiter = self.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        if f.quiet and not self.in_flight and self.held is None and w.stalled_until(self) <= now:
            self._arrive(now, item)
            return
        self._push_faulty(item, f, now)

    def _push_faulty(self, item: object, f: LinkFaults, now: float) -> None:
        w = self.wire
        net = w.net
        rng = net.rng
        # The draws, always in this order, whatever the outcome: the same sends make the same fates. Each
        # drawn fault is counted once its effect is in place, so whoever watches the count can see it.
        if f.drop and rng.random() < f.drop:
            self.silenced = True
            net.drew("drops", w)
            return
        if f.reset and rng.random() < f.reset:
            w.break_stream("the stream was reset")
            net.drew("resets", w)
            return
        lo, hi = f.delay_ms
        due = now + (rng.uniform(lo, hi) / 1000.0 if hi > 0 else 0.0)
        if f.stall and rng.random() < f.stall:
            self.stall_until = max(self.stall_until, now + rng.uniform(*f.stall_ms) / 1000.0)
            net.drew("stalls", w)
        due = max(due, self.last_due, w.stalled_until(self))
        dup = bool(f.duplicate) and rng.random() < f.duplicate
        reorder = bool(f.reorder) and rng.random() < f.reorder
        if dup or reorder:
            kind = _kind(item)
            if kind is not None:
                dup = dup and (kind in f.tolerant or kind in f.duplicable)
                reorder = reorder and kind in f.tolerant
        held, self.held = self.held, None
        if held is not None:  # this frame overtakes the one held for it
            if self.held_timer is not None:
                self.held_timer.cancel()
                self.held_timer = None
            self._enqueue(due, now, item)
            self._enqueue(max(due, held[0]), held[1], held[2])
            net.drew("reorders", w)
        elif reorder:
            self.held = (due, now, item)
            self.held_timer = self.loop.call_at(due + f.reorder_window_ms / 1000.0, self._release_held)
        else:
            self._enqueue(due, now, item)
        if dup:
            self._enqueue(due, now, copy.deepcopy(item))
            net.drew("duplicates", w)

    def push_close(self, close: _Close) -> None:
        """A close is a frame that no fault draws touch: it follows what was sent before it, or is lost with it."""
        if self.silenced or self.wire.lost(self.direction):
            return
        if self.held is not None:
            if self.held_timer is not None:
                self.held_timer.cancel()
            self._release_held()
        now = self.loop.time()
        if not self.in_flight and self.wire.stalled_until(self) <= now:
            self._arrive(now, close)
        else:
            self._enqueue(max(now, self.last_due, self.wire.stalled_until(self)), now, close)

    def push_replay(self, item: object) -> None:
        """A frame sent again from elsewhere (`SimNetwork.replay`): behind what is in flight, no fault drawn."""
        if self.silenced or self.wire.lost(self.direction):
            self.wire.net.stats["frames_lost"] += 1
            return
        now = self.loop.time()
        if not self.in_flight and self.held is None and self.wire.stalled_until(self) <= now:
            self._arrive(now, item)
        else:
            self._enqueue(max(now, self.wire.stalled_until(self)), now, item)

    def _release_held(self) -> None:
        held, self.held = self.held, None
        self.held_timer = None
        if held is not None:
            self._enqueue(max(held[0], self.last_due), held[1], held[2])

    def _enqueue(self, due: float, sent: float, item: object) -> None:
        due = max(due, self.last_due)
        self.last_due = due
        self.in_flight.append((due, sent, item))
        if self.timer is None:
            self.timer = self.loop.call_at(due, self._fire)

    # -- arriving ------------------------------------------------------------------------
    def _fire(self) -> None:
        self.timer = None
        now = self.loop.time()
        stalled = self.wire.stalled_until(self)
        if stalled > now:  # a stall began after these frames left: they wait for its end
            self.timer = self.loop.call_at(stalled, self._fire)
            return
        while self.in_flight and self.in_flight[0][0] <= now:
            _due, sent, item = self.in_flight.popleft()
            if self.wire.lost(self.direction):  # cut while in flight: lost too
                self.wire.net.stats["frames_lost"] += 1
                continue
            self._arrive(sent, item)
        if self.in_flight:
            self.timer = self.loop.call_at(self.in_flight[0][0], self._fire)

    def _arrive(self, sent: float, item: object) -> None:
        if self.receiver_closed:  # nobody will read it: the end that would have is closed
            return
        if isinstance(item, _Close):
            if self.arrived_close is not None:
                return
            self.arrived_close = item
        self.ready.append((sent, item))
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def break_now(self, close: _Close) -> None:
        """A reset: whatever was in flight or unread is gone, and the receiver reads the close next."""
        for t in (self.timer, self.held_timer):
            if t is not None:
                t.cancel()
        self.timer = self.held_timer = None
        self.held = None
        self.in_flight.clear()
        self.ready.clear()
        self.receiver_closed = False
        self.arrived_close = None
        self._arrive(self.loop.time(), close)


class _Wire:
    """One connection (one dial) of one node: two pipes and what the network says about them. `gateway`: the
    address of the gateway process it reaches ("" with one gateway), whose own stall holds it too."""

    def __init__(self, net: SimNetwork, node_id: str, gateway: str = "") -> None:
        self.net, self.node_id, self.gateway = net, node_id, gateway
        self.loop = asyncio.get_running_loop()
        self.to_node = _Pipe(self, TO_NODE)
        self.from_node = _Pipe(self, FROM_NODE)
        self.half_open = False
        self.broken: _Close | None = None
        self.ends_closed = 0

    def faults(self) -> LinkFaults:
        return self.net.node_faults.get(self.node_id, self.net.faults)

    def lost(self, direction: Direction) -> bool:
        if self.half_open or self.broken is not None:
            return True
        net = self.net
        if not (net.partitioned or net.cut_to_node or net.cut_from_node):
            return False  # the common case: no partition anywhere
        node = self.node_id
        return node in net.partitioned or node in (net.cut_to_node if direction == TO_NODE else net.cut_from_node)

    def stalled_until(self, pipe: _Pipe) -> float:
        """Until when `pipe` is held (0.0: not); stalls that are over are forgotten, so the fast path returns."""
        now = self.loop.time()
        if pipe.stall_until and pipe.stall_until <= now:
            pipe.stall_until = 0.0
        stalled = self.net.stalled
        until = stalled.get(self.node_id, 0.0)
        if until and until <= now:
            del stalled[self.node_id]
            until = 0.0
        if self.gateway:  # a paused gateway process reads and writes nothing: its connections hold too
            held = stalled.get(self.gateway, 0.0)
            if held and held <= now:
                del stalled[self.gateway]
                held = 0.0
            until = max(until, held)
        return max(pipe.stall_until, until)

    def break_stream(self, details: str) -> None:
        if self.broken is not None:
            return
        self.broken = _Close("UNAVAILABLE", details, closing.UNSPECIFIED)
        self.to_node.break_now(self.broken)
        self.from_node.break_now(self.broken)

    @property
    def live(self) -> bool:
        return self.broken is None and not self.half_open and self.ends_closed < 2


class SimLink(Generic[In, Out]):
    """One end of a simulated connection: reads one pipe, writes the other (see the module docstring)."""

    __slots__ = ("_closed", "_in", "_out", "_wire")

    def __init__(self, wire: _Wire, inbound: _Pipe, outbound: _Pipe) -> None:
        self._wire, self._in, self._out = wire, inbound, outbound
        self._closed: _Close | None = None

    async def send(self, msg: Out) -> None:
        ended = self._closed or self._wire.broken or self._in.arrived_close
        if ended is not None:  # our own close, a reset, or the peer's close that reached us
            raise ended.error()
        self._out.push(msg)

    async def recv(self) -> In | None:
        pipe = self._in
        while not pipe.ready:
            fut: asyncio.Future[None] = pipe.loop.create_future()
            pipe.waiter = fut
            try:
                await fut
            finally:
                pipe.waiter = None
        sent, item = pipe.ready[0]
        if isinstance(item, _Close):
            raise item.error()  # left at the head: every later recv says the same
        pipe.ready.popleft()
        pipe.delivered = True
        tap = self._wire.net.tap
        if tap is not None:
            tap(pipe.direction, self._wire.node_id, item, pipe.loop.time(), self._wire.gateway, sent)
        return item  # type: ignore[return-value]

    async def close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        if self._closed is not None:
            return
        self._closed = _Close(code, details, reason, retry_after_ms)
        self._wire.ends_closed += 1
        self._in.receiver_closed = True
        self._in.ready.clear()
        if self._wire.broken is None:
            self._out.push_close(self._closed)


Dial = Callable[[], Awaitable[Link[GatewayMessage, NodeMessage]]]
Wrap = Callable[[str, Link[NodeMessage, GatewayMessage]], Link[NodeMessage, GatewayMessage]]
Serve = Callable[[Link[NodeMessage, GatewayMessage], "PeerIdentity"], Coroutine[object, object, None]]
"""What the server's side runs on an admitted connection: `serve(gateway's end, the node's peer identity)`."""


@dataclass(eq=False)
class SimNetwork:
    """Every node's route to the gateway, with seeded faults (see the module docstring).

    `gateway` is the one gateway `dialer(node_id)` reaches (None: the control plane is down, dials are
    refused); a fleet of gateway processes dials through `start_session` with its own rotation
    (`bc.sim.gateways`). `peers` are the nodes' identities as their certificates say, `sessions` the
    server-side tasks, `dials` the dials per node; `partitioned` is a live set (cut both ways). The
    controls below act at once on live connections and on later dials. `rng` drives every draw (with
    `LinkFaults.none()` nothing is drawn).
    """

    rng: random.Random
    faults: LinkFaults = field(default_factory=LinkFaults.none)
    """Every node's faults, unless `node_faults` names the node."""
    tap: Tap | None = None
    partitioned: set[str] = field(default_factory=set)
    gateway: Gateway | None = None
    peers: dict[str, PeerIdentity] = field(default_factory=dict)
    sessions: set[asyncio.Task[None]] = field(default_factory=set)
    dials: Counter[str] = field(default_factory=Counter)
    wrap: Wrap | None = None
    """What a compromised gateway would run between its session driver and the node: wraps the gateway's end."""
    node_faults: dict[str, LinkFaults] = field(default_factory=dict)
    cut_to_node: set[str] = field(default_factory=set)
    cut_from_node: set[str] = field(default_factory=set)
    stalled: dict[str, float] = field(default_factory=dict)
    """Node -> loop time until which its frames are held."""
    stats: Counter[str] = field(default_factory=Counter)
    """What the links did by themselves: the faults they drew (drops, resets, stalls, duplicates, reorders) and
    what was lost or refused (frames_lost, dials_refused). The controls are not counted: the caller chose them."""
    on_drawn: Callable[[str, str, float], None] | None = None
    """`on_drawn(kind, node_id, loop_time)`: the links drew a fault by themselves ("drops", "resets",
    "stalls", "duplicates", "reorders"), already in effect; what the controls do is the caller's to know."""
    _wires: dict[str, list[_Wire]] = field(default_factory=dict, init=False, repr=False)

    # -- connections ---------------------------------------------------------------------
    def connect(
        self, node_id: str, gateway: str = ""
    ) -> tuple[SimLink[GatewayMessage, NodeMessage], SimLink[NodeMessage, GatewayMessage]]:
        """A new connection for `node_id` (to the gateway process at `gateway`, when there are several), dial
        rules aside: (the node's end, the gateway's end)."""
        wire = _Wire(self, node_id, gateway)
        live = [w for w in self._wires.get(node_id, ()) if w.live]
        live.append(wire)
        self._wires[node_id] = live
        node_end: SimLink[GatewayMessage, NodeMessage] = SimLink(wire, wire.to_node, wire.from_node)
        gateway_end: SimLink[NodeMessage, GatewayMessage] = SimLink(wire, wire.from_node, wire.to_node)
        return node_end, gateway_end

    def refuses(self, node_id: str) -> bool:
        """No route: the gateway is down, or the node is cut off either way (a handshake needs both)."""
        return self.gateway is None or self.cut_off(node_id)

    def cut_off(self, node_id: str) -> bool:
        """The node is partitioned either way: no handshake gets through."""
        return node_id in self.partitioned or node_id in self.cut_to_node or node_id in self.cut_from_node

    def dialer(self, node_id: str) -> Dial:
        async def dial() -> Link[GatewayMessage, NodeMessage]:
            self.dials[node_id] += 1
            gateway = self.gateway
            if gateway is None or self.refuses(node_id):
                self.stats["dials_refused"] += 1
                raise ConnectionRefusedError(f"no route to the gateway from {node_id}")
            return self.start_session(node_id, gateway.serve)

        return dial

    def start_session(
        self, node_id: str, serve: Serve, gateway: str = "", *, also: Iterable[set[asyncio.Task[None]]] = ()
    ) -> SimLink[GatewayMessage, NodeMessage]:
        """A dial that got through: a new connection whose gateway's end (wrapped by `wrap`, when set) `serve`
        runs in a task kept in `sessions` (and in each set of `also`). Returns the node's end."""
        node_end, gateway_end = self.connect(node_id, gateway)
        served: Link[NodeMessage, GatewayMessage] = gateway_end
        if self.wrap is not None:
            served = self.wrap(node_id, served)
        task = asyncio.create_task(serve(served, self.peers[node_id]), name=f"session-{node_id}")
        for group in (self.sessions, *also):
            group.add(task)
            task.add_done_callback(group.discard)
        return node_end

    def deliver_again(self, node_id: str, frame: object, after_s: float) -> bool:
        """A copy of `frame` reaches the node again `after_s` from now (after what is in flight), on its newest
        live connection: a late duplicate aimed at one moment (`bc.sim.strikes`), where `LinkFaults.duplicate`
        draws its copies at random and delivers them right behind the original. False: no live connection."""
        live = self._live(node_id)
        if not live:
            return False
        pipe = live[-1].to_node
        now = pipe.loop.time()
        pipe._enqueue(now + after_s, now, copy.deepcopy(frame))
        self.stats["duplicates"] += 1
        return True

    def _live(self, node_id: str) -> list[_Wire]:
        return [w for w in self._wires.get(node_id, ()) if w.live]

    def drew(self, kind: str, wire: _Wire) -> None:
        """A fault the links drew on `wire`, in effect now: count it, and tell `on_drawn`."""
        self.stats[kind] += 1
        if self.on_drawn is not None:
            self.on_drawn(kind, wire.node_id, wire.loop.time())

    # -- controls ------------------------------------------------------------------------
    def set_gateway(self, gateway: Gateway | None) -> None:
        """None: the control plane is down and every dial is refused (live sessions are the gateway's to end)."""
        self.gateway = gateway

    def set_faults(self, node_id: str, faults: LinkFaults | None) -> None:
        """This node's faults from its next frame on; None: the network's default again."""
        if faults is None:
            self.node_faults.pop(node_id, None)
        else:
            self.node_faults[node_id] = faults

    def partition(self, nodes: Iterable[str], direction: Literal["both", "to_node", "from_node"] = "both") -> None:
        """Lose every frame in `direction` (in flight included) and refuse dials, until `heal`."""
        target = {"both": self.partitioned, "to_node": self.cut_to_node, "from_node": self.cut_from_node}[direction]
        target.update(nodes)

    def heal(self, nodes: Iterable[str] | None = None) -> None:
        """End the partitions of `nodes` (all when None). A half-open or reset connection stays dead."""
        names = None if nodes is None else set(nodes)  # read once: it may be an iterator
        for cut in (self.partitioned, self.cut_to_node, self.cut_from_node):
            if names is None:
                cut.clear()
            else:
                cut.difference_update(names)

    def half_open(self, node_id: str) -> None:
        """The node's live connections die silently: each end sees silence, never a close. Dials still work."""
        for w in self._live(node_id):
            w.half_open = True

    def reset(self, node_id: str) -> None:
        """The node's live connections break: both ends' `recv` raise `LinkClosed("UNAVAILABLE")`."""
        for w in self._live(node_id):
            w.break_stream("the stream was reset")

    def replay(self, node_id: str, frame: GatewayMessage) -> bool:
        """A copy of `frame`, sent to the node before, arrives again on its newest live connection that has
        delivered a frame to it (so after its Welcome), behind what is in flight there: a stale session's or
        a zombie gateway's send. False: no such connection (the frame goes nowhere)."""
        live = [w for w in self._live(node_id) if w.to_node.delivered]
        if not live:
            return False
        live[-1].to_node.push_replay(copy.deepcopy(frame))
        return True

    def break_gateway(self, gateway: str) -> list[str]:
        """The gateway process at `gateway` died: every live connection to it breaks (the kernel resets its
        sockets). Returns the nodes whose connections broke, sorted."""
        struck: set[str] = set()
        for node_id, wires in self._wires.items():
            for w in wires:
                if w.gateway == gateway and w.live:
                    w.break_stream("the gateway's connection was reset")
                    struck.add(node_id)
        return sorted(struck)

    def nodes_on(self, gateway: str) -> list[str]:
        """The nodes with a live connection to the gateway process at `gateway`, sorted."""
        return sorted(n for n, wires in self._wires.items() if any(w.gateway == gateway and w.live for w in wires))

    def stall(self, node_id: str, seconds: float) -> None:
        """Hold the node's frames both ways for `seconds` from now (in flight and new), then deliver them in order.
        A gateway's address stalls every connection to that gateway process the same way."""
        loop = asyncio.get_running_loop()
        until = max(self.stalled.get(node_id, 0.0), loop.time() + seconds)
        self.stalled[node_id] = until
        loop.call_at(until, self._unstall, node_id, until)  # while any stall is on, every frame takes the slow path

    def _unstall(self, node_id: str, until: float) -> None:
        if self.stalled.get(node_id) == until:
            del self.stalled[node_id]


def link_pair(
    node_id: str = "node",
) -> tuple[SimLink[GatewayMessage, NodeMessage], SimLink[NodeMessage, GatewayMessage]]:
    """One fault-free connection on a network of its own, for a test that plays the gateway itself:
    (the node's end, the gateway's end). Call it on the running loop."""
    return SimNetwork(random.Random(0)).connect(node_id)
