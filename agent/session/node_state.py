"""What the node holds in process, and the changes a session makes to it.

One object shared by the session runner (which changes it as the gateway
speaks: the clock offset, the time mark, the spec, the trust bundle) and the
converge loop (which reads the spec and records what it observed). It mirrors
the journal's meta and spec: every change is journaled (or saved in
identity.json) before it is held here, so a restart reads back what it held.

Its dependencies are passed in: the journal, where identity.json is kept
(`IdentityStore`), the CA certificate (read once before the loop), the trust
holder, the outbox (poked when an event is journaled) and the clock.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable

from google.protobuf.message import DecodeError

from agent import session_core as sc
from agent.identity import Identity, IdentityStore
from agent.journal_api import AgentJournal, JournalFull, StoredSpec
from agent.session.outbox import Outbox
from agent.trust import AgentTrust, decide_bundle
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2
from bc.seams.clock import Clock

log = logging.getLogger("agent")

TIME_MARK_SAVE_STEP_MS = 60_000
"""identity.json keeps the time mark too (it outlives a lost journal), saved when it moved this much."""


class NodeState:
    def __init__(
        self,
        *,
        identity: Identity,
        identity_store: IdentityStore,
        ca_pem: bytes,
        trust: AgentTrust,
        journal: AgentJournal,
        outbox: Outbox,
        clock: Clock,
        connected: asyncio.Event | None = None,
    ) -> None:
        """`connected`: set while a session is welcomed (the agent makes it before there is a state to hold)."""
        self.identity, self.identity_store, self.ca_pem = identity, identity_store, ca_pem
        self.trust, self.journal, self.outbox, self.clock = trust, journal, outbox, clock
        self.node_id, self.role = identity.node_id, identity.role
        self.stored: StoredSpec | None = None
        self.spec = spec_pb2.NodeSpec()
        self.spec_unusable = False  # held, but not what a Hello may report (unsigned under roots)
        self.observed_generation = 0
        self.time_mark_ms = identity.server_time_mark_ms
        self.offset_ms = 0  # server time minus local wall time, from the last Welcome or heartbeat
        self.server_inventory_hash = ""
        self.spec_changed = asyncio.Event()
        self.spec_listeners: list[Callable[[spec_pb2.NodeSpec], None]] = []  # told of each spec accepted
        self.connected = connected or asyncio.Event()
        self._rejected_specs: set[tuple[int, bytes]] = set()
        self._labels: dict[str, str] = {}
        self._labels_of: StoredSpec | None = None

    async def load(self) -> None:
        """Read back what the journal holds (at start, before any session)."""
        j = self.journal
        self.stored = await j.load_spec()
        self.spec = spec_pb2.NodeSpec()
        if self.stored is not None:
            self.spec.ParseFromString(self.stored.full_spec)
        self.observed_generation = await j.int_meta("observed_generation")
        self.server_inventory_hash = await j.get_meta("server_inventory_hash")
        self.time_mark_ms = max(await j.int_meta("server_time_mark_ms"), self.identity.server_time_mark_ms)
        if self.stored is not None and self.trust.enforcing and not self.stored.signature:
            # Stored before this node held roots: keep enforcing it (releasing holds would hurt workloads)
            # but report no usable spec, so the next Welcome asks for a full, signed one.
            log.warning(
                "event=spec.unsigned-in-journal generation=%d; asking for a signed spec", self.stored.generation
            )
            self.spec_unusable = True

    @property
    def applied_generation(self) -> int:
        return self.stored.generation if self.stored else 0

    def labels(self) -> dict[str, str]:
        """The node's labels as its held (signed) spec body carries them (`bc nodes label`); {} before any."""
        if self._labels_of is not self.stored:
            body = session_pb2.DesiredStateBody()
            try:
                body.ParseFromString(self.stored.body if self.stored is not None else b"")
            except DecodeError:
                body = session_pb2.DesiredStateBody()
            self._labels, self._labels_of = dict(body.labels), self.stored
        return dict(self._labels)

    @property
    def applied_spec_hash(self) -> str:
        return self.stored.spec_hash if self.stored else ""

    def server_now_ms(self) -> int:
        return int(self.clock.now() * 1000) + self.offset_ms

    # -- what a session changes ------------------------------------------------
    async def welcomed(self, e: sc.Welcomed) -> None:
        if e.inventory_hash != self.server_inventory_hash:
            self.server_inventory_hash = e.inventory_hash
            await self.journal.set_meta("server_inventory_hash", e.inventory_hash)
        self.connected.set()
        self.offset_ms = e.offset_ms
        await self.offer_trust(e.trust_envelope, e.trust)
        await self.journal.set_meta("clock_offset_ms", str(e.offset_ms))
        await self.journal.set_meta("clock_offset_at_ms", str(int(self.clock.now() * 1000)))

    def disconnected(self) -> None:
        self.connected.clear()

    async def accept_spec(self, e: sc.AcceptSpec) -> None:
        full = e.spec.SerializeToString(deterministic=True)
        stored = StoredSpec(e.generation, e.spec_hash, e.body, e.signature or None, e.key_id, full)
        await self.journal.store_spec(stored)
        self.stored, self.spec = stored, e.spec
        self.spec_unusable = False
        log.info("event=spec.accepted generation=%d hash=%s", e.generation, e.spec_hash)
        self.spec_changed.set()
        for listener in self.spec_listeners:
            listener(e.spec)

    async def reject_spec(self, e: sc.RejectedSpec) -> None:
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
        self.outbox.poke()

    async def offer_trust(self, env: common_pb2.Envelope | None, plain: common_pb2.TrustBundle | None) -> None:
        """Hold a new trust bundle only as agent.trust allows; persist it in identity.json."""
        d = decide_bundle(self.trust.bundle, env, plain, self.ca_pem, self.server_now_ms() / 1000)
        if d.bundle is None:
            if d.reason not in ("unchanged", "no bundle offered"):
                log.warning("event=trust.bundle-refused reason=%s", d.reason)
            return
        self.trust.set(d.bundle)
        self.identity.set_trust_bundle(d.bundle)
        await self.identity_store.save(self.identity)
        log.info(
            "event=trust.bundle-updated roots=%d reason=%s",
            len(d.bundle.command_signing_roots),
            d.reason.replace(" ", "-"),
        )

    async def advance_time_mark(self, server_time_ms: int) -> None:
        self.time_mark_ms = await self.journal.advance_time_mark(server_time_ms)
        if self.time_mark_ms - self.identity.server_time_mark_ms > TIME_MARK_SAVE_STEP_MS:
            self.identity.server_time_mark_ms = self.time_mark_ms
            await self.identity_store.save(self.identity)

    # -- what the converge loop and the agent change ---------------------------
    async def observed(self, generation: int) -> None:
        self.observed_generation = generation
        await self.journal.set_observed(generation)
        log.info("event=spec.observed generation=%d", generation)

    async def certificate_refused(self, reason: str) -> None:
        """Never dial with this identity again (revoked, or an older identity): said in identity.json."""
        self.identity.revoked = reason
        await self.identity_store.save(self.identity)
