"""`bc node`: the agent. One asyncio process per host.

Three loops share the agent's state:

* the session loop dials the gateway over mutual TLS, runs one session at a
  time through the I/O-free core, and redials with full-jitter back-off
  (0–1 s, doubling to 60 s);
* the converge loop applies the spec held in the journal, section by section,
  on every new spec and every 10 s (the drift pass, which also re-reads the
  holds from the CDI directory), journals what it observed, and hands the
  session the newest status report (latest wins);
* the renewal loop (`agent/renewal.py`) renews the node certificate at 60 % of
  its life and then ends the session, so the redial presents the new one.

The spec is enforced from the journal whether or not a gateway is reachable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import random
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent import framing
from agent import session_core as sc
from agent.converge.devices import DevicesConverger
from agent.converge.run import Converger, run
from agent.dispatch import Dispatcher
from agent.hw import open_backend
from agent.hw.base import HardwareBackend, inventory_hash
from agent.identity import Identity
from agent.journal import Journal, JournalFull, StoredSpec
from agent.journal_rules import fit_update_message
from agent.kinds.base import KindContext
from agent.kinds.upload_allow import parse_prefixes
from agent.node_key import NodeKey
from agent.quorum import QuorumCheck, UnbatchedAllowance
from agent.renewal import Renewer
from agent.trust import AgentTrust, decide_bundle
from bc import __version__
from bc.aio import wait_event
from bc.clock import Clock, SystemClock
from bc.protocol.limits import LIMITS
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2
from bc.protocol.pb.session_pb2 import CommandUpdate, GatewayMessage, NodeMessage
from bc.wire.link import GrpcClientLink, Link, LinkClosed
from bc.wire.stubs import session_pb2_grpc
from bc.wire.tls import channel_credentials

log = logging.getLogger("agent")

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
DRIFT_PASS_S = 10.0
CONNECT_TIMEOUT_S = 5.0


@dataclass
class AgentOptions:
    data_dir: Path
    fake_hw: str | None = None
    cdi_dir: Path | None = None
    env_dir: Path | None = None
    heartbeat_interval_s: float | None = None
    allow_gpu_reset: bool = False
    allow_reboot: bool = False
    upload_allow: tuple[str, ...] = ()
    """`--upload-allow` URL prefixes: where logs.collect may upload (agent.kinds.upload_allow); none: nowhere."""


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Full jitter: uniform over [0, min(cap, base * 2^attempt)]."""
    return rng.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * (2 ** min(attempt, 16))))


class Agent:
    def __init__(
        self,
        opts: AgentOptions,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        hw: HardwareBackend | None = None,
    ) -> None:
        self.opts = opts
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.data_dir = opts.data_dir
        self.identity = Identity.load(self.data_dir)
        self.node_id = self.identity.node_id
        self.hw = hw or open_backend(opts.fake_hw, self.node_id, state_dir=self.data_dir)
        self.offset_ms = 0  # server time minus local wall time, from the last Welcome or heartbeat
        self.incarnation_id = secrets.token_hex(8)
        self.spec_changed = asyncio.Event()
        self.outbox_changed = asyncio.Event()
        self.stopped = asyncio.Event()
        self.status: session_pb2.StatusReport | None = None
        self.status_version = 0
        self.inventory = common_pb2.Inventory()
        self.inventory_hash = ""
        self.server_inventory_hash = ""
        self.connected = asyncio.Event()
        self.revoked_reason = ""
        self.pending_events: list[tuple[str, int, bytes]] = []
        self.trust = AgentTrust(self.identity.trust_bundle())
        self.node_key = NodeKey(self.data_dir / self.identity.files["key"])
        self.spec_unusable = False
        self._rejected_specs: set[tuple[int, bytes]] = set()
        self.session: SessionRunner | None = None  # the session running now, so a renewal can end it
        self.cert_renewals = 0
        # What a frame may hold; lowered only if a gateway refuses one as too large (agent.framing).
        self.frame_budget = LIMITS.max_frame_bytes

    async def open(self) -> None:
        self.journal = await Journal.open(self.data_dir / "journal.db", self.node_id)
        # An older agent may have journaled a result no gateway accepts: settle it before the first Hello.
        await self.journal.settle_oversized()
        self.stored = await self.journal.load_spec()
        self.spec = spec_pb2.NodeSpec()
        if self.stored is not None:
            self.spec.ParseFromString(self.stored.full_spec)
        self.observed_generation = await self.journal.int_meta("observed_generation")
        self.server_inventory_hash = await self.journal.get_meta("server_inventory_hash")
        self.time_mark_ms = max(await self.journal.int_meta("server_time_mark_ms"), self.identity.server_time_mark_ms)
        if self.stored is not None and self.trust.enforcing and not self.stored.signature:
            # Stored before this node held roots: keep enforcing it (releasing holds would hurt workloads)
            # but report no usable spec, so the next Welcome asks for a full, signed one.
            log.warning(
                "event=spec.unsigned-in-journal generation=%d; asking for a signed spec", self.stored.generation
            )
            self.spec_unusable = True
        cdi_dir = self.opts.cdi_dir or self.data_dir / "cdi"
        env_dir = self.opts.env_dir or self.data_dir / "allocations"
        self.convergers: dict[str, Converger] = {
            "devices": DevicesConverger(cdi_dir, env_dir, self.hw, self.node_id),
        }
        self.inventory = self.hw.inventory()
        self.inventory_hash = inventory_hash(self.inventory)
        self.boot_id = self.hw.boot_id()
        self.dispatcher = Dispatcher(
            node_id=self.node_id,
            role=self.identity.role,
            journal=self.journal,
            journal_full=self.journal.is_full,
            ctx=KindContext(
                node_id=self.node_id,
                data_dir=self.data_dir,
                hw=self.hw,
                cdi_dir=cdi_dir,
                boot_id=self.boot_id,
                allow_gpu_reset=self.opts.allow_gpu_reset,
                allow_reboot=self.opts.allow_reboot,
                log_paths=[self.data_dir / "node.log", self.data_dir / "node.log.1"],
                journal_summary=self.journal_summary,
                upload_allow=parse_prefixes(self.opts.upload_allow),
            ),
            clock=self.clock,
            incarnation_id=self.incarnation_id,
            boot_id=self.boot_id,
            applied_generation=lambda: self.applied_generation,
            server_now_ms=self.server_now_ms,
            signature_check=self._check_command_signature,
            quorum_check=QuorumCheck(
                self.trust,
                self.journal.claim_batch_leaf,
                UnbatchedAllowance(self.data_dir, self.clock),
                self.server_now_ms,
                self.clock,
            ),
            result_signer=self.sign_update,
        )
        await self.dispatcher.start()
        log.info(
            "event=agent.started node=%s journal_id=%s applied=%d incarnation=%s hw=%s cdi_dir=%s",
            self.node_id,
            self.journal.journal_id,
            self.applied_generation,
            self.incarnation_id,
            self.hw.describe(),
            cdi_dir,
        )

    def server_now_ms(self) -> int:
        return int(self.clock.now() * 1000) + self.offset_ms

    def sign_update(self, update: CommandUpdate) -> CommandUpdate:
        """Every update leaves fitted to the size table, then signed: the signature covers what is sent,
        and what is sent is what the journal holds (it applies the same rule)."""
        return self.node_key.attest_update(fit_update_message(update))

    def _check_command_signature(self, cmd: session_pb2.Command, body: session_pb2.CommandBody) -> str | None:
        why = self.trust.check_command(cmd, self.server_now_ms() / 1000)
        if why is None:
            return None
        log.error("event=command.bad-signature command=%s kind=%s why=%s", body.id, body.kind, why)
        return f"BAD_SIGNATURE: {why}"

    async def on_welcome_trust(self, e: sc.Welcomed) -> None:
        await self.offer_trust(e.trust_envelope, e.trust)

    async def offer_trust(self, env: common_pb2.Envelope | None, plain: common_pb2.TrustBundle | None) -> None:
        """Hold a new trust bundle only as agent.trust allows; persist it in identity.json."""
        ca_pem = await asyncio.to_thread(self.identity.read, self.data_dir, "ca")
        d = decide_bundle(self.trust.bundle, env, plain, ca_pem, self.server_now_ms() / 1000)
        if d.bundle is None:
            if d.reason not in ("unchanged", "no bundle offered"):
                log.warning("event=trust.bundle-refused reason=%s", d.reason)
            return
        self.trust.set(d.bundle)
        self.identity.set_trust_bundle(d.bundle)
        await asyncio.to_thread(self.identity.save, self.data_dir)
        log.info(
            "event=trust.bundle-updated roots=%d reason=%s",
            len(d.bundle.command_signing_roots),
            d.reason.replace(" ", "-"),
        )

    async def on_rejected_spec(self, e: sc.RejectedSpec) -> None:
        """Logged and reported once per body; never applied."""
        key = (e.generation, hashlib.sha256(e.body).digest())
        if key in self._rejected_specs:
            return
        self._rejected_specs.add(key)
        log.error("event=spec.rejected generation=%d why=%s", e.generation, e.reason)
        body = json.dumps({"generation": e.generation, "reason": e.reason}).encode()
        ev = session_pb2.NodeEvent(type="spec.rejected", body=body)
        try:
            await self.journal.append_events([("spec.rejected", session_pb2.TRANSITION, ev.SerializeToString())])
        except JournalFull:
            log.error("event=journal.full dropped=spec.rejected")
        self.outbox_changed.set()

    @property
    def applied_generation(self) -> int:
        return self.stored.generation if self.stored else 0

    @property
    def applied_spec_hash(self) -> str:
        return self.stored.spec_hash if self.stored else ""

    async def close(self) -> None:
        await self.dispatcher.stop()
        await self.journal.close()

    async def journal_summary(self) -> dict[str, object]:
        entries = await self.journal.commands()
        return {
            "node_id": self.node_id,
            "journal_id": self.journal.journal_id,
            "applied_generation": self.applied_generation,
            "observed_generation": self.observed_generation,
            "commands": {st: sum(1 for e in entries if e.state == st) for st in ("accepted", "running", "done")},
            "unacked_events": len(await self.journal.unacked_events(limit=100_000)),
        }

    # -- the converge loop ---------------------------------------------
    async def converge_once(self) -> None:
        generation = self.applied_generation
        outcome = await run(self.spec, generation, self.convergers)
        for r in outcome.events:
            kind = session_pb2.AllocationReport.Kind.Name(r.kind).lower()
            self.pending_events.append(
                (
                    f"allocation.{kind}",
                    session_pb2.RESULT,
                    session_pb2.NodeEvent(
                        type=f"allocation.{kind}",
                        report=self.node_key.sign_report(r.SerializeToString(deterministic=True)),
                    ).SerializeToString(),
                )
            )
            log.info(
                "event=allocation.%s allocation=%s reason=%s generation=%d",
                kind,
                r.allocation_id,
                r.reason,
                r.generation,
            )
        if self.pending_events:
            try:
                await self.journal.append_events(self.pending_events)
                self.pending_events = []
            except JournalFull:
                # Results are never dropped: keep them in memory and try again on the next pass; until acks
                # drain the journal, new commands are answered BUSY and this spec is not reported observed.
                log.error("event=journal.full pending_events=%d", len(self.pending_events))
                outcome = dataclasses.replace(outcome, observed=False)
        if outcome.observed and generation > self.observed_generation:
            self.observed_generation = generation
            await self.journal.set_observed(generation)
            log.info("event=spec.observed generation=%d", generation)
        inv = await asyncio.to_thread(self.hw.inventory)
        self.inventory, self.inventory_hash = inv, inventory_hash(inv)
        self.status = session_pb2.StatusReport(
            applied_generation=generation,
            observed_generation=self.observed_generation,
            applied_spec_hash=self.applied_spec_hash,
            sections=outcome.statuses,
            inventory_hash=self.inventory_hash,
        )
        self.status_version += 1
        self.outbox_changed.set()

    async def converge_loop(self) -> None:
        while not self.stopped.is_set():
            self.spec_changed.clear()
            try:
                await self.converge_once()
                await self.dispatcher.maybe_sweep()
            except Exception:  # a converge pass must never kill the agent; the next pass retries
                log.exception("event=converge.failed")
            await wait_event(self.spec_changed, DRIFT_PASS_S)

    # -- the session loop ----------------------------------------------
    async def session_loop(self) -> None:
        attempt = 0
        while not self.stopped.is_set():
            welcomed = False
            try:
                welcomed = await self.one_session()
            except LinkClosed as e:
                log.warning("event=session.ended code=%s details=%s", e.code, e.details)
                if e.code == "UNAUTHENTICATED" and ("revoked" in e.details or "older identity" in e.details):
                    self.revoked_reason = e.details
                self._after_refusal(e)
            except (OSError, grpc.aio.AioRpcError) as e:
                log.warning("event=session.failed error=%s", e)
            if self.revoked_reason:
                log.error("event=agent.revoked reason=%s; not redialing with this certificate", self.revoked_reason)
                self.identity.revoked = self.revoked_reason
                await asyncio.to_thread(self.identity.save, self.data_dir)
                self.stopped.set()
                return
            attempt = 0 if welcomed else attempt + 1
            delay = backoff_delay(attempt, self.rng)
            log.info("event=session.redial attempt=%d delay_s=%.2f", attempt, delay)
            await wait_event(self.stopped, delay)

    def _after_refusal(self, e: LinkClosed) -> None:
        """A frame refused as too large: pack smaller from now on, so the same frame is never resent."""
        budget = framing.budget_after_refusal(e.code, e.details, self.frame_budget)
        if budget is not None:
            log.error("event=session.frame-refused budget_before=%d budget=%d", self.frame_budget, budget)
            self.frame_budget = budget
        elif e.code == "RESOURCE_EXHAUSTED" and "larger than max" in e.details:
            log.error("event=session.frame-too-large-from-gateway details=%s", e.details)

    def _channel(self) -> grpc.aio.Channel:
        ident = self.identity
        creds = channel_credentials(
            ident.read(self.data_dir, "ca"), ident.read(self.data_dir, "key"), ident.read(self.data_dir, "cert")
        )
        return grpc.aio.secure_channel(
            ident.server,
            creds,
            options=[
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2_000),
                # The table's message limits (bc.protocol.limits): this agent never writes a frame over
                # max_frame_bytes, and accepts what a gateway may write.
                *LIMITS.grpc_options(),
            ],
        )

    async def one_session(self) -> bool:
        """Run one session to its end; True if it was welcomed (the back-off then starts over)."""
        renewals = self.cert_renewals
        async with self._channel() as channel:
            # Our back-off owns redialing: a channel that cannot connect in time is dropped and redialed,
            # rather than left to grpc's own reconnect back-off (which grows to minutes).
            try:
                await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
            except TimeoutError:
                raise LinkClosed("UNAVAILABLE", f"cannot connect to {self.identity.server}") from None
            if self.cert_renewals != renewals:
                return True  # renewed while this channel dialed with the old pair: redial with the new one
            call = session_pb2_grpc.NodeSessionStub(channel).Session()
            link: Link[GatewayMessage, NodeMessage] = GrpcClientLink(call)
            runner = SessionRunner(self, link)
            self.session = runner
            try:
                return await runner.run()
            finally:
                self.session = None

    # -- certificate renewal -------------------------------------------
    async def renewal_loop(self) -> None:
        renewer = Renewer(
            self.data_dir,
            self.identity,
            self.clock,
            self.rng,
            on_renewed=self.on_cert_renewed,
            on_trust=self.trust.set,
            server_offset_ms=lambda: self.offset_ms,
        )
        await renewer.run()

    def on_cert_renewed(self) -> None:
        """Move the session to the new certificate: end it, and the redial reads the new pair (`_channel`).

        The gateway closes a session whose certificate expires, so waiting for the session to end by
        itself is not enough; the session ends as if the gateway closed it cleanly (welcomed, so the
        redial comes at once, under a second of jitter).
        """
        self.cert_renewals += 1
        if self.session is not None:
            log.info("event=session.rotate reason=certificate-renewed")
            self.session.done.set()

    async def run(self) -> None:
        if self.identity.revoked:
            from bc.errors import Unauthenticated

            raise Unauthenticated(
                f"this node's certificate was revoked ({self.identity.revoked}); it will not dial with it again."
                " Join again: bc join --reset --yes, then bc join"
            )
        await self.open()
        tasks = [
            asyncio.create_task(self.session_loop(), name="session"),
            asyncio.create_task(self.converge_loop(), name="converge"),
            asyncio.create_task(self.renewal_loop(), name="renewal"),
        ]
        try:
            await self.stopped.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.close()


class SessionRunner:
    """One session: the core over a link, plus the agent's outbox (events, status).

    Every frame goes out through `_send`, packed to the agent's frame budget first (`agent.framing`): the
    Hello carries the unacked results that fit and the rest follow Welcome, events go in as many batches as
    it takes, and a frame over the budget is never written.
    """

    def __init__(self, agent: Agent, link: Link[GatewayMessage, NodeMessage]) -> None:
        self.agent = agent
        self.link = link
        a = agent
        self.core = sc.AgentSessionCore(
            node_id=a.node_id,
            role=a.identity.role,
            boot_id=a.hw.boot_id(),
            journal_id=a.journal.journal_id,
            incarnation_id=a.incarnation_id,
            applied_generation=0 if a.spec_unusable else a.applied_generation,
            applied_spec_hash="" if a.spec_unusable else a.applied_spec_hash,
            time_mark_ms=a.time_mark_ms,
            capabilities=["devices.cdi"],
            inventory_hash=a.inventory_hash,
        )
        self.core.applied_spec = a.spec if a.stored else None
        self.core.spec_check = a.trust.check_spec
        self.core.need_spec = a.spec_unusable or a.stored is None
        self.core.inventory = a.inventory
        self.core.server_inventory_hash = a.server_inventory_hash
        self.sent_event_seq = 0
        self.sent_status_version = 0
        self.sent_inventory_hash = ""
        self.welcomed = False
        self.closed: sc.Close | None = None
        self.done = asyncio.Event()
        self.after_welcome: list[CommandUpdate] = []  # unacked results that did not fit the Hello

    async def run(self) -> bool:
        a = self.agent
        unacked = [a.sign_update(CommandUpdate.FromString(b)) for _id, b in await a.journal.unacked_results()]
        hello = self.core.hello(a.clock.monotonic(), __version__, [], await a.dispatcher.running_ids())
        hello, self.after_welcome = framing.pack_hello(hello, unacked, a.frame_budget)
        await asyncio.wait_for(self._send(hello), sc.WELCOME_TIMEOUT_S)
        reader = asyncio.create_task(self._read(), name="session-read")
        writer = asyncio.create_task(self._write(), name="session-write")
        closed = asyncio.create_task(self.done.wait(), name="session-closed")
        try:
            done, _ = await asyncio.wait({reader, writer, closed}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                exc = None if t.cancelled() else t.exception()
                if exc is not None:
                    raise exc
        finally:
            for t in (reader, writer, closed):
                t.cancel()
            await asyncio.gather(reader, writer, closed, return_exceptions=True)
            self.agent.connected.clear()
            if self.agent.dispatcher.sender == self._send:
                self.agent.dispatcher.sender = None
        if self.closed is not None:
            log.warning("event=session.closed reason=%s", self.closed.reason)
            if not self.closed.redial:
                self.agent.revoked_reason = self.closed.reason
            await self.link.close("CANCELLED", self.closed.reason)
        return self.welcomed

    async def _read(self) -> None:
        a = self.agent
        while True:
            msg = await self.link.recv()
            if msg is None:
                log.info("event=session.eof")
                return
            effects = self.core.on_message(msg, a.clock.monotonic(), int(a.clock.now() * 1000))
            await self._apply(effects)
            if self.closed is not None:
                return

    async def _send(self, msg: NodeMessage) -> None:
        """Every frame of this session goes out here, and none over the budget (see agent.framing)."""
        size = msg.ByteSize()
        if size > self.agent.frame_budget:
            # Unreachable by construction (everything is fitted or packed first); sending it would end the
            # stream at the gateway and the next session would try again, so it is dropped and said loudly.
            log.error(
                "event=frame.unsendable kind=%s bytes=%d budget=%d",
                msg.WhichOneof("msg"),
                size,
                self.agent.frame_budget,
            )
            return
        await self.link.send(msg)

    async def _apply(self, effects: list[sc.Effect]) -> None:
        a = self.agent
        for e in effects:
            if isinstance(e, sc.Send):
                await self._send(e.msg)
            elif isinstance(e, sc.Welcomed):
                self.welcomed = True
                if e.inventory_hash != a.server_inventory_hash:
                    a.server_inventory_hash = e.inventory_hash
                    await a.journal.set_meta("server_inventory_hash", e.inventory_hash)
                self.sent_inventory_hash = e.inventory_hash
                a.connected.set()
                a.offset_ms = e.offset_ms
                await a.on_welcome_trust(e)
                await a.journal.set_meta("clock_offset_ms", str(e.offset_ms))
                await a.journal.set_meta("clock_offset_at_ms", str(int(a.clock.now() * 1000)))
                a.dispatcher.sender = self._send
                await self._send_after_welcome()
                log.info(
                    "event=session.welcomed epoch=%d offset_ms=%d heartbeat_s=%.1f",
                    e.epoch,
                    e.offset_ms,
                    e.heartbeat_interval_s,
                )
                if a.opts.heartbeat_interval_s:
                    self.core.heartbeat_interval_s = a.opts.heartbeat_interval_s
                a.outbox_changed.set()
            elif isinstance(e, sc.DeliverCommand):
                a.offset_ms = self.core.offset_ms
                await a.dispatcher.on_command(e.command)
            elif isinstance(e, sc.DeliverCancel):
                await a.dispatcher.on_cancel(e.cancel)
            elif isinstance(e, sc.AckResults):
                await a.dispatcher.on_ack(e.command_ids)
            elif isinstance(e, sc.AdvanceTimeMark):
                a.time_mark_ms = await a.journal.advance_time_mark(e.server_time_ms)
                if a.time_mark_ms - a.identity.server_time_mark_ms > 60_000:
                    a.identity.server_time_mark_ms = a.time_mark_ms
                    await asyncio.to_thread(a.identity.save, a.data_dir)
            elif isinstance(e, sc.AcceptSpec):
                stored = StoredSpec(
                    e.generation,
                    e.spec_hash,
                    e.body,
                    e.signature or None,
                    e.key_id,
                    e.spec.SerializeToString(deterministic=True),
                )
                await a.journal.store_spec(stored)
                a.stored, a.spec = stored, e.spec
                a.spec_unusable = False
                log.info("event=spec.accepted generation=%d hash=%s", e.generation, e.spec_hash)
                a.spec_changed.set()
                await a.dispatcher.on_spec_applied()
            elif isinstance(e, sc.IgnoredSpec):
                log.info("event=spec.ignored reason=%s", e.reason)
            elif isinstance(e, sc.RejectedSpec):
                await a.on_rejected_spec(e)
            elif isinstance(e, sc.TrustOffered):
                await a.offer_trust(e.envelope, None)
            elif isinstance(e, sc.AckEvents):
                n = await a.journal.ack_events(e.upto_seq)
                log.debug("event=events.acked upto=%d dropped=%d", e.upto_seq, n)
            elif isinstance(e, sc.Close):
                self.closed = e
                self.done.set()

    async def _send_after_welcome(self) -> None:
        """The unacked results the Hello had no room for, each in its own frame, oldest first."""
        later, self.after_welcome = self.after_welcome, []
        if later:
            log.info("event=session.results-after-welcome count=%d", len(later))
        for update in later:
            await self._send(NodeMessage(command_update=update))

    async def _write(self) -> None:
        """Heartbeats, new events and the newest status, whenever the core is open."""
        a = self.agent
        while True:
            # Clear before reading the outbox: a change made while we flush wakes the next round.
            a.outbox_changed.clear()
            await self._apply(self.core.tick(a.clock.monotonic()))
            if self.core.state is sc.State.OPEN:
                await self._flush_events()
                await self._flush_status()
                await a.dispatcher.expire_deferred()
            await wait_event(a.outbox_changed, 1.0)

    async def _flush_events(self) -> None:
        events = [e for e in await self.agent.journal.unacked_events() if e.seq > self.sent_event_seq]
        if not events:
            return
        nodes: list[session_pb2.NodeEvent] = []
        for ev in events:
            ne = session_pb2.NodeEvent()
            ne.ParseFromString(ev.payload)
            ne.seq = ev.seq
            nodes.append(ne)
        for batch in framing.pack_events(self.agent.journal.journal_id, nodes, self.agent.frame_budget):
            await self._send(NodeMessage(event_batch=batch))
            self.sent_event_seq = batch.events[-1].seq

    async def _flush_status(self) -> None:
        a = self.agent
        if a.status is None or a.status_version == self.sent_status_version:
            return
        rep = framing.trim_status(a.status)
        if a.inventory_hash != self.sent_inventory_hash:
            rep.inventory.CopyFrom(a.inventory)
            self.sent_inventory_hash = a.inventory_hash
        await self._send(NodeMessage(status=rep))
        self.sent_status_version = a.status_version


async def run_agent(opts: AgentOptions) -> None:
    from bc import logs

    logs.setup("node", file=opts.data_dir / "node.log")
    agent = Agent(opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stopped.set)
    await agent.run()
    if agent.revoked_reason:
        from bc.errors import Unauthenticated

        raise Unauthenticated(f"this node's certificate was refused: {agent.revoked_reason}")
