"""Deliberately broken components, so a run can prove the invariant checkers fail when they should.

`bc sim --break RULE` builds the fleet with one component swapped for a broken one. Nothing in production
code reads a flag: each break is a substitute handed to a seam the runner already passes (the agent's
`open_journal`, the classes and factories the control plane is built from), or a subclass overriding a
seam the production class declares with its production default (`Gateway.close_session`,
`PlacementPass.planner`, `PlacementPass.flush`, `PlacementPass.check_stored_bookings`), or the agent's
`AgentParts.spec_rule` (production: `agent.session_core.decide_spec`), or the quorum count both ends take
(`bc.control.quorum.batches.decide(count=...)` and `AgentParts.quorum_count`; production:
`bc.pki.quorum.count_approvals`).

    RULE                       broken component                                          caught by
    skip-journal-dedupe        a journal that forgets what it accepted: a redelivered        I2
                               command runs again
    release-on-disconnect      a Liveness that releases a node's holds when it makes the     I5
                               node disconnected or unreachable (reason `node-unreachable`)
    ignore-epoch-fence         a gateway whose session close writes the node disconnected    I4
                               even when the fence refuses (a superseded session ending
                               while its successor is open), so liveness marks a node
                               whose open session it hears from unreachable
    double-book                a placement pass blind to the bookings in effect or to come,  I1
                               whose booking transaction skips its I1 check too
    double-count-usage         a usage flush that writes each closed window twice, the copy  I8
                               keyed a millisecond later so the store's unique key lets it in
    unreachable-without-grace  a Liveness with no lease TTL and no grace: a node goes        I4
                               unreachable as soon as its session closes
    lost-fsync                 a journal that does not fsync its command writes: a power     I2
                               loss forgets every command it had accepted and not finished
                               (same journal id), so the replay runs it again
    release-on-journal-loss    a devices converger without the adoption rule: on a lost      I5
                               journal (no spec) it releases every hold it finds
    spec-out-of-order          an agent whose sessions apply whatever full spec arrives      I3
                               last, a generation older than the one applied included
    quorum-duplicate-signer    a quorum count, at the control plane and on the node, that    Q1
                               counts a signer twice (one key twice, or two keys of one
                               operator) toward k, so a batch runs with fewer than k people
    health-ignore-limits       a health reconciler whose decision is shown no limits (no     H1
                               node cap, no per-label rule, no hourly limit): a storm
                               starts every remediation at once (`--health` runs only)
    health-release-holds       a health reconciler that releases the holds on a GPU as it    H1
                               starts its remediation, instead of waiting (`--health`)
    health-reset-under-hold    a health reconciler whose remediation resets the GPU          H1
                               without waiting for its drain (`--health`)
    health-forget-repeats      a health reconciler blind to the episodes that ended: a GPU   H1
                               sick again within the repeat window is remediated again
                               instead of quarantined (`--health`)
    instance-as-hold           a devices converger that writes a CDI spec for an instance's  V1
                               GPUs too, as for a hold, while they are passed through to
                               its VM (`--instances` runs only)

The health reconciler's breaks (`bc.sim.health_breaks`) are swapped in through `ControlFactories.health_cls`:
two set the production reconciler's `decider` seam (as `PlacementPass.planner` is set for double-book), one
its job engine's `build` seam, one overrides its start.

`seams_for(rule)` returns the `SimSeams` the runner applies as it builds the control plane and the agents;
`seams_for(None)` the production ones. A break shows only when the run meets what it is wrong about: a
command frame delivered twice, a hold on a node that goes away, a session that closes, a reservation that
waits (the placement `reserve` runs inline is the production one; the broken background pass books the
waiting one over what is taken), a closed usage hour, a node redialling while the gateway still holds its
old session, an older spec of the node arriving after a newer one (heavy chaos's `spec-replay`), a batch
one operator signed with both of its keys (`bc.sim.workload`'s approver0 holds two).
tests/sim/test_sim_breaks_e2e.py holds a small seeded run for each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.converge.devices import Action, Bind, DevicesConverger, Release, resolve
from agent.hw import cdi
from agent.hw.cdi import HeldSpec
from agent.instances.bookings import InstanceBookings
from agent.journal_api import AgentJournal, JournalEvent, StoredSpec
from agent.journal_rules import KEEP_S, Acceptance, CommandEntry, Settlement
from agent.session_core import SpecRule, decide_spec
from bc.control.base.bus import Bus
from bc.control.capacity import placement_pass
from bc.control.capacity.placement_pass import PlacementPass
from bc.control.capacity.placement_plan import Booking, NodeInfo, Placement, Plan, Request, plan
from bc.control.capacity.usage_windows import windows_to_flush
from bc.control.nodes.liveness import Liveness, LivenessConfig
from bc.control.signing.signer import Signer
from bc.errors import UsageError
from bc.gateway.sessions import Gateway
from bc.jobs.health import HealthReconciler
from bc.pki import quorum as q
from bc.protocol import connectivity as cx
from bc.protocol.atoms import parse_atom
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2
from bc.sim.health_breaks import EvictingReconciler, HastyReconciler, LimitlessReconciler, RepeatBlindReconciler
from bc.sim.releases import release_reservation
from bc.store import Store, Tx
from bc.store import capacity as cap_sql
from bc.store import connectivity as cx_sql
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql

OpenJournal = Callable[[], Awaitable[AgentJournal]]
PowerLoss = Callable[[AgentJournal], Awaitable[None]]
"""What a machine's power loss does to its journal, given the journal as the agent left it."""
LivenessFactory = Callable[[Store, Bus, str, LivenessConfig, Signer], Liveness]

# ---- skip-journal-dedupe ----


class DelegatingJournal:
    """A journal that hands every call to the one it wraps: the base for a journal that changes one thing
    (a broken one here; a recording one in a runner)."""

    def __init__(self, inner: AgentJournal) -> None:
        self.inner = inner
        self.journal_id = inner.journal_id

    async def get_command(self, command_id: str) -> CommandEntry | None:
        return await self.inner.get_command(command_id)

    async def accept(self, a: Acceptance) -> None:
        await self.inner.accept(a)

    async def close(self) -> None:
        await self.inner.close()

    async def get_meta(self, key: str, default: str = "") -> str:
        return await self.inner.get_meta(key, default)

    async def set_meta(self, key: str, value: str) -> None:
        await self.inner.set_meta(key, value)

    async def int_meta(self, key: str) -> int:
        return await self.inner.int_meta(key)

    async def advance_time_mark(self, server_time_ms: int) -> int:
        return await self.inner.advance_time_mark(server_time_ms)

    async def set_observed(self, generation: int) -> None:
        await self.inner.set_observed(generation)

    async def store_spec(self, spec: StoredSpec) -> None:
        await self.inner.store_spec(spec)

    async def load_spec(self) -> StoredSpec | None:
        return await self.inner.load_spec()

    async def append_events(self, items: list[tuple[str, int, bytes]]) -> list[JournalEvent]:
        return await self.inner.append_events(items)

    async def is_full(self) -> bool:
        return await self.inner.is_full()

    async def event_stats(self) -> tuple[int, int]:
        return await self.inner.event_stats()

    async def unacked_events(self, limit: int = 500) -> list[JournalEvent]:
        return await self.inner.unacked_events(limit)

    async def ack_events(self, upto_seq: int) -> int:
        return await self.inner.ack_events(upto_seq)

    async def claim_batch_leaf(self, scope_root: str, leaf_index: int, command_id: str, now: float) -> str:
        return await self.inner.claim_batch_leaf(scope_root, leaf_index, command_id, now)

    async def use_ticket(self, jti: str, exp_ms: int, now_ms: int) -> str:
        return await self.inner.use_ticket(jti, exp_ms, now_ms)

    async def command_body(self, command_id: str) -> bytes | None:
        return await self.inner.command_body(command_id)

    async def mark_running(self, command_id: str, incarnation_id: str, boot_id: str, now: float) -> None:
        await self.inner.mark_running(command_id, incarnation_id, boot_id, now)

    async def finish(self, command_id: str, update: bytes, now: float) -> bool:
        return await self.inner.finish(command_id, update, now)

    async def record_done(
        self, command_id: str, kind: str, update: bytes, incarnation_id: str, boot_id: str, now: float
    ) -> bool:
        return await self.inner.record_done(command_id, kind, update, incarnation_id, boot_id, now)

    async def unacked_results(self) -> list[tuple[str, bytes]]:
        return await self.inner.unacked_results()

    async def ack_results(self, command_ids: Iterable[str]) -> int:
        return await self.inner.ack_results(command_ids)

    async def commands(self) -> list[CommandEntry]:
        return await self.inner.commands()

    async def delete_commands(self, command_ids: Iterable[str]) -> int:
        return await self.inner.delete_commands(command_ids)

    async def apply_settlements(
        self, settlements: Sequence[Settlement], updates: Mapping[str, bytes], now: float
    ) -> int:
        return await self.inner.apply_settlements(settlements, updates, now)

    async def sweep_commands(self, now: float, incarnation_id: str, keep_s: float = KEEP_S) -> list[str]:
        return await self.inner.sweep_commands(now, incarnation_id, keep_s)

    async def settle_oversized(self) -> list[CommandEntry]:
        return await self.inner.settle_oversized()


class ForgetfulJournal(DelegatingJournal):
    """A journal that forgets what it accepted: it never finds a command, and accepting one drops whatever
    entry it had, so a redelivered command (a duplicate frame, a replay after a reconnect or a crash) is
    executed again instead of resent, reattached or settled. Everything else goes to the real journal."""

    async def get_command(self, command_id: str) -> CommandEntry | None:
        return None

    async def accept(self, a: Acceptance) -> None:
        await self.inner.delete_commands([a.command_id])
        await self.inner.accept(a)


def forgetful(open_journal: OpenJournal) -> OpenJournal:
    """The agent's journal opener, opening a `ForgetfulJournal` over what the real one opens."""

    async def open_forgetful() -> AgentJournal:
        return ForgetfulJournal(await open_journal())

    return open_forgetful


# ---- release-on-disconnect, unreachable-without-grace ----

RELEASE_REASON = "node-unreachable"


class ReleasingLiveness(Liveness):
    """Liveness as production runs it, then a release of every hold on each node it made disconnected or
    unreachable: the assignment dropped from the node's spec, the bookings freed, the usage closed, the
    reservation `released` with reason `node-unreachable` (the reason I5 refuses)."""

    def __init__(self, store: Store, bus: Bus, holder: str, cfg: LivenessConfig, signer: Signer) -> None:
        super().__init__(store, bus, holder, cfg)
        self.signer = signer

    async def sweep_once(self) -> list[tuple[str, str]]:
        out = await super().sweep_once()
        for node_id in sorted({n for n, _ in out}):
            await self.release_holds_on(node_id)
        return out

    async def release_holds_on(self, node_id: str) -> list[str]:
        now_ms = await self.store.now_ms()
        released: list[str] = []
        async with self.store.transaction() as tx:
            for row in await res_sql.list_(tx, node_id, state="active"):
                if str(row["node_id"] or "") != node_id:
                    continue
                lock = self.store.for_update()
                if await release_reservation(tx, self.bus, self.signer, row, RELEASE_REASON, now_ms, lock=lock):
                    released.append(str(row["id"]))
        return released


class NoGraceLiveness(Liveness):
    """Liveness with no lease TTL and no gateway-loss grace: a session closes (or falls a moment silent) and
    the next sweep marks its node unreachable, however recently the gateway heard from it."""

    def __init__(self, store: Store, bus: Bus, holder: str, cfg: LivenessConfig) -> None:
        super().__init__(store, bus, holder, LivenessConfig(lease_ttl_ms=0, unreachable_grace_ms=0))
        del cfg


def production_liveness(store: Store, bus: Bus, holder: str, cfg: LivenessConfig, signer: Signer) -> Liveness:
    del signer  # production liveness releases nothing, so it signs nothing
    return Liveness(store, bus, holder, cfg)


def releasing_liveness(store: Store, bus: Bus, holder: str, cfg: LivenessConfig, signer: Signer) -> Liveness:
    return ReleasingLiveness(store, bus, holder, cfg, signer)


def no_grace_liveness(store: Store, bus: Bus, holder: str, cfg: LivenessConfig, signer: Signer) -> Liveness:
    del signer
    return NoGraceLiveness(store, bus, holder, cfg)


# ---- ignore-epoch-fence ----


async def close_unfenced(tx: Tx, node_id: str, epoch: int, now_ms: int, reason: str = cx.SESSION_CLOSED) -> bool:
    """Close the session, and when the fence refuses (a newer session of the node is open: this one was
    superseded) apply the table's close to the node anyway: `disconnected`. The newer session stays open and
    keeps its node heard, so nothing corrects the state, and liveness marks a node it hears from unreachable."""
    if await nodes_sql.close_session(tx, node_id, epoch, now_ms, reason):
        return True
    return await cx_sql.move(tx, node_id, cx.CLOSE, now_ms, reason)


class UnfencedGateway(Gateway):
    """A gateway whose session-close write of the node's connectivity ignores the epoch fence."""

    close_session = staticmethod(close_unfenced)


# ---- double-book ----


def blind_plan(
    nodes: Sequence[NodeInfo],
    bookings: Sequence[Booking],
    pending: Sequence[Request],
    now_ms: int,
    *,
    protect: int | None = None,
) -> Plan:
    """The pure planner, shown only the bookings whose window is over (so it still ends them): it places over
    every booking in effect or to come."""
    over = [b for b in bookings if b.end_ms is not None and b.end_ms <= now_ms]
    return plan(nodes, over, pending, now_ms, protect=protect)


class DoubleBookingPass(PlacementPass):
    """A placement pass blind to the bookings, whose booking transaction skips the stored-bookings check."""

    planner = staticmethod(blind_plan)

    async def check_stored_bookings(self, tx: Tx, o: Placement) -> None:
        del tx, o  # skipped: that check would refuse the overlap this pass exists to write


# ---- double-count-usage ----


async def flush_twice(tx: Tx, now_ms: int, reservation_id: str = "") -> int | None:
    """The production flush, then a copy of every window it wrote keyed one millisecond later (a key the
    store's unique (reservation, start) has never seen, so it counts the window's time a second time)."""
    copies = []
    for row in await cap_sql.unflushed_spans(tx, reservation_id):
        flushed = None if row["flushed_ms"] is None else int(row["flushed_ms"])
        copies += [
            w for w in windows_to_flush(placement_pass.span_of(row), flushed, now_ms) if w.end_ms > w.start_ms + 1
        ]
    next_cut = await placement_pass.flush_usage(tx, now_ms, reservation_id)
    for w in copies:
        await cap_sql.insert_usage_window(
            tx,
            reservation_id=w.reservation_id,
            start_ms=w.start_ms + 1,
            end_ms=w.end_ms,
            node_id=w.node_id,
            tenant=w.tenant,
            device_class=w.device_class,
            atoms=w.atoms,
        )
    return next_cut


class DoubleCountingPass(PlacementPass):
    """A placement pass whose usage flush counts each window twice."""

    flush = staticmethod(flush_twice)


# ---- lost-fsync ----


async def forget_unfinished(journal: AgentJournal) -> None:
    """A power loss under a journal that does not fsync its command writes (it answers `accept` and
    `mark_running` from the page cache, and the ACK and RUNNING leave before anything is durable): every
    command it had accepted and not finished is gone, under the same journal id, so the control plane's
    replay finds nothing to deduplicate against and the node runs it again."""
    lost = [e.command_id for e in await journal.commands() if e.state in ("accepted", "running")]
    if lost:
        await journal.delete_commands(lost)


# ---- release-on-journal-loss ----


class ReleasingDevices(DevicesConverger):
    """The devices converger without the adoption rule (`agent.converge.adoption`): on a journal that holds no
    spec (lost, wiped) it converges the empty spec of generation 0 like any other, so it releases every hold
    it finds, and reports them released, while the control plane still counts them held."""

    def holds_to_keep(self, held: Mapping[str, HeldSpec], generation: int) -> dict[str, HeldSpec] | None:
        return None


# ---- instance-as-hold ----


class InstanceAsHoldDevices(DevicesConverger):
    """A devices converger that books an instance's GPUs (BINDING_INSTANCE) and also writes a CDI spec for
    them, as for a hold: a container runtime then sees GPUs the VM has passed through (`bc sim --instances`)."""

    def _scan(self) -> tuple[dict[str, HeldSpec], str | None]:
        held, mps = super()._scan()
        if self.instance_bookings is not None:  # its booking is what it goes by; the CDI file rides along
            held.update(self.instance_bookings.read())
        return held, mps

    async def _apply_instance(self, bookings: InstanceBookings, action: Action) -> None:
        await super()._apply_instance(bookings, action)
        if isinstance(action, Release):
            await self.files.remove("cdi", action.held.allocation_id)
        if not isinstance(action, Bind):
            return
        a = action.assignment
        inventory = await self.offload(self.hw.inventory)
        devices = [resolve(parse_atom(r.device_class, r.atom_id), inventory) for r in a.devices]
        env = cdi.env_lines(a.allocation_id, devices, kubernetes=False, extra_env=[], mps_pipe_dir=None)
        doc = cdi.render_spec(a.allocation_id, a.reservation_id, devices, env, kubernetes=False)
        await self.files.write("cdi", a.allocation_id, cdi.spec_bytes(doc))


# ---- spec-out-of-order ----


def apply_any_generation(
    body: session_pb2.DesiredStateBody, node_id: str, applied_generation: int, applied_spec: spec_pb2.NodeSpec | None
) -> spec_pb2.NodeSpec | str:
    """The production rule without its generation check: a full spec for this node is applied whatever its
    generation, so an older one that arrives after a newer one (a replay, a stale session's send) winds the
    node back. A patch still needs its base (it cannot be applied to anything else)."""
    if body.node_id == node_id and body.WhichOneof("content") == "full":
        return body.full
    return decide_spec(body, node_id, applied_generation, applied_spec)


# ---- quorum-duplicate-signer ----


def count_duplicate_signers(
    approval: common_pb2.BatchApproval, approvers: Iterable[common_pb2.ApproverKey], now_ms: int | None
) -> q.Tally:
    """`bc.pki.quorum.count_approvals` without its two distinctness checks: a key that signed twice counts
    twice, and a second key of an operator who already approved counts too. Everything else is the production
    rule (an approver key of the set, not the requester's, unexpired, a valid signature over the scope)."""
    by_id = {a.key_id: a for a in approvers}
    counted: list[str] = []
    refused: list[tuple[str, str]] = []
    for sig in approval.signatures:
        key = by_id.get(sig.key_id)
        msg = q.approval_message(
            approval.batch_id, approval.scope_root, approval.leaf_count, approval.requested_by, sig.expires_at_ms
        )
        if key is None:
            refused.append((sig.key_id, "not an approver key"))
        elif q.is_requesters(key, approval.requested_by):
            refused.append((sig.key_id, "the requester's own key"))
        elif now_ms is not None and sig.expires_at_ms <= now_ms:
            refused.append((sig.key_id, "expired"))
        elif not q.verify(bytes(key.public_key), msg, sig.signature):
            refused.append((sig.key_id, "bad signature"))
        else:
            counted.append(sig.key_id)
    return q.Tally(counted, refused)


# ---- the rules ----


def same_journal(open_journal: OpenJournal) -> OpenJournal:
    return open_journal


@dataclass(frozen=True)
class SimSeams:
    """What the runner builds the fleet from. Apply each as the production wiring would use the default:

    * `journal(open_journal)` wraps each agent's journal opener (`AgentParts.open_journal`);
    * `liveness(store, bus, holder, cfg, signer)` builds the control plane's Liveness;
    * `devices_cls` is each agent's devices converger class (`AgentParts.devices_converger`);
    * `gateway_cls` and `placement_cls` are constructed with the production constructors' arguments;
    * `power_loss(journal)`, when set, runs on a node's journal each time its machine loses power (with the
      agent down, before it boots anew);
    * `spec_rule` is each agent's `AgentParts.spec_rule`;
    * `quorum_count` is the batch quorum's count at both ends: the control plane's (`decide(count=...)`, which
      the workload passes as the Admin servicer would pass the default) and each agent's
      `AgentParts.quorum_count`.
    """

    rule: str | None = None
    checker: str | None = None  # the invariant the break must make fail
    journal: Callable[[OpenJournal], OpenJournal] = same_journal
    liveness: LivenessFactory = production_liveness
    gateway_cls: type[Gateway] = Gateway
    placement_cls: type[PlacementPass] = PlacementPass
    devices_cls: type[DevicesConverger] = DevicesConverger
    power_loss: PowerLoss | None = None
    """What a power loss (a node reboot of the chaos, a strike) does to the node's journal; None: nothing,
    as the production journal fsyncs every write before it answers."""
    spec_rule: SpecRule = decide_spec
    quorum_count: q.CountApprovals = q.count_approvals
    health_cls: type[HealthReconciler] = HealthReconciler
    """The control plane's health reconciler class (`ControlFactories.health_cls`)."""


RULES: dict[str, SimSeams] = {
    s.rule: s
    for s in (
        SimSeams("skip-journal-dedupe", "I2", journal=forgetful),
        SimSeams("release-on-disconnect", "I5", liveness=releasing_liveness),
        SimSeams("ignore-epoch-fence", "I4", gateway_cls=UnfencedGateway),
        SimSeams("double-book", "I1", placement_cls=DoubleBookingPass),
        SimSeams("double-count-usage", "I8", placement_cls=DoubleCountingPass),
        SimSeams("unreachable-without-grace", "I4", liveness=no_grace_liveness),
        SimSeams("lost-fsync", "I2", power_loss=forget_unfinished),
        SimSeams("release-on-journal-loss", "I5", devices_cls=ReleasingDevices),
        SimSeams("spec-out-of-order", "I3", spec_rule=apply_any_generation),
        SimSeams("quorum-duplicate-signer", "Q1", quorum_count=count_duplicate_signers),
        SimSeams("health-ignore-limits", "H1", health_cls=LimitlessReconciler),
        SimSeams("health-release-holds", "H1", health_cls=EvictingReconciler),
        SimSeams("health-reset-under-hold", "H1", health_cls=HastyReconciler),
        SimSeams("health-forget-repeats", "H1", health_cls=RepeatBlindReconciler),
        SimSeams("instance-as-hold", "V1", devices_cls=InstanceAsHoldDevices),
    )
    if s.rule is not None
}
PRODUCTION = SimSeams()


def seams_for(rule: str | None) -> SimSeams:
    """The seams for `--break RULE`; None: the production components."""
    if rule is None:
        return PRODUCTION
    seams = RULES.get(rule)
    if seams is None:
        raise UsageError(f"unknown --break rule {rule!r}; rules are {', '.join(RULES)}")
    return seams


__all__ = [
    "PRODUCTION",
    "RELEASE_REASON",
    "RULES",
    "DelegatingJournal",
    "DoubleBookingPass",
    "DoubleCountingPass",
    "ForgetfulJournal",
    "LimitlessReconciler",
    "NoGraceLiveness",
    "PowerLoss",
    "ReleasingDevices",
    "ReleasingLiveness",
    "SimSeams",
    "UnfencedGateway",
    "apply_any_generation",
    "blind_plan",
    "close_unfenced",
    "count_duplicate_signers",
    "flush_twice",
    "forget_unfinished",
    "forgetful",
    "seams_for",
]
