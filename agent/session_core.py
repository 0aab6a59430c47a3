"""The agent's half of a node session, as an I/O-free state machine.

Theory of operation
-------------------
The core says Hello, takes the gateway's frames and answers with effects the
adapter carries out (journal writes, a re-converge, a close). It reads no
clock: the adapter passes the local wall time in, and the core keeps the
offset to server time from Welcome and heartbeats.

States::

    HELLO_SENT --Welcome--> OPEN --(silence for 3 heartbeat intervals | revocation | close)--> CLOSED

Rules it enforces:

* The server time mark only moves forward, and a Welcome whose server time is
  more than 5 minutes before the mark is refused: a gateway cannot wind the
  node's clock back into an expired signer's window. The mark never runs more
  than those 5 minutes ahead of the host's own clock, so a gateway cannot
  push it so far forward that every honest Welcome after it is refused.
* A DesiredState body for another node, or with a generation not above the
  one held, is ignored (`decide_spec`, the core's `spec_rule` unless a test
  or the simulator hands it another). One that would be applied must pass `spec_check`
  (the signature, once the node holds command-signing roots), else it is
  rejected and not applied. A node whose held spec is unusable asks for a
  full one with SpecRequest(NO_SPEC) as soon as it is welcomed. A patch whose base is not the applied generation is
  answered with SpecRequest(PATCH_BASE_MISMATCH). The spec hash is echoed,
  never recomputed.
* Ack for this journal drops acknowledged events; an Ack for another
  journal id is ignored. Acked command ids stop the replay of their results.
* Commands and cancels are handed to the dispatcher (`agent/dispatch.py`),
  which owns the journal's duplicate rules and the acceptance checks.
* A tunnel offer (`tunnel_offer`) is handed to the node's tunnels
  (`TunnelOffered`, agent.tunnel.service), which verify its ticket themselves.
  Welcome says which session capabilities the gateway answered
  (`Welcomed.capabilities`): with `tunnel.offers` the offers come on this
  stream, else on the tunnels' own Listen stream (an older gateway).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from bc.errors import ProtocolError
from bc.protocol.pb import common_pb2, secrets_pb2, session_pb2, spec_pb2, tunnel_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage

REWIND_LIMIT_MS = 5 * 60 * 1000
MISSED_HEARTBEATS = 3
SILENCE_EPSILON_S = 0.001
WELCOME_TIMEOUT_S = 15.0


class State(enum.Enum):
    HELLO_SENT = "hello-sent"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class Send:
    msg: NodeMessage


@dataclass(frozen=True)
class AdvanceTimeMark:
    server_time_ms: int


@dataclass(frozen=True)
class Welcomed:
    epoch: int
    offset_ms: int  # server time minus local wall time
    heartbeat_interval_s: float
    trust: common_pb2.TrustBundle
    inventory_hash: str
    trust_envelope: common_pb2.Envelope | None = None
    capabilities: tuple[str, ...] = ()  # what the gateway answered of the Hello's (bc.protocol.capabilities)


@dataclass(frozen=True)
class AcceptSpec:
    generation: int
    spec_hash: str
    spec: spec_pb2.NodeSpec
    body: bytes
    signature: bytes
    key_id: str


@dataclass(frozen=True)
class IgnoredSpec:
    reason: str


@dataclass(frozen=True)
class RejectedSpec:
    """A spec that would have been applied but whose signature does not hold: logged, reported, not applied."""

    generation: int
    reason: str
    body: bytes


@dataclass(frozen=True)
class TrustOffered:
    """A signed trust bundle mid-session; the adapter holds it only as agent.trust allows."""

    envelope: common_pb2.Envelope


@dataclass(frozen=True)
class AckEvents:
    upto_seq: int


@dataclass(frozen=True)
class AckResults:
    command_ids: list[str]


@dataclass(frozen=True)
class DeliverCommand:
    command: session_pb2.Command


@dataclass(frozen=True)
class DeliverCancel:
    cancel: session_pb2.Cancel


@dataclass(frozen=True)
class SecretAnswered:
    """The broker's answer to a SecretRequest (agent.secrets): ciphertext or a refusal."""

    response: secrets_pb2.SecretResponse


@dataclass(frozen=True)
class SecretRotated:
    """A secret the spec names was set anew: ask again (agent.secrets)."""

    name: str
    version: int


@dataclass(frozen=True)
class TunnelOffered:
    """An operator's tunnel, offered on the session (agent.tunnel.service verifies its ticket)."""

    offer: tunnel_pb2.TunnelOffer


@dataclass(frozen=True)
class Close:
    reason: str
    redial: bool = True


Effect = (
    Send
    | AdvanceTimeMark
    | Welcomed
    | AcceptSpec
    | IgnoredSpec
    | RejectedSpec
    | TrustOffered
    | AckEvents
    | AckResults
    | DeliverCommand
    | DeliverCancel
    | SecretAnswered
    | SecretRotated
    | TunnelOffered
    | Close
)


SpecRule = Callable[[session_pb2.DesiredStateBody, str, int, spec_pb2.NodeSpec | None], spec_pb2.NodeSpec | str]
"""`rule(body, node_id, applied_generation, applied_spec)`: the full spec to apply, or why the body is ignored."""


def decide_spec(
    body: session_pb2.DesiredStateBody, node_id: str, applied_generation: int, applied_spec: spec_pb2.NodeSpec | None
) -> spec_pb2.NodeSpec | str:
    """The new full spec to apply, or why the body is ignored (a pure rule, unit-tested on its own)."""
    if body.node_id != node_id:
        return f"body for node {body.node_id!r}"
    if body.generation <= applied_generation:
        return f"generation {body.generation} is not above the applied {applied_generation}"
    which = body.WhichOneof("content")
    if which == "full":
        return body.full
    if which == "patch":
        if body.base_generation != applied_generation or applied_spec is None:
            return "patch-base-mismatch"
        spec = spec_pb2.NodeSpec()
        spec.CopyFrom(applied_spec)
        for fd, value in body.patch.sections.ListFields():
            getattr(spec, fd.name).CopyFrom(value)
        for name in body.patch.cleared:
            if name in spec_pb2.NodeSpec.DESCRIPTOR.fields_by_name:
                spec.ClearField(name)
        return spec
    return "body carries no spec"


@dataclass
class AgentSessionCore:
    node_id: str
    role: str
    boot_id: str
    journal_id: str
    incarnation_id: str
    applied_generation: int
    applied_spec_hash: str
    time_mark_ms: int
    capabilities: list[str] = field(default_factory=list)
    inventory_hash: str = ""
    state: State = State.HELLO_SENT
    epoch: int = 0
    heartbeat_interval_s: float = 10.0
    offset_ms: int = 0
    last_heard: float = 0.0
    last_heartbeat_sent: float = 0.0
    applied_spec: spec_pb2.NodeSpec | None = None
    inventory: common_pb2.Inventory | None = None  # sent in Hello only when the server's hash differs
    server_inventory_hash: str = ""
    # The signature check for specs (agent.trust): envelope and server time in seconds -> why it fails, or None.
    spec_check: Callable[[common_pb2.Envelope, float], str | None] | None = None
    # The quorum check of root-equivalent changes (agent.spec_quorum): body, new spec, held spec, server time in
    # ms -> why it is refused, or None.
    root_check: (
        Callable[[session_pb2.DesiredStateBody, spec_pb2.NodeSpec, spec_pb2.NodeSpec | None, int], str | None] | None
    ) = None
    # The held spec was unusable (missing, or unsigned while roots are held): ask for a full one once welcomed.
    need_spec: bool = False
    # Which delivered spec is applied: the production rule; a seam so the simulator can show a broken one caught.
    spec_rule: SpecRule = decide_spec

    def hello(
        self,
        now_mono: float,
        agent_version: str = "",
        unacked_results: list[session_pb2.CommandUpdate] | None = None,
        running_command_ids: list[str] | None = None,
    ) -> NodeMessage:
        self.last_heard = now_mono
        return NodeMessage(
            hello=session_pb2.Hello(
                node_id=self.node_id,
                boot_id=self.boot_id,
                journal_id=self.journal_id,
                applied_generation=self.applied_generation,
                applied_spec_hash=self.applied_spec_hash,
                capabilities=self.capabilities,
                inventory_hash=self.inventory_hash,
                role=self.role,
                agent_version=agent_version,
                incarnation_id=self.incarnation_id,
                inventory=self.inventory if self.inventory_hash != self.server_inventory_hash else None,
                unacked_results=unacked_results or [],
                running_command_ids=running_command_ids or [],
            )
        )

    def server_now_ms(self, local_wall_ms: int) -> int:
        return local_wall_ms + self.offset_ms

    def on_message(self, msg: GatewayMessage, now_mono: float, local_wall_ms: int) -> list[Effect]:
        self.last_heard = now_mono
        kind = msg.WhichOneof("msg")
        if self.state is State.CLOSED:
            return []
        if self.state is State.HELLO_SENT:
            if kind == "revocation":
                return self._revoked(msg.revocation)
            if kind != "welcome":
                raise ProtocolError(f"can't handle {kind} in state {self.state.value}: Welcome comes first")
            return self._welcome(msg.welcome, local_wall_ms)
        if kind == "heartbeat":
            return self._server_time(msg.heartbeat.server_time_ms, local_wall_ms)
        if kind == "desired_state":
            return self._desired_state(msg.desired_state, local_wall_ms)
        if kind == "ack":
            out: list[Effect] = []
            if msg.ack.command_ids:
                out.append(AckResults(list(msg.ack.command_ids)))
            if msg.ack.event_seq and (not msg.ack.journal_id or msg.ack.journal_id == self.journal_id):
                out.append(AckEvents(msg.ack.event_seq))
            return out
        if kind == "command":
            return [DeliverCommand(msg.command)]
        if kind == "cancel":
            return [DeliverCancel(msg.cancel)]
        if kind == "revocation":
            return self._revoked(msg.revocation)
        if kind == "trust":
            return [TrustOffered(msg.trust)]
        if kind == "secret_response":
            return [SecretAnswered(msg.secret_response)]
        if kind == "secret_rotated":
            return [SecretRotated(msg.secret_rotated.name, msg.secret_rotated.version)]
        if kind == "tunnel_offer":
            return [TunnelOffered(msg.tunnel_offer)]
        if kind == "welcome":
            raise ProtocolError("can't handle welcome in state open: a session is welcomed once")
        return []

    def _welcome(self, w: session_pb2.Welcome, local_wall_ms: int) -> list[Effect]:
        if w.server_time_ms < self.time_mark_ms - REWIND_LIMIT_MS:
            self.state = State.CLOSED
            return [
                Close(
                    f"refusing Welcome: server time {w.server_time_ms} is more than 5 minutes before the time mark"
                    f" {self.time_mark_ms}"
                )
            ]
        self.state = State.OPEN
        self.epoch = w.session_epoch
        if w.heartbeat_interval_ms > 0:
            self.heartbeat_interval_s = w.heartbeat_interval_ms / 1000
        self.offset_ms = w.server_time_ms - local_wall_ms
        self.server_inventory_hash = w.inventory_hash
        out: list[Effect] = [
            Welcomed(
                w.session_epoch,
                self.offset_ms,
                self.heartbeat_interval_s,
                w.trust,
                w.inventory_hash,
                w.trust_envelope if w.HasField("trust_envelope") else None,
                tuple(w.capabilities),
            )
        ]
        out.extend(self._server_time(w.server_time_ms, local_wall_ms))
        if self.need_spec:
            reason = session_pb2.SpecRequest.NO_SPEC
            out.append(Send(NodeMessage(spec_request=session_pb2.SpecRequest(have_generation=0, reason=reason))))
        return out

    def _server_time(self, server_time_ms: int, local_wall_ms: int) -> list[Effect]:
        if server_time_ms <= 0:
            return []
        self.offset_ms = server_time_ms - local_wall_ms
        # Welcome and heartbeats are not signed: a gateway that could push the mark far ahead would
        # make every honest Welcome after it "more than 5 minutes before the mark", cutting the node
        # off for good. The mark never runs ahead of this host's clock by more than the rewind limit.
        mark = min(server_time_ms, local_wall_ms + REWIND_LIMIT_MS)
        if mark > self.time_mark_ms:
            self.time_mark_ms = mark
            return [AdvanceTimeMark(mark)]
        return []

    def _desired_state(self, ds: session_pb2.DesiredState, local_wall_ms: int) -> list[Effect]:
        body = session_pb2.DesiredStateBody()
        try:
            body.ParseFromString(ds.envelope.body)
        except DecodeError:
            return [IgnoredSpec("body does not decode")]
        decided = self.spec_rule(body, self.node_id, self.applied_generation, self.applied_spec)
        if decided == "patch-base-mismatch":
            return [
                IgnoredSpec("patch base mismatch"),
                Send(
                    NodeMessage(
                        spec_request=session_pb2.SpecRequest(
                            have_generation=self.applied_generation, reason=session_pb2.SpecRequest.PATCH_BASE_MISMATCH
                        )
                    )
                ),
            ]
        if isinstance(decided, str):
            return [IgnoredSpec(decided)]
        if self.spec_check is not None:
            why = self.spec_check(ds.envelope, self.server_now_ms(local_wall_ms) / 1000)
            if why is not None:
                return [RejectedSpec(body.generation, why, ds.envelope.body)]
        if self.root_check is not None:
            why = self.root_check(body, decided, self.applied_spec, self.server_now_ms(local_wall_ms))
            if why is not None:
                return [RejectedSpec(body.generation, why, ds.envelope.body)]
        self.need_spec = False
        self.applied_generation = body.generation
        self.applied_spec_hash = body.spec_hash
        self.applied_spec = decided
        return [
            AcceptSpec(
                body.generation, body.spec_hash, decided, ds.envelope.body, ds.envelope.signature, ds.envelope.key_id
            )
        ]

    def _revoked(self, r: session_pb2.RevocationNotice) -> list[Effect]:
        self.state = State.CLOSED
        return [Close(f"certificate revoked: {r.reason}", redial=False)]

    def next_due(self, now_mono: float) -> float:
        """Seconds until `tick` has something to do: the Welcome's timeout, a heartbeat to send, or the
        silence that closes the session. The writer sleeps this long unless the outbox wakes it."""
        # The silence rules are strict (`>`): wake just past their instant, not at it.
        if self.state is State.HELLO_SENT:
            return max(0.0, self.last_heard + WELCOME_TIMEOUT_S + SILENCE_EPSILON_S - now_mono)
        if self.state is not State.OPEN:
            return 1.0
        return max(
            0.0,
            min(
                self.last_heard + MISSED_HEARTBEATS * self.heartbeat_interval_s + SILENCE_EPSILON_S,
                self.last_heartbeat_sent + self.heartbeat_interval_s,
            )
            - now_mono,
        )

    def tick(self, now_mono: float) -> list[Effect]:
        """Heartbeats out; silence for three intervals closes the session (a half-open link)."""
        if self.state is not State.OPEN:
            if self.state is State.HELLO_SENT and now_mono - self.last_heard > WELCOME_TIMEOUT_S:
                self.state = State.CLOSED
                return [Close("no Welcome from the gateway")]
            return []
        if now_mono - self.last_heard > MISSED_HEARTBEATS * self.heartbeat_interval_s:
            self.state = State.CLOSED
            return [Close(f"no frame from the gateway for {MISSED_HEARTBEATS} heartbeat intervals")]
        if now_mono - self.last_heartbeat_sent >= self.heartbeat_interval_s:
            self.last_heartbeat_sent = now_mono
            return [Send(NodeMessage(heartbeat=session_pb2.Heartbeat(applied_generation=self.applied_generation)))]
        return []
