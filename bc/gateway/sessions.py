"""The gateway: node sessions over a Link, driven by the I/O-free core.

`Gateway` owns this process's live sessions, its `gateway:<id>` lease and the
pokes from the bus; `SessionDriver` runs one session: a reader feeding the
core, a ticker for heartbeats, the 10 s backstop and the ~1 s status flush,
and the actions the core asks for, executed one at a time so the store sees
a session's frames in the order they arrived.

Sizes (`bc.gateway.oversize`): an update whose result is over
`max_result_bytes` is acked as refused, never applied; a stored command or
spec whose frame would be over `max_frame_bytes` is never sent (the node
would refuse it, redial, and be sent it again). A frame over gRPC's receive
limit never reaches this code: the stream simply ends, which is logged as
`event=session.ended`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from bc.aio import wait_event
from bc.clock import Clock
from bc.control import approvers
from bc.control import status as status_ctl
from bc.control.bus import Bus
from bc.control.commands import apply_update, settle_by_server
from bc.control.events import publish
from bc.control.intent import Intent
from bc.control.signer import Signer
from bc.errors import BcError, ProtocolError, Unauthenticated
from bc.gateway import core, dispatch_rules
from bc.gateway.hello import TERMINAL_UPDATES, hello_transaction
from bc.gateway.ingest import ingest
from bc.gateway.oversize import fit_texts, refuse_oversized_command, refuse_oversized_update
from bc.pki.identity import PeerIdentity
from bc.protocol import closing
from bc.protocol.closing import SessionRefused
from bc.protocol.limits import LIMITS
from bc.protocol.pb import common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.store import Store, StoreError
from bc.store import commands as commands_sql
from bc.store import dispatch as dispatch_sql
from bc.store import leases as leases_sql
from bc.store import nodes as nodes_sql
from bc.store import quorum as quorum_sql
from bc.store import revocation as rev_sql
from bc.store import signing as signing_sql
from bc.wire.link import Link, LinkClosed

log = logging.getLogger("bc.gateway")

GATEWAY_LEASE_TTL_MS = 20_000
GATEWAY_LEASE_RENEW_S = 5.0
LIVENESS_FLUSH_S = 5.0
TIMER_FLOOR_S = 0.001
SEEN_BATCH_S = 0.5
"""Liveness flushes due within this long share one transaction (a gateway's sessions flush every 5 s)."""
BUSY_RETRY_MS = 1_000
REVOCATION_POLL_S = 1.0


@dataclass
class GatewayConfig:
    heartbeat_interval_s: float = 10.0
    hello_timeout_s: float = 10.0


class Gateway:
    """`signer` signs nothing here: the gateway relays stored signatures. It decides whether results and reports
    must carry the node's own signature, and signs the specs that allocation reports change; `intent` is the
    trust bundle every Welcome carries."""

    close_session = staticmethod(nodes_sql.close_session)
    """How a session's end is written: epoch-fenced, so a superseded session closes nothing. A seam only for
    the simulator's deliberately broken gateway (`bc.sim.breaks`, `--break ignore-epoch-fence`)."""

    def __init__(
        self,
        store: Store,
        bus: Bus,
        clock: Clock,
        gateway_id: str,
        signer: Signer,
        intent: Intent,
        cfg: GatewayConfig,
    ) -> None:
        self.store, self.bus, self.clock, self.gateway_id, self.cfg = store, bus, clock, gateway_id, cfg
        self.signer, self.intent = signer, intent
        self.sessions: dict[str, SessionDriver] = {}
        self._signer_certs: dict[str, bytes] = {}
        self._approvals: dict[str, bytes] = {}
        self._closing_tasks: set[asyncio.Future[None]] = set()
        self._seen_batch: dict[str, SessionDriver] = {}
        bus.on_node_changed(self._poke)

    def track(self, task: asyncio.Future[None]) -> None:
        """Work that must finish before the store closes (session close writes)."""
        self._closing_tasks.add(task)
        task.add_done_callback(self._closing_tasks.discard)

    async def drain(self) -> None:
        """Close every session and wait for the close writes; the caller bounds it with a timeout."""
        for d in list(self.sessions.values()):
            d.request_close("UNAVAILABLE", "the server is stopping; reconnect", closing.GATEWAY_UNAVAILABLE)
        while self.sessions or self._closing_tasks:
            if self._closing_tasks:
                await asyncio.wait(list(self._closing_tasks))
            else:
                await asyncio.sleep(0.05)  # a session between its close request and its cleanup task

    def flush_seen_soon(self, driver: SessionDriver) -> None:
        """Queue a session's liveness flush; the sessions due within `SEEN_BATCH_S` share one transaction."""
        first = not self._seen_batch
        self._seen_batch[driver.node_id] = driver
        if first:
            self.track(asyncio.ensure_future(self._flush_seen_batch()))

    async def _flush_seen_batch(self) -> None:
        """Liveness as an age: the store computes `now - age`, so this gateway's clock cannot lie about it."""
        await asyncio.sleep(SEEN_BATCH_S)
        batch, self._seen_batch = self._seen_batch, {}
        superseded: list[SessionDriver] = []
        try:
            now_ms = await self.store.now_ms()
            now = self.clock.monotonic()
            async with self.store.transaction() as tx:
                for node_id, d in sorted(batch.items()):
                    epoch = d.core.epoch
                    if not epoch:
                        continue
                    if await nodes_sql.session_is_current(tx, node_id, epoch):
                        age_ms = int((now - d.core.last_heard) * 1000)
                        await nodes_sql.mark_seen(tx, node_id, epoch, now_ms - age_ms)
                    else:
                        superseded.append(d)
        except StoreError as e:  # the next flush tries again; the sessions' own writes notice a store that is gone
            log.warning("event=liveness.flush-failed sessions=%d error=%s", len(batch), e)
            return
        for d in superseded:
            d.request_close("ABORTED", "this session was superseded; the node is routed elsewhere", closing.SUPERSEDED)

    def _poke(self, node_id: str) -> None:
        d = self.sessions.get(node_id)
        if d is not None:
            d.poke()

    async def attach_signer(self, env: common_pb2.Envelope, key_id: str) -> None:
        """Name the worker key and relay its certificate, as stored: the node checks both against its roots."""
        if not key_id:
            return
        der = self._signer_certs.get(key_id)
        if der is None:
            async with self.store.transaction(write=False) as tx:
                der = await signing_sql.get_cert(tx, key_id)
            if der is None:
                return  # the node refuses the envelope as unverifiable, which is the truth
            self._signer_certs[key_id] = der
        env.key_id = key_id
        env.cert_chain.append(der)

    async def batch_approval(self, batch_id: str) -> bytes:
        blob = self._approvals.get(batch_id)
        if blob is None:
            async with self.store.transaction(write=False) as tx:
                blob = await quorum_sql.approval_of(tx, batch_id)
            if blob is None:
                return b""  # not approved (a held command is never dispatched; the node would refuse it)
            self._approvals[batch_id] = blob  # an approval never changes once stored
        return blob

    async def renew_lease(self) -> bool:
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            return await leases_sql.acquire(
                tx, f"gateway:{self.gateway_id}", self.gateway_id, now_ms, GATEWAY_LEASE_TTL_MS
            )

    async def lease_loop(self) -> None:
        while True:
            try:
                if not await self.renew_lease():
                    log.error("event=gateway.fenced gateway=%s", self.gateway_id)
                    for d in list(self.sessions.values()):
                        d.request_close(
                            "UNAVAILABLE", "this gateway lost its lease; reconnect", closing.GATEWAY_UNAVAILABLE
                        )
            except StoreError as e:
                log.warning("event=gateway.lease-failed error=%s", e)
            await self.clock.sleep(GATEWAY_LEASE_RENEW_S)

    async def refuse_revoked(self, serial: str) -> None:
        async with self.store.transaction(write=False) as tx:
            rows = await rev_sql.revoked_among(tx, [serial])
        if rows:
            raise SessionRefused(closing.REVOKED, f"certificate revoked: {rows[0]['revoke_reason'] or 'revoked'}")

    async def revocation_loop(self) -> None:
        """The revocation feed: every second, end the sessions whose certificate was revoked or expired."""
        while True:
            try:
                await self.check_certificates()
                await self.push_trust_if_changed()
            except StoreError as e:
                log.warning("event=gateway.revocation-feed-failed error=%s", e)
            await self.clock.sleep(REVOCATION_POLL_S)

    async def push_trust_if_changed(self) -> None:
        """Approvers changed: every open session gets the newly signed bundle now, not at its next Welcome."""
        intent = self.intent
        if not intent.set_quorum(*await approvers.trust_state(self.store)):
            return
        env = intent.trust_envelope()
        if env is None:
            return
        log.info("event=trust.pushed sessions=%d approvers=%d", len(self.sessions), len(intent.approvers))
        for d in list(self.sessions.values()):
            if d.core.state is core.State.OPEN:
                try:
                    await d.link.send(GatewayMessage(trust=env))
                except LinkClosed:
                    pass

    async def check_certificates(self) -> None:
        drivers = list(self.sessions.values())
        if not drivers:
            return
        now_ms = await self.store.now_ms()
        async with self.store.transaction(write=False) as tx:
            revoked = await rev_sql.revoked_among(tx, sorted({d.peer.serial for d in drivers}))
        reasons = {str(r["serial"]): str(r["revoke_reason"] or "revoked") for r in revoked}
        for d in drivers:
            if d.peer.serial in reasons:
                await d.revoke(reasons[d.peer.serial])
            elif d.peer.not_after * 1000 < now_ms:
                d.request_close("UNAUTHENTICATED", "certificate expired; renew and reconnect", closing.EXPIRED)

    async def release_lease(self) -> None:
        async with self.store.transaction() as tx:
            await leases_sql.release(tx, f"gateway:{self.gateway_id}", self.gateway_id)

    async def serve(self, link: Link[NodeMessage, GatewayMessage], peer: PeerIdentity) -> None:
        driver = SessionDriver(self, link, peer)
        await driver.run()


class SessionDriver:
    def __init__(self, gw: Gateway, link: Link[NodeMessage, GatewayMessage], peer: PeerIdentity) -> None:
        self.gw, self.link, self.peer = gw, link, peer
        self.node_id = peer.name
        self.core = core.GatewaySessionCore(peer.name, gw.cfg.heartbeat_interval_s, gw.clock.monotonic())
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._poke_pending = False
        # When a dispatch is due though nothing poked: a pending command's not_before (monotonic; None: none).
        self._dispatch_at: float | None = None
        self._closing: core.Close | None = None
        self._close_reason: CloseReason = closing.UNSPECIFIED
        self._done = asyncio.Event()
        self._spec_refused_generation = 0  # the generation last reported as too large to send, so it is said once

    def poke(self) -> None:
        self._poke_pending = True
        self._wake.set()

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
            await asyncio.wait_for(self.link.send(GatewayMessage(revocation=notice)), 2.0)
        except (LinkClosed, TimeoutError):
            pass  # closing anyway; the handshake check refuses it on the next try
        self._done.set()

    def request_close(self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED) -> None:
        """End the session; `reason` is the typed code the node acts on (bc.protocol.closing)."""
        self._decide_close(code, details, reason)
        self._done.set()

    def _decide_close(self, code: str, details: str, reason: CloseReason) -> None:
        """The first decision stands: how the session ends, and why."""
        if self._closing is None:
            self._closing = core.Close(code, details)
            self._close_reason = reason

    async def run(self) -> None:
        reader = asyncio.create_task(self._read_loop(), name=f"session-read-{self.node_id}")
        ticker = asyncio.create_task(self._tick_loop(), name=f"session-tick-{self.node_id}")
        try:
            await self._done.wait()
        finally:
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
            await self.link.close(self._closing.code, self._closing.details, self._close_reason)

    async def _finish(self, *tasks: asyncio.Task[None]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._cleanup()

    async def _cleanup(self) -> None:
        self.core.close()
        if self.gw.sessions.get(self.node_id) is self:
            del self.gw.sessions[self.node_id]
        if self.core.epoch:
            try:
                now_ms = await self.gw.store.now_ms()
                async with self.gw.store.transaction() as tx:
                    if await self.gw.close_session(tx, self.node_id, self.core.epoch, now_ms):
                        await publish(
                            tx,
                            self.gw.bus,
                            "node.connectivity",
                            self.node_id,
                            {
                                "state": "disconnected",
                                "epoch": self.core.epoch,
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
                    msg = await asyncio.wait_for(self.link.recv(), self.gw.cfg.hello_timeout_s)
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
        except BcError as e:
            self.request_close("INTERNAL", e.message)

    async def _tick_loop(self) -> None:
        """Heartbeats and timers; pokes at once; status reports when the core says they are due."""
        try:
            last_seen_flush = self.gw.clock.monotonic()
            while True:
                # Sleep until the next timer (the core's heartbeat, silence and backstop, the status budget,
                # the liveness flush, a command's not_before) unless a frame or a poke wakes us first: an idle
                # session does nothing between its timers.
                now = self.gw.clock.monotonic()
                timeout = self.core.next_due(now)
                due = self.core.status_due(now)
                if due is not None:
                    timeout = min(timeout, due)
                if self.core.epoch:
                    timeout = min(timeout, last_seen_flush + LIVENESS_FLUSH_S - now)
                if self._dispatch_at is not None and self.core.state is core.State.OPEN:
                    timeout = min(timeout, self._dispatch_at - now)
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
                    # Commands go out on a poke (an enqueue, a cancel, a credit come free, a batch released),
                    # at a pending command's not_before, and on the 10 s backstop (a write no poke announced).
                    timed = self._dispatch_at is not None and now >= self._dispatch_at
                    if self.core.state is core.State.OPEN and (poked or backstop or timed):
                        await self._dispatch()
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
        async with self.gw.store.transaction(write=False) as tx:
            g = await nodes_sql.generation(tx, self.node_id)
        if g is not None:
            await self._execute(self.core.generation_is(int(g), reason))

    async def _flush_status(self) -> None:
        taken = self.core.take_status()
        if taken is None:
            return
        report, new = taken
        await status_ctl.ingest(self.gw.store, self.gw.bus, self.node_id, self.core.epoch, report, publish_it=new)

    async def _execute(self, actions: list[core.Action]) -> None:
        for a in actions:
            if isinstance(a, core.Send):
                await self.link.send(a.msg)
            elif isinstance(a, core.OpenSession):
                res = await hello_transaction(
                    self.gw.store, self.gw.bus, self.gw.signer, self.gw.gateway_id, self.peer, a.hello
                )
                if res.quarantined:
                    log.error("event=node.quarantined node=%s serial=%s", self.node_id, self.peer.serial)
                    await self._revoke_locked("duplicate-identity")
                    return
                old = self.gw.sessions.get(self.node_id)
                if old is not None and old is not self:
                    old.request_close("ABORTED", "superseded by a newer session of this node", closing.SUPERSEDED)
                self.gw.sessions[self.node_id] = self
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
                        self.gw.intent.trust_bundle(),
                        self.gw.gateway_id,
                        res.inventory_hash,
                        self.gw.intent.trust_envelope(),
                    )
                )
                if res.ack:
                    await self.link.send(GatewayMessage(ack=session_pb2.Ack(command_ids=res.ack)))
                for command_id in res.replay:
                    await self._send_command(command_id)
                await self._dispatch()
            elif isinstance(a, core.LoadSpec):
                await self._load_spec()
            elif isinstance(a, core.IngestEvents):
                ack = await ingest(self.gw.store, self.gw.bus, self.gw.signer, self.node_id, a.batch)
                if ack is not None:
                    await self.link.send(GatewayMessage(ack=ack))
            elif isinstance(a, core.ApplyCommandUpdate):
                await self._apply_update(a.update)
            elif isinstance(a, core.Close):
                self.request_close(a.code, a.details)

    # -- commands ------------------------------------------------------
    async def _dispatch(self) -> None:
        """Send what the lanes' credits allow, cancel what the guards refuse, and send pending Cancels."""
        store, epoch = self.gw.store, self.core.epoch
        # Most passes of a quiet node find nothing: one indexed read instead of a write transaction
        # (a session dispatches every second and on every poke).
        self._dispatch_at = None
        async with store.transaction(write=False) as tx:
            if not await commands_sql.has_open(tx, self.node_id):
                return
        now_ms = await store.now_ms()
        to_send: list[str] = []
        cancels: list[tuple[str, str]] = []
        async with store.transaction() as tx:
            node = await nodes_sql.role_and_labels(tx, self.node_id)
            if node is None:
                return
            labels = json.loads(str(node["labels"] or "{}"))
            rows = await commands_sql.pending_for_node(tx, self.node_id, now_ms)
            cancelled_early = {str(r["id"]) for r in await dispatch_sql.pending_cancelled(tx, self.node_id)}
            pending = [
                dispatch_rules.PendingCommand(
                    id=str(r["id"]),
                    node_id=str(r["node_id"]),
                    seq=int(r["seq"]),
                    lane=str(r["lane"]),
                    kind=str(r["kind"]),
                    body=bytes(r["body"]),
                    cancel_requested=r["cancel_requested_at_ms"] is not None,
                )
                for r in rows
            ]
            pending += [
                dispatch_rules.PendingCommand(cid, self.node_id, 0, "", "", b"", True)
                for cid in cancelled_early - {p.id for p in pending}
            ]
            plan = dispatch_rules.plan_dispatch(
                pending,
                await dispatch_sql.in_flight_by_lane(tx, self.node_id, epoch),
                str(node["role"]),
                tenant_controlled=labels.get("bc.dev/tenant-controlled") == "true",
            )
            for cid, reason in plan.cancel:
                await settle_by_server(tx, self.gw.bus, cid, self.node_id, "cancelled", reason, now_ms, ("pending",))
            for cid in plan.send:
                if await commands_sql.mark_dispatched(tx, cid, self.node_id, epoch, now_ms, self.gw.gateway_id):
                    to_send.append(cid)
            for r in await commands_sql.cancels_to_send(tx, self.node_id, epoch):
                cancels.append((str(r["id"]), str(r["cancel_reason"] or "cancelled")))
                await commands_sql.mark_cancel_sent(tx, str(r["id"]), self.node_id, epoch)
            if len(rows) >= commands_sql.DISPATCH_BATCH:
                self._dispatch_at = self.gw.clock.monotonic()  # more than one read's worth: go on at once
            else:
                later = await commands_sql.next_not_before(tx, self.node_id, now_ms)
                if later is not None:
                    self._dispatch_at = self.gw.clock.monotonic() + (later - now_ms) / 1000
        for cid in to_send:
            await self._send_command(cid)
        for cid, reason in cancels:
            await self.link.send(GatewayMessage(cancel=session_pb2.Cancel(command_id=cid, reason=reason)))

    async def _send_command(self, command_id: str) -> None:
        """Relay the stored body and signature verbatim: the gateway never re-encodes or signs."""
        async with self.gw.store.transaction(write=False) as tx:
            row = await commands_sql.get(tx, command_id)
        if row is None:
            return
        env = common_pb2.Envelope(purpose="command", body=bytes(row["body"]))
        if row["signature"] is not None:
            env.signature = bytes(row["signature"])
            await self.gw.attach_signer(env, str(row["signer_key_id"] or ""))
        cmd = session_pb2.Command(envelope=env, attempt=int(row["attempt"] or 0))
        if row["batch_id"]:
            # The batch's approvals and this command's own leaf proof, both as stored: the node checks them.
            cmd.batch_approval = await self.gw.batch_approval(str(row["batch_id"]))
            cmd.batch_proof = bytes(row["batch_proof"] or b"")
        msg = GatewayMessage(command=cmd)
        size = msg.ByteSize()
        if size > LIMITS.max_frame_bytes:  # stored before the limits: the node could never take it
            now_ms = await self.gw.store.now_ms()
            async with self.gw.store.transaction() as tx:
                await refuse_oversized_command(tx, self.gw.bus, self.node_id, command_id, size, now_ms)
            self.poke()  # its lane credit is free
            return
        await self.link.send(msg)

    async def _apply_update(self, update: session_pb2.CommandUpdate) -> None:
        """Results are facts, accepted on any epoch; every terminal one is acked, known or not."""
        store = self.gw.store
        now_ms = await store.now_ms()
        busy = update.state == session_pb2.COMMAND_REJECTED and update.reason == "BUSY"
        refused = False
        async with store.transaction() as tx:
            if busy:
                await dispatch_sql.requeue_busy(tx, update.command_id, self.node_id, now_ms + BUSY_RETRY_MS, now_ms)
            elif await refuse_oversized_update(tx, self.gw.bus, self.node_id, update, now_ms):
                refused = True
            else:
                outcome = await apply_update(tx, self.gw.bus, self.gw.signer, self.node_id, fit_texts(update), now_ms)
        if busy:
            return
        if refused:  # acked, so the node stops resending what will never be taken
            await self.link.send(GatewayMessage(ack=session_pb2.Ack(command_ids=[update.command_id])))
            self.poke()
            return
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
                self.poke()  # a lane credit came free

    async def _load_spec(self) -> None:
        async with self.gw.store.transaction(write=False) as tx:
            row = await nodes_sql.spec_delivery(tx, self.node_id)
        if row is None or row["spec_body"] is None:
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
