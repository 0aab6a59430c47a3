"""One node's session: the driver of its stream, over a Link, driven by the I/O-free core.

`SessionDriver` runs one session for its `Gateway` (`bc.gateway.sessions`): a
reader feeding the core, a ticker for heartbeats, the 10 s backstop and the
~1 s status flush, and the actions the core asks for, executed one at a time so
the store sees a session's frames in the order they arrived.

A session whose Hello named `tunnel.offers` holds its node in the gateway's
`TunnelHub` from its Welcome to its end: an operator's offer is handed to the
driver (`put_nowait`, the hub's `OfferSink`), and the ticker sends it as the core
says, after the Welcome and in the order they came. The session's end releases
the node, which ends its tunnels here, as a Listen stream's end does.

Sizes (`bc.gateway.oversize`): an update whose result is over
`max_result_bytes` is acked as refused, never applied; a stored command or
spec whose frame would be over `max_frame_bytes` is never sent (the node
would refuse it, redial, and be sent it again). A frame over gRPC's receive
limit never reaches this code: the stream simply ends, which is logged as
`event=session.ended`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Literal, Protocol

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.commands.dispatch import CommandFrame, SessionSends
from bc.control.commands.queue import UpdateOutcome, apply_update
from bc.control.nodes import status as status_ctl
from bc.control.signing.signer import Signer
from bc.control.trust.sources import TrustSource
from bc.errors import BcError, Overloaded, ProtocolError, Unauthenticated, Unavailable
from bc.gateway import core
from bc.gateway.admission import StatusBudget
from bc.gateway.counters import GatewayCounters
from bc.gateway.dispatcher import Dispatcher
from bc.gateway.hello import TERMINAL_UPDATES, HelloResult, hello_in
from bc.gateway.ingest import ingest_in
from bc.gateway.oversize import fit_texts, refuse_oversized_command, refuse_oversized_update
from bc.gateway.tunnels import TunnelHub
from bc.pki.identity import PeerIdentity
from bc.protocol import closing
from bc.protocol import connectivity as cx
from bc.protocol.closing import SessionRefused
from bc.protocol.limits import LIMITS
from bc.protocol.pb import common_pb2, secrets_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.protocol.pb.tunnel_pb2 import TunnelOffer
from bc.runtime.aio import wait_event
from bc.seams.clock import Clock
from bc.seams.link import Link, LinkClosed
from bc.store import Store, StoreError, Tx
from bc.store import commands as commands_sql
from bc.store import dispatch as dispatch_sql
from bc.store import nodes as nodes_sql
from bc.store.group_commit import GroupCommit
from bc.store.leases import Claim

log = logging.getLogger("bc.gateway")

LIVENESS_FLUSH_S = 5.0
"""How often an open session's last-heard age is flushed to the store (batched by its gateway)."""
TIMER_FLOOR_S = 0.001
BUSY_RETRY_MS = 1_000
"""When a command the node answered busy is offered again."""


class SessionTimers(Protocol):
    @property
    def heartbeat_interval_s(self) -> float: ...
    @property
    def hello_timeout_s(self) -> float: ...


class SecretPort(Protocol):
    """The secret broker as a gateway reaches it (`bc.control.secrets.broker.SecretBroker`, or `NoBroker`)."""

    async def answer(self, node_id: str, request: secrets_pb2.SecretRequest) -> secrets_pb2.SecretResponse: ...


class SessionHost(Protocol):
    """What a driver asks of the gateway that built it (`bc.gateway.sessions.Gateway`): its store, bus and
    clock, the registry of live sessions, the dispatcher to poke, the shared budgets and batches. A protocol,
    not the class, so the gateway imports its drivers and never the other way round."""

    gateway_id: str
    claim: Claim  # this process's hold on the gateway's lease: a Hello routes the node to it
    store: Store
    bus: Bus
    clock: Clock
    signer: Signer
    trust: TrustSource
    group: GroupCommit
    dispatcher: Dispatcher
    counters: GatewayCounters
    status_budget: StatusBudget
    sessions: dict[str, SessionDriver]
    secrets: SecretPort
    tunnels: TunnelHub

    @property
    def cfg(self) -> SessionTimers: ...
    async def close_session(self, tx: Tx, node_id: str, epoch: int, now_ms: int) -> bool: ...
    def track(self, task: asyncio.Future[None]) -> None: ...
    def flush_seen_soon(self, driver: SessionDriver) -> None: ...
    async def hello_slot(self) -> None: ...
    def hello_done(self) -> None: ...
    async def attach_signer(self, env: common_pb2.Envelope, key_id: str) -> None: ...
    async def batch_approval(self, batch_id: str) -> bytes: ...
    async def preapproval(self, version: int) -> bytes: ...
    async def backstop_generation(self, node_id: str) -> int | None: ...


class SessionDriver:
    def __init__(self, gw: SessionHost, link: Link[NodeMessage, GatewayMessage], peer: PeerIdentity) -> None:
        self.gw, self.link, self.peer = gw, link, peer
        self.node_id = peer.name
        self.core = core.GatewaySessionCore(peer.name, gw.cfg.heartbeat_interval_s, gw.clock.monotonic())
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._poke_pending = False
        self.seen_flushed = -1.0  # the `core.last_heard` this session's last liveness flush committed
        self._outbox: list[SessionSends] = []  # what the gateway's dispatch passes planned for this session
        self._closing: core.Close | None = None
        self._close_reason: CloseReason = closing.UNSPECIFIED
        self._retry_after_ms: int | None = None  # an overload refusal's word on when to come back
        self._done = asyncio.Event()
        self._spec_refused_generation = 0  # the generation last reported as too large to send, so it is said once
        self._hello_write: asyncio.Future[HelloResult | None] | None = None  # this session's Hello, once queued
        # Tunnel offers the hub handed this session, not yet sent; a list made at the first (nearly every session
        # never has one: docs/scale.md, the memory per session).
        self._offers: list[TunnelOffer] | None = None

    def poke(self) -> None:
        """Something changed for this node (an enqueue, a cancel, a credit come free, a spec): check the
        generation, and ask the gateway for a dispatch pass (coalesced with every other session's)."""
        self._poke_pending = True
        self._wake.set()
        self.gw.dispatcher.poke(self.node_id)

    @property
    def ending(self) -> bool:
        """The session's end is decided: it sends nothing more (what is marked for it goes out at the next Hello)."""
        return self._closing is not None

    def deliver(self, sends: SessionSends) -> None:
        """A dispatch pass's plan for this session: sent by the session's own task, in order."""
        self._outbox.append(sends)
        self._wake.set()

    def put_nowait(self, item: TunnelOffer | None) -> None:
        """The hub's `OfferSink`: an operator's offer, sent by the session's own task; None (a newer session or
        Listen of the node took over, or the node is closed here) drops what was not sent yet."""
        if item is None:
            self._offers = None
            return
        if self._offers is None:
            self._offers = []
        self._offers.append(item)
        self._wake.set()

    async def notify_secret(self, msg: GatewayMessage) -> None:
        """A secret this node's spec names was set anew (`bc.gateway.secret_feed`): tell an open session."""
        if self.core.state is core.State.OPEN and self._closing is None:
            await self.link.send(msg)

    async def revoke(self, reason: str) -> None:
        """Tell the node why, then end the stream UNAUTHENTICATED: it must not redial with this certificate."""
        if self._closing is not None:
            return
        log.warning("event=session.revoked node=%s serial=%s reason=%s", self.node_id, self.peer.serial, reason)
        async with self._lock:
            await self._revoke_locked(reason)

    async def _revoke_locked(self, reason: str) -> None:
        # Decided before the notice goes out: a node that hangs up as soon as it reads the notice must
        # not turn this close into "the node ended the stream".
        self._decide_close("UNAUTHENTICATED", f"certificate revoked: {reason}", closing.REVOKED)
        notice = session_pb2.RevocationNotice(reason=reason, serials=[self.peer.serial])
        try:
            async with asyncio.timeout(2.0):
                await self.link.send(GatewayMessage(revocation=notice))
        except (LinkClosed, TimeoutError):
            pass  # closing anyway; the handshake check refuses it on the next try
        self._done.set()

    def request_close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        """End the session; `reason` is the typed code the node acts on (bc.protocol.closing), `retry_after_ms`
        when an overloaded gateway tells the node to come back."""
        self._decide_close(code, details, reason, retry_after_ms)
        self._done.set()

    def _decide_close(self, code: str, details: str, reason: CloseReason, retry_after_ms: int | None = None) -> None:
        """The first decision stands: how the session ends, and why."""
        if self._closing is None:
            self._closing = core.Close(code, details)
            self._close_reason = reason
            self._retry_after_ms = retry_after_ms

    async def run(self) -> None:
        reader = asyncio.create_task(self._read_loop(), name=f"session-read-{self.node_id}")
        ticker = asyncio.create_task(self._tick_loop(), name=f"session-tick-{self.node_id}")
        try:
            await self._done.wait()
        finally:
            self._done.set()  # also when gRPC cancelled this handler: a Hello still queued must not be written
            for t in (reader, ticker):
                t.cancel()
            # The close must reach the store even when gRPC cancels this handler (the node hung up, or
            # the server is stopping): it runs as its own task, which the gateway drains before the
            # store closes.
            cleanup = asyncio.ensure_future(self._finish(reader, ticker))
            self.gw.track(cleanup)
            await asyncio.shield(cleanup)
        if self._closing is None or self._closing.code == "OK":
            # Also how a frame over gRPC's receive limit shows here: the stream just ends.
            log.info(
                "event=session.ended node=%s epoch=%d details=%s",
                self.node_id,
                self.core.epoch,
                self._closing.details if self._closing else "",
            )
        else:
            log.info(
                "event=session.closed node=%s epoch=%d code=%s details=%s",
                self.node_id,
                self.core.epoch,
                self._closing.code,
                self._closing.details,
            )
            await self.link.close(
                self._closing.code, self._closing.details, self._close_reason, retry_after_ms=self._retry_after_ms
            )

    async def _finish(self, *tasks: asyncio.Task[None]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._cleanup()

    async def _cleanup(self) -> None:
        self.core.close()
        self._offers = None
        self.gw.tunnels.release(self.node_id, self)  # its tunnels here end with it, if it still held the node
        if self.gw.sessions.get(self.node_id) is self:
            del self.gw.sessions[self.node_id]
            self.gw.dispatcher.poke()  # the last session gone ends the dispatch loop
        epoch = self.core.epoch
        if not epoch and self._hello_write is not None:
            # The stream ended while its Hello was in a group commit: that Hello may still commit, routing the
            # node here with nobody on the session. Wait for it, and close what it opened.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                res = await asyncio.shield(self._hello_write)
                epoch = res.epoch if res is not None else 0
        if epoch:
            try:
                now_ms = await self.gw.store.now_ms()
                async with self.gw.store.transaction() as tx:
                    if await self.gw.close_session(tx, self.node_id, epoch, now_ms):
                        await publish(
                            tx,
                            self.gw.bus,
                            "node.connectivity",
                            self.node_id,
                            {
                                "state": cx.DISCONNECTED,
                                "epoch": epoch,
                                "reason": self._closing.details if self._closing else "stream ended",
                            },
                            now_ms,
                        )
            except StoreError as e:
                log.warning("event=session.close-write-failed node=%s error=%s", self.node_id, e)

    async def _read_loop(self) -> None:
        try:
            first = True
            while True:
                if first:
                    async with asyncio.timeout(self.gw.cfg.hello_timeout_s):
                        msg = await self.link.recv()
                    first = False
                else:
                    msg = await self.link.recv()
                if msg is None:
                    self.request_close("OK", "the node ended the stream")
                    return
                async with self._lock:
                    await self._execute(self.core.on_message(msg, self.gw.clock.monotonic()))
                if self.core.has_status:
                    self._wake.set()
        except TimeoutError:
            self.request_close("DEADLINE_EXCEEDED", "no Hello within the hello timeout")
        except ProtocolError as e:
            self.request_close("FAILED_PRECONDITION", e.message)
        except SessionRefused as e:
            self.request_close("UNAUTHENTICATED", e.message, e.reason)
        except Unauthenticated as e:
            self.request_close("UNAUTHENTICATED", e.message)
        except LinkClosed as e:
            self.request_close("OK", e.details)
        except StoreError as e:
            log.warning("event=session.store-error node=%s error=%s", self.node_id, e)
            self.request_close(
                "UNAVAILABLE", "the control plane's store failed; reconnect", closing.GATEWAY_UNAVAILABLE
            )
        except Overloaded as e:
            self.request_close("RESOURCE_EXHAUSTED", e.message, retry_after_ms=e.retry_after_ms)
        except Unavailable as e:  # this gateway cannot route now (it lost its lease): another one can
            self.request_close("UNAVAILABLE", e.message, closing.GATEWAY_UNAVAILABLE)
        except BcError as e:
            self.request_close("INTERNAL", e.message)

    async def _tick_loop(self) -> None:
        """Heartbeats and timers; pokes at once; status reports when the core says they are due."""
        try:
            last_seen_flush = self.gw.clock.monotonic()
            while True:
                # Sleep until the next timer (the core's heartbeat, silence and backstop, the status budget,
                # the liveness flush) unless a frame, a poke or a dispatch pass's plan wakes us first: an idle
                # session does nothing between its timers.
                now = self.gw.clock.monotonic()
                timeout = self.core.next_due(now)
                due = self.core.status_due(now)
                if due is not None:
                    timeout = min(timeout, due)
                if self.core.epoch:
                    timeout = min(timeout, last_seen_flush + LIVENESS_FLUSH_S - now)
                # At least a millisecond: a timer computed as `deadline - now` can come out a rounding error
                # above zero while `now - start >= interval` is still false, and on a virtual clock that
                # never moves time forward.
                await wait_event(self._wake, max(TIMER_FLOOR_S, timeout))
                self._wake.clear()
                now = self.gw.clock.monotonic()
                async with self._lock:
                    server_ms = await self.gw.store.now_ms()
                    await self._execute(self.core.tick(now, server_ms))
                    poked = self._poke_pending
                    backstop = self.core.backstop_due(now)
                    if poked or backstop:
                        self._poke_pending = False
                        await self._check_generation("poke" if poked else "backstop")
                    # Commands come from the gateway's dispatch passes (on pokes and every second).
                    await self._send_planned()
                    await self._send_offers()
                    if self.core.status_due(now) == 0.0:
                        self.core.note_status_written(now)
                        await self._flush_status()
                    if self.core.epoch and now - last_seen_flush >= LIVENESS_FLUSH_S:
                        last_seen_flush = now
                        self.gw.flush_seen_soon(self)
        except LinkClosed as e:
            self.request_close("OK", e.details)
        except StoreError as e:
            log.warning("event=session.store-error node=%s error=%s", self.node_id, e)
            self.request_close(
                "UNAVAILABLE", "the control plane's store failed; reconnect", closing.GATEWAY_UNAVAILABLE
            )

    async def _check_generation(self, reason: str) -> None:
        """A poke reads the node's generation now; the backstop takes the gateway's shared read."""
        g: int | None = None
        if reason == "backstop":
            g = await self.gw.backstop_generation(self.node_id)
        if g is None:
            async with self.gw.store.transaction(write=False) as tx:
                g = await nodes_sql.generation(tx, self.node_id)
        if g is not None:
            await self._execute(self.core.generation_is(int(g), reason))

    async def _flush_status(self) -> None:
        wait = self.gw.status_budget.turn(self.gw.clock.monotonic())
        if wait:  # the gateway's status budget is spent: wait for this write's turn, then write the newest report
            await self.gw.clock.sleep(wait)
        taken = self.core.take_status()
        if taken is None:
            return
        report, new = taken
        gw, epoch, now_ms = self.gw, self.core.epoch, await self.gw.store.now_ms()
        await gw.group.run(
            lambda tx: status_ctl.write_report(tx, gw.bus, self.node_id, epoch, report, now_ms, publish_it=new)
        )
        self.gw.counters.status_written += 1

    async def _hello(self, hello: session_pb2.Hello) -> HelloResult:
        """The Hello transaction, in the gateway's group commit: a reconnect storm's Hellos share transactions
        (one BEGIN, lease check and COMMIT for many), and with the status and event writes of the sessions
        already open.

        A member of a batch is written even if this session ends while it waits (`GroupCommit.run`), so a
        session whose stream ended first writes nothing (`_skip`), and one that ended while its Hello was
        committing closes what that Hello opened (`_cleanup` awaits `_hello_write`)."""
        gw, peer, now_ms = self.gw, self.peer, await self.gw.store.now_ms()

        async def work(tx: Tx) -> HelloResult | None:
            if self._done.is_set():
                return None  # the stream ended while this Hello waited: route nothing to a session nobody holds
            return await hello_in(tx, gw.store.dialect, gw.bus, gw.signer, gw.gateway_id, peer, hello, now_ms, gw.claim)

        self._hello_write = asyncio.ensure_future(gw.group.run(work))
        res = await asyncio.shield(self._hello_write)
        if res is None:
            raise LinkClosed("CANCELLED", "the stream ended before its Hello was written")
        return res

    async def _execute(self, actions: list[core.Action]) -> None:
        for a in actions:
            if isinstance(a, core.Send):
                await self.link.send(a.msg)
            elif isinstance(a, core.OpenSession):
                await self.gw.hello_slot()
                try:
                    res = await self._hello(a.hello)
                finally:
                    self.gw.hello_done()
                if res.quarantined:
                    log.error("event=node.quarantined node=%s serial=%s", self.node_id, self.peer.serial)
                    await self._revoke_locked("duplicate-identity")
                    return
                old = self.gw.sessions.get(self.node_id)
                if old is not None and old is not self:
                    old.request_close("ABORTED", "superseded by a newer session of this node", closing.SUPERSEDED)
                self.gw.sessions[self.node_id] = self
                self.gw.counters.sessions_opened += 1
                log.info(
                    "event=session.opened node=%s epoch=%d boot=%s journal=%s applied=%d generation=%d",
                    self.node_id,
                    res.epoch,
                    a.hello.boot_id,
                    a.hello.journal_id,
                    a.hello.applied_generation,
                    res.generation,
                )
                await self._execute(
                    self.core.opened(
                        res.epoch,
                        res.generation,
                        await self.gw.store.now_ms(),
                        self.gw.trust.trust_bundle(),
                        self.gw.gateway_id,
                        res.inventory_hash,
                        self.gw.trust.trust_envelope(),
                    )
                )
                if self.core.tunnel_offers:  # after the Welcome: no offer goes out before it
                    self.gw.tunnels.hold(self.node_id, self)
                if res.ack:
                    await self.link.send(GatewayMessage(ack=session_pb2.Ack(command_ids=res.ack)))
                for command_id in res.replay:
                    await self._send_command(command_id)
                self.gw.dispatcher.poke(self.node_id)  # what was pending for the node goes out after the replay
            elif isinstance(a, core.LoadSpec):
                await self._load_spec()
            elif isinstance(a, core.AnswerSecret):
                answer = await self.gw.secrets.answer(self.node_id, a.request)
                await self.link.send(GatewayMessage(secret_response=answer))
            elif isinstance(a, core.IngestEvents):
                ack = await self._ingest(a.batch)
                if ack is not None:
                    await self.link.send(GatewayMessage(ack=ack))
            elif isinstance(a, core.ApplyCommandUpdate):
                await self._apply_update(a.update)
            elif isinstance(a, core.Close):
                self.request_close(a.code, a.details)

    async def _ingest(self, batch: session_pb2.EventBatch) -> session_pb2.Ack | None:
        gw, now_ms = self.gw, await self.gw.store.now_ms()
        return await gw.group.run(lambda tx: ingest_in(tx, gw.store, gw.bus, gw.signer, self.node_id, batch, now_ms))

    # -- commands ------------------------------------------------------
    async def _send_planned(self) -> None:
        """Send what the gateway's dispatch passes marked for this session: commands, then Cancels."""
        while self._outbox and self.core.state is core.State.OPEN:
            sends = self._outbox.pop(0)
            if sends.epoch != self.core.epoch:
                continue  # planned for another session of the node; the node's next Hello replays it
            for frame in sends.commands:
                await self._send_frame(frame)
            for cid, reason in sends.cancels:
                await self.link.send(GatewayMessage(cancel=session_pb2.Cancel(command_id=cid, reason=reason)))

    async def _send_offers(self) -> None:
        """The tunnel offers handed to this session, in order (`put_nowait`)."""
        while self._offers:
            offer = self._offers.pop(0)
            await self._execute(self.core.offer_tunnel(offer))

    async def _send_command(self, command_id: str) -> None:
        """Relay a stored command (a Hello's replay) as it is now."""
        async with self.gw.store.transaction(write=False) as tx:
            row = await commands_sql.get(tx, command_id)
        if row is not None:
            await self._send_frame(CommandFrame.of(row))

    async def _send_frame(self, frame: CommandFrame) -> None:
        """Relay the stored body and signature verbatim: the gateway never re-encodes or signs."""
        command_id = frame.id
        env = common_pb2.Envelope(purpose="command", body=frame.body)
        if frame.signature is not None:
            env.signature = frame.signature
            await self.gw.attach_signer(env, frame.signer_key_id)
        cmd = session_pb2.Command(envelope=env, attempt=frame.attempt)
        if frame.batch_id:
            # The batch's approvals and this command's own leaf proof, both as stored: the node checks them.
            cmd.batch_approval = await self.gw.batch_approval(frame.batch_id)
            cmd.batch_proof = frame.batch_proof
        if frame.preapproval:
            # The signed policy version that pre-approves it, as stored: the node checks it (agent/quorum.py).
            cmd.preapproval = await self.gw.preapproval(frame.preapproval)
        msg = GatewayMessage(command=cmd)
        size = msg.ByteSize()
        if size > LIMITS.max_frame_bytes:  # stored before the limits: the node could never take it
            now_ms = await self.gw.store.now_ms()
            async with self.gw.store.transaction() as tx:
                await refuse_oversized_command(tx, self.gw.bus, self.node_id, command_id, size, now_ms)
            self.gw.dispatcher.poke(self.node_id)  # its lane credit is free (the spec did not change)
            return
        await self.link.send(msg)

    async def _apply_update(self, update: session_pb2.CommandUpdate) -> None:
        """Results are facts, accepted on any epoch; every terminal one is acked, known or not."""
        gw = self.gw
        now_ms = await gw.store.now_ms()
        busy = update.state == session_pb2.COMMAND_REJECTED and update.reason == "BUSY"

        async def write(tx: Tx) -> UpdateOutcome | Literal["busy", "refused"]:
            if busy:
                await dispatch_sql.requeue_busy(tx, update.command_id, self.node_id, now_ms + BUSY_RETRY_MS, now_ms)
                return "busy"
            if await refuse_oversized_update(tx, gw.bus, self.node_id, update, now_ms):
                return "refused"
            return await apply_update(tx, gw.bus, gw.signer, self.node_id, fit_texts(update), now_ms)

        outcome = await gw.group.run(write)
        if outcome == "busy":
            return
        if outcome == "refused":  # acked, so the node stops resending what will never be taken
            await self.link.send(GatewayMessage(ack=session_pb2.Ack(command_ids=[update.command_id])))
            self.gw.dispatcher.poke(self.node_id)
            return
        assert isinstance(outcome, UpdateOutcome)
        if outcome.rejected:
            log.warning(
                "event=command.result-rejected node=%s command=%s why=%s",
                self.node_id,
                update.command_id,
                outcome.rejected,
            )
            return  # not acked: the node keeps its result and resends it, signed, at the next Hello
        if update.state in TERMINAL_UPDATES:
            await self.link.send(GatewayMessage(ack=session_pb2.Ack(command_ids=[update.command_id])))
            if outcome.changed:
                # A lane credit came free: a dispatch pass, no generation check (a result changes no spec; a
                # spec a settled command changed pokes the node through the bus).
                self.gw.dispatcher.poke(self.node_id)

    async def _load_spec(self) -> None:
        async with self.gw.store.transaction(write=False) as tx:
            row = await nodes_sql.spec_delivery(tx, self.node_id)
        if row is None or row["spec_body"] is None:
            return
        if row["spec_sign_pending"]:  # written by a keyless gateway: sent once a key-holding process signed it
            return
        env = common_pb2.Envelope(purpose="desired-state", body=bytes(row["spec_body"]))
        if row["spec_signature"] is not None:
            env.signature = bytes(row["spec_signature"])
            await self.gw.attach_signer(env, str(row["spec_key_id"] or ""))
        generation = int(row["generation"])
        size = GatewayMessage(desired_state=session_pb2.DesiredState(envelope=env)).ByteSize()
        if size > LIMITS.max_frame_bytes:  # stored before the limits: the node keeps enforcing what it holds
            await self._spec_too_large(generation, size)
            return
        await self._execute(self.core.spec_loaded(generation, env))

    async def _spec_too_large(self, generation: int, size: int) -> None:
        if self._spec_refused_generation == generation:
            return
        self._spec_refused_generation = generation
        log.error("event=spec.too-large node=%s generation=%d frame_bytes=%d", self.node_id, generation, size)
        now_ms = await self.gw.store.now_ms()
        data = {"generation": generation, "frame_bytes": size, "max_frame_bytes": LIMITS.max_frame_bytes}
        async with self.gw.store.transaction() as tx:
            await publish(tx, self.gw.bus, "node.spec-too-large", self.node_id, data, now_ms)
