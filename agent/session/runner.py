"""One session: the I/O-free core (`agent.session_core`) driven over a `Link`.

The runner is handed everything it works with (`SessionDeps`, built once by
`agent.app`) and one link per session; it never dials, and it never reaches
into the agent. Four tasks run until the first ends: the reader feeds the
core with the gateway's frames and carries out the effects; the writer ticks
the core (heartbeats, silence) and flushes events and the newest status from
the outbox; the third waits for `end()`, the fourth for a command's `accepted`
write to fail (`Dispatcher.accept_failed`: the reader hands a command on once
it is decided, without waiting for its accept to be durable, so a failed write
ends the session from there, as it did when the reader awaited it). What the session changes is changed
through `NodeState` (offset, spec, trust, time mark), the dispatcher (commands,
cancels, acks), the journal (events acked) and the outbox, whose sender is the
session's own `_send` from Welcome to the end.

Every frame goes out through `_send`, packed to the frame budget first
(`agent.framing`): the Hello carries the unacked results that fit and the rest
follow Welcome, events go in as many batches as it takes, and a frame over the
budget is never written.

A close decided by the core (a revocation notice, silence, no Welcome) ends
`run()` with a `SessionEnd` that names it; a close by the gateway or the
transport ends it with `LinkClosed` (typed by its `reason`), which the
session loop (`agent.session.loop`) reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent import framing, spec_quorum
from agent import session_core as sc
from agent.dispatch import Dispatcher
from agent.journal_api import AgentJournal
from agent.session.node_state import NodeState
from agent.session.outbox import Outbox
from agent.session.tunnel_offers import SessionOffers
from bc import __version__
from bc.protocol.capabilities import TUNNEL_OFFERS
from bc.protocol.pb import secrets_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CommandUpdate, GatewayMessage, NodeMessage
from bc.runtime.aio import wait_event
from bc.seams.clock import Clock
from bc.seams.link import Link

log = logging.getLogger("agent")

CAPABILITIES: tuple[str, ...] = ("binding.kubernetes", "devices.cdi", "devices.limits")
"""What this agent's Hello advertises (the gateway writes each as the node label `bc.dev/cap.<name>=1`):
CDI holds, `DeviceAssignment.limits` (a slice and host admission) and `BINDING_KUBERNETES`. An older
agent would drop the limits or the binding as unknown fields, so capacity places only on nodes that say so."""

WRITER_TICK_S = 1.0
TIMER_FLOOR_S = 0.001
"""The writer wakes at least this often to tick the core (heartbeats, silence), outbox or not."""


class SecretSink(Protocol):
    def on_response(self, resp: secrets_pb2.SecretResponse) -> None: ...
    def on_rotated(self, name: str, version: int) -> None: ...
    def on_welcomed(self) -> None: ...


@dataclass(frozen=True)
class SessionDeps:
    """What every session of one agent works with."""

    state: NodeState
    journal: AgentJournal
    dispatcher: Dispatcher
    outbox: Outbox
    clock: Clock
    boot_id: str
    incarnation_id: str
    sign_update: Callable[[CommandUpdate], CommandUpdate]
    """Fit to the size table, then sign with the node key (results are attested)."""
    heartbeat_interval_s: float | None = None
    """The operator's `--heartbeat-interval`, over what the gateway says."""
    capabilities: tuple[str, ...] = CAPABILITIES
    spec_rule: sc.SpecRule = sc.decide_spec
    """Which delivered spec is applied (`agent.session_core.decide_spec`; the simulator may hand a broken one)."""
    secrets: SecretSink | None = None
    """Where the broker's answers and rotation notices go (agent.secrets); None: this agent asks for none."""


@dataclass(frozen=True)
class SessionEnd:
    welcomed: bool
    close: sc.Close | None = None
    """The node's own close, if it decided one: `redial=False` means this certificate is done."""


class SessionRunner:
    def __init__(
        self,
        link: Link[GatewayMessage, NodeMessage],
        deps: SessionDeps,
        frame_budget: int,
        tunnels: SessionOffers | None = None,
    ) -> None:
        """`tunnels`: where this session's tunnel offers go (the session loop's, when the node's tunnels run on
        its channel): the Hello then names `tunnel.offers`."""
        self.link, self.deps, self.frame_budget, self.tunnels = link, deps, frame_budget, tunnels
        st = deps.state
        self.core = sc.AgentSessionCore(
            node_id=st.node_id,
            role=st.role,
            boot_id=deps.boot_id,
            journal_id=deps.journal.journal_id,
            incarnation_id=deps.incarnation_id,
            applied_generation=0 if st.spec_unusable else st.applied_generation,
            applied_spec_hash="" if st.spec_unusable else st.applied_spec_hash,
            time_mark_ms=st.time_mark_ms,
            capabilities=[*deps.capabilities, *([TUNNEL_OFFERS] if tunnels is not None else [])],
            inventory_hash=deps.outbox.inventory_hash,
        )
        self.core.applied_spec = st.spec if st.stored else None
        self.core.spec_check = st.trust.check_spec
        self.core.root_check = lambda body, new, held, now_ms: spec_quorum.check_spec(
            body, new, held, st.trust.bundle, now_ms, baseline_ca_keys=st.identity.join_ssh_ca_keys
        )
        self.core.need_spec = st.spec_unusable or st.stored is None
        self.core.spec_rule = deps.spec_rule
        self.core.inventory = deps.outbox.inventory
        self.core.server_inventory_hash = st.server_inventory_hash
        self.sent_event_seq = 0
        self.sent_status_version = 0
        self.sent_inventory_hash = ""
        self.welcomed = False
        self.closed: sc.Close | None = None
        self._ended = asyncio.Event()
        self.after_welcome: list[CommandUpdate] = []  # unacked results that did not fit the Hello
        self.hello_result_ids: set[str] = set()  # every unacked result the Hello read, fitted or not

    def end(self, why: str) -> None:
        """End this session as if the gateway closed it cleanly (the loop redials at once)."""
        log.info("event=session.rotate reason=%s", why)
        self._ended.set()

    async def run(self) -> SessionEnd:
        d = self.deps
        await d.dispatcher.write_acks()  # what the last session's gateway acked is not replayed to this one
        unacked = [d.sign_update(CommandUpdate.FromString(b)) for _id, b in await d.journal.unacked_results()]
        hello = self.core.hello(d.clock.monotonic(), __version__, [], await d.dispatcher.running_ids())
        hello, self.after_welcome = framing.pack_hello(hello, unacked, self.frame_budget)
        self.hello_result_ids = {u.command_id for u in unacked}
        async with asyncio.timeout(sc.WELCOME_TIMEOUT_S):
            await self._send(hello)
        failed = asyncio.create_task(d.dispatcher.accept_failed(), name="session-accept-failed")  # waits first
        reader = asyncio.create_task(self._read(), name="session-read")
        writer = asyncio.create_task(self._write(), name="session-write")
        ended = asyncio.create_task(self._ended.wait(), name="session-ended")
        tasks = (reader, failed, writer, ended)  # in this order, not a set's: what the gateway said comes first
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                exc = None if t not in done or t.cancelled() else t.exception()
                if exc is not None:
                    raise exc
                if t is failed and t in done:
                    raise failed.result()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            d.state.disconnected()
            d.outbox.detach(self._send)
        if self.closed is not None:
            log.warning("event=session.closed reason=%s", self.closed.reason)
            await self.link.close("CANCELLED", self.closed.reason)
        return SessionEnd(self.welcomed, self.closed)

    async def _read(self) -> None:
        clock = self.deps.clock
        while True:
            msg = await self.link.recv()
            if msg is None:
                log.info("event=session.eof")
                return
            effects = self.core.on_message(msg, clock.monotonic(), int(clock.now() * 1000))
            await self._apply(effects)
            if self.closed is not None:
                return

    async def _send(self, msg: NodeMessage) -> None:
        """Every frame of this session goes out here, and none over the budget (see agent.framing)."""
        size = msg.ByteSize()
        if size > self.frame_budget:
            # Unreachable by construction (everything is fitted or packed first); sending it would end the
            # stream at the gateway and the next session would try again, so it is dropped and said loudly.
            log.error(
                "event=frame.unsendable kind=%s bytes=%d budget=%d", msg.WhichOneof("msg"), size, self.frame_budget
            )
            return
        await self.link.send(msg)

    async def _apply(self, effects: list[sc.Effect]) -> None:
        d, st = self.deps, self.deps.state
        for e in effects:
            if isinstance(e, sc.Send):
                await self._send(e.msg)
            elif isinstance(e, sc.Welcomed):
                self.welcomed = True
                self.sent_inventory_hash = e.inventory_hash
                await st.welcomed(e)
                d.outbox.attach(self._send)
                if d.secrets is not None:
                    d.secrets.on_welcomed()
                if self.tunnels is not None:
                    self.tunnels.welcomed(TUNNEL_OFFERS in e.capabilities)
                await self._send_after_welcome()
                log.info(
                    "event=session.welcomed epoch=%d offset_ms=%d heartbeat_s=%.1f",
                    e.epoch,
                    e.offset_ms,
                    e.heartbeat_interval_s,
                )
                if d.heartbeat_interval_s:
                    self.core.heartbeat_interval_s = d.heartbeat_interval_s
                d.outbox.poke()
            elif isinstance(e, sc.DeliverCommand):
                st.offset_ms = self.core.offset_ms
                await d.dispatcher.on_command(e.command)
            elif isinstance(e, sc.DeliverCancel):
                await d.dispatcher.on_cancel(e.cancel)
            elif isinstance(e, sc.AckResults):
                await d.dispatcher.on_ack(e.command_ids)
            elif isinstance(e, sc.AdvanceTimeMark):
                await st.advance_time_mark(e.server_time_ms)
            elif isinstance(e, sc.AcceptSpec):
                await st.accept_spec(e)
                await d.dispatcher.on_spec_applied()
            elif isinstance(e, sc.IgnoredSpec):
                log.info("event=spec.ignored reason=%s", e.reason)
            elif isinstance(e, sc.RejectedSpec):
                await st.reject_spec(e)
            elif isinstance(e, sc.TrustOffered):
                await st.offer_trust(e.envelope, None)
            elif isinstance(e, sc.SecretAnswered):
                if d.secrets is not None:
                    d.secrets.on_response(e.response)
            elif isinstance(e, sc.SecretRotated):
                if d.secrets is not None:
                    d.secrets.on_rotated(e.name, e.version)
            elif isinstance(e, sc.TunnelOffered):
                if self.tunnels is not None:
                    self.tunnels.offer(e.offer)
                else:
                    log.warning("event=tunnel.offer-unasked sid=%s", e.offer.sid[:64])
            elif isinstance(e, sc.AckEvents):
                n = await d.journal.ack_events(e.upto_seq)
                log.debug("event=events.acked upto=%d dropped=%d", e.upto_seq, n)
            elif isinstance(e, sc.Close):
                self.closed = e
                self._ended.set()

    async def _send_after_welcome(self) -> None:
        """The unacked results the Hello had no room for, each in its own frame, oldest first; then those settled
        between the Hello's read of the journal and the outbox's attach, which went nowhere when they were sent.

        Called after the attach: a result settled from here on reaches this session through the outbox, so the
        re-read misses none (one settled in between may go twice; the gateway takes a result once)."""
        d = self.deps
        later, self.after_welcome = self.after_welcome, []
        known = self.hello_result_ids
        late = [
            d.sign_update(CommandUpdate.FromString(b))
            for cid, b in await d.journal.unacked_results()
            if cid not in known
        ]
        if late:
            log.info("event=session.results-settled-during-hello count=%d", len(late))
        later += late
        if later:
            log.info("event=session.results-after-welcome count=%d", len(later))
        for update in later:
            await self._send(NodeMessage(command_update=update))

    async def _write(self) -> None:
        """Heartbeats, new events and the newest status, whenever the core is open."""
        d = self.deps
        while True:
            # Clear before reading the outbox: a change made while we flush wakes the next round.
            d.outbox.changed.clear()
            await self._apply(self.core.tick(d.clock.monotonic()))
            if self.core.state is sc.State.OPEN:
                await self._flush_events()
                await self._flush_status()
                await d.dispatcher.expire_deferred()
            # Until the core's next timer (a heartbeat, the silence rule) unless the outbox changes first; a
            # deferred command waiting for its spec is checked against its not_after each second.
            timeout = self.core.next_due(d.clock.monotonic())
            if d.dispatcher.deferred:
                timeout = min(timeout, WRITER_TICK_S)
            # At least a millisecond: `deadline - now` can be a rounding error above zero while the core's
            # `now - start >= interval` is still false, and a virtual clock would then never move.
            await wait_event(d.outbox.changed, max(TIMER_FLOOR_S, timeout))

    async def _flush_events(self) -> None:
        journal = self.deps.journal
        events = [e for e in await journal.unacked_events() if e.seq > self.sent_event_seq]
        if not events:
            return
        nodes: list[session_pb2.NodeEvent] = []
        for ev in events:
            ne = session_pb2.NodeEvent()
            ne.ParseFromString(ev.payload)
            ne.seq = ev.seq
            nodes.append(ne)
        for batch in framing.pack_events(journal.journal_id, nodes, self.frame_budget):
            await self._send(NodeMessage(event_batch=batch))
            self.sent_event_seq = batch.events[-1].seq

    async def _flush_status(self) -> None:
        out = self.deps.outbox
        if out.status is None or out.status_version == self.sent_status_version:
            return
        rep = framing.trim_status(out.status)
        if out.inventory_hash != self.sent_inventory_hash:
            rep.inventory.CopyFrom(out.inventory)
            self.sent_inventory_hash = out.inventory_hash
        await self._send(NodeMessage(status=rep))
        self.sent_status_version = out.status_version
