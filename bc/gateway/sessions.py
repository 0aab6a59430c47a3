"""The gateway: this process's side of every node session.

`Gateway` accepts sessions (`serve`), admits Hellos through its queue, keeps the
registry of live sessions (one `SessionDriver` a node, `bc.gateway.session_driver`),
holds its `gateway:<id>` lease and fences itself when it loses it, relays the
bus's pokes and the revocation feed to the sessions, and batches their liveness
flushes. What happens on one node's stream is the driver's.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from bc.control.base.bus import Bus
from bc.control.commands.dispatch import SessionSends
from bc.control.signing.signer import Signer
from bc.control.trust.intent import Intent
from bc.control.trust.sources import LocalTrust, TrustSource
from bc.errors import Overloaded, Unavailable
from bc.gateway import core
from bc.gateway import lease as lease_rule
from bc.gateway.admission import HELLO_WAIT_LIMIT_S, Admission, StatusBudget, Turn
from bc.gateway.counters import STATS_EVERY_S, GatewayCounters
from bc.gateway.dispatcher import Dispatcher
from bc.gateway.fence import FENCE_AFTER_S, LeaseFence
from bc.gateway.secret_feed import NoBroker, SecretFeed
from bc.gateway.session_driver import SecretPort, SessionDriver
from bc.gateway.tunnels import TunnelHub
from bc.pki.identity import PeerIdentity
from bc.protocol import closing
from bc.protocol.closing import SessionRefused
from bc.protocol.pb import common_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.seams.clock import Clock
from bc.seams.link import Link, LinkClosed
from bc.store import Store, StoreError
from bc.store import health as health_sql
from bc.store import leases as leases_sql
from bc.store import nodes as nodes_sql
from bc.store import quorum as quorum_sql
from bc.store import revocation as rev_sql
from bc.store import signing as signing_sql
from bc.store.group_commit import GroupCommit
from bc.store.leases import Claim

log = logging.getLogger("bc.gateway")

GATEWAY_LEASE_TTL_MS = 20_000
GATEWAY_LEASE_RENEW_S = 5.0
SEEN_BATCH_S = 0.5
"""Liveness flushes due within this long share one transaction (a gateway's sessions flush every 5 s)."""
REVOCATION_POLL_S = 1.0
REVOCATION_LOOKBACK_MS = 60_000
"""How far before its last look the revocation feed reads again (`Gateway.check_certificates`)."""
BACKSTOP_READ_S = 5.0
"""How old the generations a session's backstop compares against may be (`Gateway.backstop_generation`)."""


@dataclass
class GatewayConfig:
    heartbeat_interval_s: float = 10.0
    hello_timeout_s: float = 10.0


class Gateway:
    """`signer` signs nothing here: the gateway relays stored signatures. It decides whether results and reports
    must carry the node's own signature, and signs the specs that allocation reports change (a `KeylessSigner`
    leaves them for a key-holding process to sign); `intent` is the trust bundle every Welcome carries: this
    process's own `Intent`, or a `RelayedTrust` in a gateway-only process."""

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
        intent: Intent | TrustSource,
        cfg: GatewayConfig,
        claim: Claim | None = None,
        secrets: SecretPort | None = None,
    ) -> None:
        self.store, self.bus, self.clock, self.gateway_id, self.cfg = store, bus, clock, gateway_id, cfg
        # This process's hold on `gateway:<id>` (bc.gateway.lease): its own holder string and the epoch it took
        # the lease at. Without one (the simulator, tests), the holder is the id itself.
        self.claim = claim or Claim(lease_rule.name_of(gateway_id), gateway_id)
        self.superseded = ""  # set once another process took the lease after this one: it acts no more
        self.on_superseded: Callable[[str], None] | None = None  # bc serve stops the process (exit 4)
        self.signer = signer
        self.secrets: SecretPort = secrets or NoBroker()  # the broker this process holds (docs/secrets.md)
        self.secret_feed = SecretFeed()
        self.trust: TrustSource = LocalTrust(intent) if isinstance(intent, Intent) else intent
        self.sessions: dict[str, SessionDriver] = {}
        self.tunnels = TunnelHub()  # the nodes' tunnels through this gateway (bc.gateway.tunnels)
        self.streams: dict[SessionDriver, None] = {}
        """Every stream served, from its admission to its end (a session once its Hello is written); a dict for
        its order, which a seeded run must not take from memory addresses as a set's would be."""
        self._revocations_read_ms = 0  # store time of the revocation feed's last look (0: none yet)
        self._revoked_read: asyncio.Future[dict[str, str]] | None = None  # new streams' shared revocation read
        self._revoked_asked: set[str] = set()
        self._generations_task: asyncio.Future[dict[str, int]] | None = None  # backstop_generation's read
        self._generations_at = 0.0
        self._signer_certs: dict[str, bytes] = {}
        self._approvals: dict[str, bytes] = {}
        self._preapprovals: dict[int, bytes] = {}
        self._closing_tasks: set[asyncio.Future[None]] = set()
        self._seen_batch: dict[str, SessionDriver] = {}
        self.fence = LeaseFence(clock.monotonic())
        self.admission = Admission(clock.monotonic())
        self._hello_waiters: deque[asyncio.Future[None]] = deque()
        self._rng = random.Random(gateway_id)  # the retry-afters' jitter: a seeded run stays a function of its seed
        self.status_budget = StatusBudget(clock.monotonic())
        self.counters = GatewayCounters()
        self.group = GroupCommit(store)
        """Status reports, command updates and node events of every session: one transaction per batch."""
        self.draining = False
        self.dispatcher = Dispatcher(
            store, bus, clock, gateway_id, self._open_epochs, self._deliver, lambda: self.fence.fenced, self.track
        )
        bus.on_node_changed(self._poke)

    def track(self, task: asyncio.Future[None]) -> None:
        """Work that must finish before the store closes (session close writes)."""
        self._closing_tasks.add(task)
        task.add_done_callback(self._closing_tasks.discard)

    async def drain(self) -> None:
        """Refuse new sessions, close every session and wait for the close writes and the dispatcher's last
        pass; the caller bounds it with a timeout. A stream admitted before the drain is closed too: a Hello
        not yet in its transaction is not written, one already written is closed in the store."""
        self.draining = True
        for d in list(self.streams):  # the sessions, and the streams whose Hello is still on its way
            self._close_draining(d)
        self.dispatcher.wake()  # with no session open its loop ends now, not at its next tick
        while self.streams or self.sessions or self._closing_tasks:
            if self._closing_tasks:
                await asyncio.wait(list(self._closing_tasks))
            else:
                await asyncio.sleep(0.05)  # a session between its close request and its cleanup task
        await self.group.wait_idle()

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
        flushed: list[tuple[SessionDriver, float]] = []
        try:
            now_ms = await self.store.now_ms()
            now = self.clock.monotonic()
            async with self.store.transaction() as tx:
                current = await nodes_sql.open_epochs(tx, sorted(n for n, d in batch.items() if d.core.epoch))
                seen: list[tuple[str, int, int]] = []
                for node_id, d in sorted(batch.items()):
                    epoch = d.core.epoch
                    if not epoch:
                        continue
                    if current.get(node_id) == epoch:
                        heard = d.core.last_heard
                        if heard == d.seen_flushed:
                            continue  # nothing heard since this session's last flush: the stored time stands
                        seen.append((node_id, epoch, now_ms - int((now - heard) * 1000)))
                        flushed.append((d, heard))
                    else:
                        superseded.append(d)
                await nodes_sql.mark_seen_many(tx, seen)
        except StoreError as e:  # the next flush tries again; the sessions' own writes notice a store that is gone
            log.warning("event=liveness.flush-failed sessions=%d error=%s", len(batch), e)
            return
        for d, heard in flushed:  # committed: only now is the stored time this session's
            d.seen_flushed = heard
        for d in superseded:
            d.request_close("ABORTED", "this session was superseded; the node is routed elsewhere", closing.SUPERSEDED)

    async def backstop_generation(self, node_id: str) -> int | None:
        """The node's stored generation as of at most `BACKSTOP_READ_S` ago, read for every session at once.

        Each session's 10 s backstop asked the store for its own node's generation: a transaction per session
        every 10 s. They now share one read of every routed node's generation; a change since then reaches the
        session by its poke, and the next backstop sees it. None: not in that read (a session newer than it).
        """
        now = self.clock.monotonic()
        if self._generations_task is None or now - self._generations_at >= BACKSTOP_READ_S:
            self._generations_at = now
            self._generations_task = asyncio.ensure_future(self._read_generations())
        try:
            generations = await asyncio.shield(self._generations_task)
        except StoreError:
            self._generations_task = None
            raise
        return generations.get(node_id)

    async def _read_generations(self) -> dict[str, int]:
        async with self.store.transaction(write=False) as tx:
            return await nodes_sql.generations_routed_to(tx, self.gateway_id)

    def _poke(self, node_id: str) -> None:
        d = self.sessions.get(node_id)
        if d is not None:
            d.poke()

    def _open_epochs(self, only: Collection[str] | None = None) -> dict[str, int]:
        """The epoch this gateway holds for each node whose session is open (of `only`, when given: a pass for
        the nodes poked since the last one need not walk every session): dispatch sends only on these."""
        sessions = self.sessions
        if only is None:
            return {n: d.core.epoch for n, d in sessions.items() if d.core.state is core.State.OPEN and not d.ending}
        out: dict[str, int] = {}
        for n in only:
            d = sessions.get(n)
            if d is not None and d.core.state is core.State.OPEN and not d.ending:
                out[n] = d.core.epoch
        return out

    def _deliver(self, node_id: str, sends: SessionSends) -> None:
        d = self.sessions.get(node_id)
        if d is not None:
            d.deliver(sends)

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

    async def preapproval(self, version: int) -> bytes:
        """A health policy version's pre-approval (bc.pki.preapproval) as the node checks it: the version's text
        and its batch's approvals; b"" while it has none (the node refuses the command then, and says why)."""
        blob = self._preapprovals.get(version)
        if blob is None:
            async with self.store.transaction(write=False) as tx:
                row = await health_sql.policy_version(tx, version)
                batch_id = str(row["preapproval_batch"] or "") if row is not None else ""
                approval = await quorum_sql.approval_of(tx, batch_id) if batch_id else None
            if row is None or approval is None:
                return b""
            pre = common_pb2.HealthPreapproval(
                policy_version=version, policy_json=str(row["policy"]), batch_approval=approval
            )
            blob = pre.SerializeToString(deterministic=True)
            self._preapprovals[version] = blob  # a version and its approval never change once stored
        return blob

    async def renew_lease(self) -> bool:
        """Take or renew the lease; True while this process holds it. A later epoch than this process's
        (another one took the lease after it) sets `superseded` and is never a renewal."""
        if self.superseded:
            return False
        now_ms = await self.store.now_ms()
        async with self.store.urgent_transaction() as tx:
            got = await leases_sql.take(tx, self.claim.name, self.claim.holder, now_ms, GATEWAY_LEASE_TTL_MS)
        was = self.claim.epoch
        verdict = lease_rule.judge(self.claim, got)
        if verdict is lease_rule.Renewal.SUPERSEDED:
            self.superseded = lease_rule.superseded(
                self.gateway_id, Claim(self.claim.name, self.claim.holder, was), got
            )
        return verdict is lease_rule.Renewal.HELD

    def _supersede(self) -> None:
        """Stop acting for good: fenced (no routing, no new session), and the owner told (bc serve exits)."""
        log.error("event=gateway.superseded gateway=%s why=%r", self.gateway_id, self.superseded)
        self.fence.end("superseded: another process took this gateway's lease")
        self._fenced()
        if self.on_superseded is not None:
            self.on_superseded(self.superseded)

    async def lease_loop(self) -> None:
        if self.superseded:  # found at start (bc serve's first renewal)
            return self._supersede()
        while True:
            now = self.clock.monotonic()
            if self.fence.check(now):  # woken late (a stall, a paused process): the nodes may be routed elsewhere
                self._fenced()
            # A renewal stuck on an unreachable store must not hold the fence back past its deadline.
            budget = max(1.0, self.fence.last_renewed + FENCE_AFTER_S - now)
            try:
                async with asyncio.timeout(budget):
                    renewed = await self.renew_lease()
                if self.superseded:
                    return self._supersede()
                if renewed:
                    if self.fence.renewed(now):
                        log.warning("event=gateway.unfenced gateway=%s", self.gateway_id)
                elif self.fence.moved(now):
                    self._fenced()
            except (StoreError, TimeoutError) as e:
                log.warning("event=gateway.lease-failed error=%s", e or "the store did not answer in time")
                if self.fence.failed(self.clock.monotonic()):
                    self._fenced()
            await self.clock.sleep(self.fence.next_check_in(self.clock.monotonic(), GATEWAY_LEASE_RENEW_S))

    async def stats_loop(self) -> None:
        """`event=gateway.stats` every `STATS_EVERY_S` while something changed (bc.gateway.counters)."""
        last = self.counters.snapshot()
        while True:
            await self.clock.sleep(STATS_EVERY_S)
            now = self.counters.snapshot()
            if now != last:
                log.info("%s", self.counters.line(self.gateway_id, len(self.sessions)))
                last = now

    async def drain_spread(self, over_s: float) -> None:
        """`bc serve drain`: refuse new sessions and close the open ones one by one, spread over `over_s`,
        so their nodes redial the other gateways as a trickle, not a storm; returns when none is left."""
        self.draining = True
        drivers = sorted(self.sessions.values(), key=lambda d: d.node_id)
        gap = over_s / max(1, len(drivers))
        for i, d in enumerate(drivers):
            if i:
                await self.clock.sleep(gap)
            d.request_close(
                "UNAVAILABLE", f"gateway {self.gateway_id} is draining; reconnect", closing.GATEWAY_UNAVAILABLE
            )
        log.info("event=gateway.drained gateway=%s sessions=%d over_s=%.0f", self.gateway_id, len(drivers), over_s)
        await self.drain()

    def _fenced(self) -> None:
        """Stop routing: every stream closes UNAVAILABLE (its node redials, maybe elsewhere); new ones are refused."""
        log.error(
            "event=gateway.fenced gateway=%s why=%s sessions=%d", self.gateway_id, self.fence.why, len(self.sessions)
        )
        for d in list(self.sessions.values()):
            d.request_close(
                "UNAVAILABLE", f"this gateway is fenced ({self.fence.why}); reconnect", closing.GATEWAY_UNAVAILABLE
            )

    def admit(self) -> None:
        """A new stream: refused while fenced or draining (the node's back-off takes it to another gateway)
        and beyond the handshake rate (a reconnect storm: the node retries after the retry-after it is told)."""
        if self.draining:
            self.counters.streams_refused += 1
            raise Unavailable(f"gateway {self.gateway_id} is draining; try another")
        if self.fence.fenced:
            self.counters.streams_refused += 1
            raise Unavailable(f"this gateway is fenced ({self.fence.why}); try another")
        now = self.clock.monotonic()
        if not self.admission.handshake(now):
            raise self._overloaded("this gateway is taking too many new sessions at once", now)

    def _overloaded(self, why: str, now: float) -> Overloaded:
        """A refusal that says when to come back: the next free slot after this gateway's queue (admission)."""
        self.counters.streams_refused += 1
        after_ms = round(self.admission.retry_after(now, self._rng) * 1000)
        return Overloaded(f"{why}; retry after {after_ms} ms", after_ms)

    async def hello_slot(self) -> None:
        """Wait for a Hello transaction slot (`bc.gateway.admission`): at once, after the Hellos queued ahead,
        or refused with a retry-after (Overloaded) when the queue is full or the wait ran past its limit.
        The caller calls `hello_done()` once its transaction ends."""
        now = self.clock.monotonic()
        turn = self.admission.hello(now)
        if turn is Turn.RUN:
            return
        if turn is Turn.REFUSE:
            raise self._overloaded("too many Hello transactions at once on this gateway", now)
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._hello_waiters.append(slot)
        self.counters.hellos_waited += 1
        try:
            async with asyncio.timeout(HELLO_WAIT_LIMIT_S):
                await slot
        except TimeoutError:
            if slot.done() and not slot.cancelled():
                return  # handed a slot as the limit struck: take it
            self._leave_queue(slot)
            raise self._overloaded("the Hellos queued on this gateway are not draining in time", now) from None
        except asyncio.CancelledError:  # the stream ended while it waited
            if slot.done() and not slot.cancelled():
                self.hello_done()  # handed a slot it will not use: pass it on
            else:
                self._leave_queue(slot)
            raise

    def _leave_queue(self, slot: asyncio.Future[None]) -> None:
        if slot in self._hello_waiters:  # else `hello_done` already took it out (cancelled) and counted it
            self._hello_waiters.remove(slot)
            self.admission.hello_gave_up()

    def hello_done(self) -> None:
        """A Hello transaction ended: its slot goes to the first waiting Hello, if any."""
        self.admission.hello_done(self.clock.monotonic())
        while self._hello_waiters:
            slot = self._hello_waiters[0]
            if slot.done():  # cancelled, its task not yet run: it left the queue
                self._hello_waiters.popleft()
                self.admission.hello_gave_up()
                continue
            if not self.admission.take_waiting():
                return
            self._hello_waiters.popleft().set_result(None)
            return

    async def refuse_revoked(self, serial: str) -> None:
        """Refuse a revoked certificate before its stream carries a frame. The new streams of one turn of the
        loop (a reconnect storm's) share one read of the store, made after all of them asked."""
        if self._revoked_read is None:
            self._revoked_read = asyncio.ensure_future(self._read_revoked())
        self._revoked_asked.add(serial)
        reasons = await asyncio.shield(self._revoked_read)
        if serial in reasons:
            raise SessionRefused(closing.REVOKED, f"certificate revoked: {reasons[serial]}")

    async def _read_revoked(self) -> dict[str, str]:
        await asyncio.sleep(0)  # the streams that ask in this turn of the loop join this read
        asked, self._revoked_asked, self._revoked_read = sorted(self._revoked_asked), set(), None
        async with self.store.transaction(write=False) as tx:
            rows = await rev_sql.revoked_among(tx, asked)
        return {str(r["serial"]): str(r["revoke_reason"] or "revoked") for r in rows}

    async def revocation_loop(self) -> None:
        """The revocation feed: every second, end the sessions whose certificate was revoked or expired; tell
        the sessions of nodes whose secrets were set anew (`bc.gateway.secret_feed`)."""
        while True:
            try:
                await self.check_certificates()
                await self.push_trust_if_changed()
                await self.secret_feed.poll(self.store, self.sessions)
            except StoreError as e:
                log.warning("event=gateway.revocation-feed-failed error=%s", e)
            await self.clock.sleep(REVOCATION_POLL_S)

    async def push_trust_if_changed(self) -> None:
        """Approvers changed: every open session gets the newly signed bundle now, not at its next Welcome."""
        if not await self.trust.refresh(self.store):
            return
        env = self.trust.trust_envelope()
        if env is None:
            return
        approver_n = len(self.trust.trust_bundle().approver_keys)
        log.info("event=trust.pushed sessions=%d approvers=%d", len(self.sessions), approver_n)
        for d in list(self.sessions.values()):
            if d.core.state is core.State.OPEN:
                try:
                    await d.link.send(GatewayMessage(trust=env))
                except LinkClosed:
                    pass

    async def check_certificates(self) -> None:
        """Revoked since the last look (with `REVOCATION_LOOKBACK_MS` of overlap), or expired.

        The feed reads the few certificates revoked lately, not one row per open session: a session opened
        since is checked at its Hello (`refuse_revoked`), and the overlap covers a revocation committed after
        a look that its store time already fell behind (a slow transaction; another process's)."""
        drivers = list(self.sessions.values())
        now_ms = await self.store.now_ms()
        since = self._revocations_read_ms - REVOCATION_LOOKBACK_MS if self._revocations_read_ms else 0
        if not drivers:
            return
        async with self.store.transaction(write=False) as tx:
            revoked = await rev_sql.revoked_since(tx, since)
        self._revocations_read_ms = now_ms
        reasons = {str(r["serial"]): str(r["revoke_reason"] or "revoked") for r in revoked}
        for d in drivers:
            if d.peer.serial in reasons:
                self.tunnels.close_node(d.node_id, f"the node's certificate was revoked ({reasons[d.peer.serial]})")
                await d.revoke(reasons[d.peer.serial])
            elif d.peer.not_after * 1000 < now_ms:
                d.request_close("UNAUTHENTICATED", "certificate expired; renew and reconnect", closing.EXPIRED)

    async def release_lease(self) -> None:
        """Let the lease go at stop, keeping its row and so its epoch (a take by another holder bumps it)."""
        async with self.store.transaction() as tx:
            await leases_sql.give_up(tx, self.claim.name, self.claim.holder)

    @staticmethod
    def _close_draining(driver: SessionDriver) -> None:
        driver.request_close("UNAVAILABLE", "the server is stopping; reconnect", closing.GATEWAY_UNAVAILABLE)

    async def serve(self, link: Link[NodeMessage, GatewayMessage], peer: PeerIdentity) -> None:
        driver = SessionDriver(self, link, peer)
        self.streams[driver] = None
        if self.draining:
            # Admitted before the drain began, this stream waited (its serial's revocation read) past the drain's
            # close of every stream: it would open a session nobody closes, and the drain would never end.
            self._close_draining(driver)
        try:
            await driver.run()
        finally:
            del self.streams[driver]
