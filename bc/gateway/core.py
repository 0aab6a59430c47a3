"""The gateway's half of a node session, as an I/O-free state machine.

Theory of operation
-------------------
A session is one bidirectional stream from one node. The core takes the
node's messages (`on_message`) and the adapter's facts (`opened`,
`spec_loaded`, `tick`, `generation_is`) and answers with actions: messages to
send and work the adapter must do against the store. It never awaits, reads
a clock or touches a socket, so the gRPC adapter and the simulator's
in-memory links drive the same code.

States::

    AWAIT_HELLO --Hello--> OPENING --opened(epoch)--> OPEN --(3 missed heartbeats | close)--> CLOSED

* AWAIT_HELLO: the first frame must be `Hello`; anything else is a protocol
  error and closes the stream.
* OPENING: the adapter runs the Hello transaction (bump the epoch, route the
  node here). Frames that arrive meanwhile are queued and replayed in order.
* OPEN: heartbeats keep the session alive (every `heartbeat_interval`, both
  ways; the gateway's carry server time). A full spec goes out when the
  node's applied generation is behind the store's generation and behind what
  this session already sent: at Hello, on a poke, every 10 s as a backstop,
  and on `SpecRequest` (always, whatever was sent before). A `SecretRequest`
  is handed to the secret broker (`AnswerSecret`) as the node sent it.
* Tunnel offers (`offer_tunnel`) go out on the stream only once it is OPEN and only
  when the Hello named `tunnel.offers` (bc.protocol.capabilities), which the
  Welcome then names back; any other session takes its offers on the
  `NodeTunnels.Listen` stream, and the adapter never hands it one.
* Status reports are coalesced latest-wins; `take_status()` hands the adapter
  the newest one, flagged `publish` only when its key differs from the last
  one this session published. `status_due(now)` says when to write: a report
  that says something new goes out at once while the session's write budget
  lasts (a token bucket: bursts of 10, refilled at ten a second), because a
  generation observed is news a controller waits for; an unchanged one about
  once a second. A flapping node costs the store at most ten writes a second,
  and reports that arrive faster than that are coalesced, newest wins.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from bc.errors import ProtocolError
from bc.protocol.capabilities import TUNNEL_OFFERS
from bc.protocol.pb import common_pb2, secrets_pb2, session_pb2, tunnel_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.protocol.status import status_key

MISSED_HEARTBEATS = 3
SILENCE_EPSILON_S = 0.001
BACKSTOP_S = 10.0
STATUS_INTERVAL_S = 1.0  # an unchanged report: about once a second
NEWS_INTERVAL_S = 0.1  # the write budget refills at ten a second ...
STATUS_BURST = 10.0  # ... up to a burst of ten


class State(enum.Enum):
    AWAIT_HELLO = "await-hello"
    OPENING = "opening"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class Send:
    msg: GatewayMessage


@dataclass(frozen=True)
class OpenSession:
    hello: session_pb2.Hello


@dataclass(frozen=True)
class LoadSpec:
    """Read the stored spec envelope and call `spec_loaded` (or nothing if there is none)."""

    reason: str


@dataclass(frozen=True)
class IngestEvents:
    batch: session_pb2.EventBatch


@dataclass(frozen=True)
class ApplyCommandUpdate:
    update: session_pb2.CommandUpdate


@dataclass(frozen=True)
class AnswerSecret:
    """Ask the secret broker (docs/secrets.md) and send the node its answer: ciphertext, or why not."""

    request: secrets_pb2.SecretRequest


@dataclass(frozen=True)
class Close:
    code: str  # a grpc.StatusCode name
    details: str


Action = Send | OpenSession | LoadSpec | IngestEvents | ApplyCommandUpdate | AnswerSecret | Close


@dataclass
class PendingStatus:
    report: session_pb2.StatusReport
    key: str


@dataclass
class GatewaySessionCore:
    node_id: str
    heartbeat_interval_s: float
    now: float  # monotonic seconds at stream start
    state: State = State.AWAIT_HELLO
    epoch: int = 0
    applied_generation: int = 0
    sent_generation: int = 0
    last_heard: float = 0.0
    last_heartbeat_sent: float = 0.0
    last_backstop: float = 0.0
    tunnel_offers: bool = False  # the Hello named `tunnel.offers`: this stream carries the node's tunnel offers
    _queued: list[NodeMessage] = field(default_factory=list)
    _status: PendingStatus | None = None
    _published_key: str = ""
    _status_tokens: float = STATUS_BURST
    _status_refilled: float = 0.0
    _last_status_write: float = float("-inf")

    def __post_init__(self) -> None:
        self.last_heard = self.now
        self.last_backstop = self.now
        self._status_refilled = self.now

    # -- node → gateway ------------------------------------------------
    def on_message(self, msg: NodeMessage, now: float) -> list[Action]:
        self.last_heard = now
        kind = msg.WhichOneof("msg")
        if self.state is State.CLOSED:
            return []
        if self.state is State.AWAIT_HELLO:
            if kind != "hello":
                raise ProtocolError(f"can't handle {kind} in state {self.state.value}: the first frame must be Hello")
            hello = msg.hello
            if hello.node_id and hello.node_id != self.node_id:
                return [
                    Close(
                        "UNAUTHENTICATED",
                        f"Hello names node {hello.node_id!r} but the certificate is node {self.node_id!r}",
                    )
                ]
            self.applied_generation = hello.applied_generation
            self.tunnel_offers = TUNNEL_OFFERS in hello.capabilities
            self.state = State.OPENING
            return [OpenSession(hello)]
        if self.state is State.OPENING:
            self._queued.append(msg)
            return []
        return self._on_open_message(msg, kind)

    def _on_open_message(self, msg: NodeMessage, kind: str | None) -> list[Action]:
        if kind == "hello":
            raise ProtocolError("can't handle hello in state open: a session says Hello once")
        if kind == "heartbeat":
            self.applied_generation = max(self.applied_generation, msg.heartbeat.applied_generation)
            return []
        if kind == "status":
            rep = msg.status
            self.applied_generation = max(self.applied_generation, rep.applied_generation)
            self._status = PendingStatus(rep, status_key(rep))
            return []
        if kind == "spec_request":
            return [LoadSpec("spec-request")]
        if kind == "event_batch":
            return [IngestEvents(msg.event_batch)]
        if kind == "command_update":
            return [ApplyCommandUpdate(msg.command_update)]
        if kind == "secret_request":
            return [AnswerSecret(msg.secret_request)]
        raise ProtocolError(f"can't handle {kind} in state {self.state.value}")

    # -- adapter facts -------------------------------------------------
    def opened(
        self,
        epoch: int,
        generation: int,
        server_time_ms: int,
        trust: common_pb2.TrustBundle,
        gateway_id: str,
        inventory_hash: str = "",
        trust_envelope: common_pb2.Envelope | None = None,
    ) -> list[Action]:
        """The Hello transaction committed: welcome the node, send its spec if it is behind, replay."""
        if self.state is not State.OPENING:
            raise ProtocolError(f"can't handle opened in state {self.state.value}")
        self.state = State.OPEN
        self.epoch = epoch
        welcome = GatewayMessage(
            welcome=session_pb2.Welcome(
                server_time_ms=server_time_ms,
                session_epoch=epoch,
                heartbeat_interval_ms=int(self.heartbeat_interval_s * 1000),
                trust=trust,
                gateway_id=gateway_id,
                inventory_hash=inventory_hash,
                capabilities=[TUNNEL_OFFERS] if self.tunnel_offers else [],
            )
        )
        if trust_envelope is not None:
            welcome.welcome.trust_envelope.CopyFrom(trust_envelope)
        out: list[Action] = [Send(welcome)]
        if generation > self.applied_generation:
            out.append(LoadSpec("hello"))
        queued, self._queued = self._queued, []
        for m in queued:
            out.extend(self._on_open_message(m, m.WhichOneof("msg")))
        return out

    def generation_is(self, generation: int, reason: str) -> list[Action]:
        """A poke or the backstop: the store's generation for this node is `generation`.

        A poke sends a generation once per session; the backstop sends it again
        while the node still reports an older one (a frame lost, or a spec the
        node refused on the way: it gets the stored bytes again).
        """
        if self.state is not State.OPEN:
            return []
        if generation > self.applied_generation and (generation > self.sent_generation or reason == "backstop"):
            return [LoadSpec(reason)]
        return []

    def spec_loaded(self, generation: int, envelope: common_pb2.Envelope) -> list[Action]:
        if self.state is not State.OPEN:
            return []
        self.sent_generation = max(self.sent_generation, generation)
        return [Send(GatewayMessage(desired_state=session_pb2.DesiredState(envelope=envelope)))]

    def offer_tunnel(self, offer: tunnel_pb2.TunnelOffer) -> list[Action]:
        """An operator's tunnel for this node (bc.gateway.tunnels): the offer goes out on an open session that
        takes offers; otherwise nothing (the offer's wait for the node's answer then runs out, as an offer to a
        Listen stream that ended does)."""
        if self.state is not State.OPEN or not self.tunnel_offers:
            return []
        return [Send(GatewayMessage(tunnel_offer=offer))]

    def tick(self, now: float, server_time_ms: int) -> list[Action]:
        """Timers: heartbeats out, three missed heartbeats close the session."""
        if self.state is State.CLOSED:
            return []
        if now - self.last_heard > MISSED_HEARTBEATS * self.heartbeat_interval_s:
            self.state = State.CLOSED
            return [Close("UNAVAILABLE", f"no frame from the node for {MISSED_HEARTBEATS} heartbeat intervals")]
        out: list[Action] = []
        if self.state is State.OPEN and now - self.last_heartbeat_sent >= self.heartbeat_interval_s:
            self.last_heartbeat_sent = now
            out.append(Send(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=server_time_ms))))
        return out

    def next_due(self, now: float) -> float:
        """Seconds until a timer of this core fires: a heartbeat to send, the silence that closes the session,
        the spec backstop. The adapter sleeps this long unless a frame, a poke or a status wakes it, so an
        idle session costs nothing between its timers."""
        if self.state is State.CLOSED:
            return BACKSTOP_S
        # The silence rule is strict (`>`): wake just past its instant, not at it.
        due = self.last_heard + MISSED_HEARTBEATS * self.heartbeat_interval_s + SILENCE_EPSILON_S - now
        if self.state is State.OPEN:
            due = min(
                due,
                self.last_heartbeat_sent + self.heartbeat_interval_s - now,
                self.last_backstop + BACKSTOP_S - now,
            )
        return max(0.0, due)

    def backstop_due(self, now: float) -> bool:
        if self.state is State.OPEN and now - self.last_backstop >= BACKSTOP_S:
            self.last_backstop = now
            return True
        return False

    @property
    def has_status(self) -> bool:
        return self._status is not None

    @property
    def status_is_new(self) -> bool:
        """The pending report says something the last written one did not (its key differs)."""
        return self._status is not None and self._status.key != self._published_key

    def status_due(self, now: float) -> float | None:
        """Seconds until the pending report should be written (0: now), or None when nothing is pending."""
        if self._status is None:
            return None
        self._refill(now)
        if self.status_is_new:
            return 0.0 if self._status_tokens >= 1 else (1 - self._status_tokens) * NEWS_INTERVAL_S
        return max(0.0, self._last_status_write + STATUS_INTERVAL_S - now)

    def _refill(self, now: float) -> None:
        self._status_tokens = min(STATUS_BURST, self._status_tokens + (now - self._status_refilled) / NEWS_INTERVAL_S)
        self._status_refilled = now

    def note_status_written(self, now: float) -> None:
        self._refill(now)
        self._status_tokens = max(0.0, self._status_tokens - 1)
        self._last_status_write = now

    def take_status(self) -> tuple[session_pb2.StatusReport, bool] | None:
        """The newest unwritten report, and whether it says something new."""
        if self._status is None:
            return None
        p, self._status = self._status, None
        new = p.key != self._published_key
        self._published_key = p.key
        return p.report, new

    def close(self) -> None:
        self.state = State.CLOSED
