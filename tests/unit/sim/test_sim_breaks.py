"""Each `--break` rule's component does the wrong thing, and its checker names it on the facts it leaves; the
production component in the same scene does not (end to end, over the whole fleet: tests/sim)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import cast

import pytest
from google.protobuf.json_format import MessageToJson

from agent.app import AgentParts
from agent.converge.devices import DevicesConverger
from agent.hw.base import inventory_hash
from agent.hw.cdi import HeldSpec
from agent.hw.fake import FakeHardware
from agent.journal_api import AgentJournal
from agent.journal_rules import Acceptance, Resolution, resolve
from agent.memory_journal import MemoryJournal
from agent.quorum import check_batch
from agent.session_core import AcceptSpec, IgnoredSpec, SpecRule, decide_spec
from bc.control.base.bus import Bus
from bc.control.capacity import invariants
from bc.control.capacity.invariants import BillingMismatch, Overlap, ReleasedOnDisconnect
from bc.control.capacity.placement_pass import PlacementPass, bookings_of, span_of
from bc.control.capacity.placement_plan import iso
from bc.control.capacity.reservations import ReserveRequest, reserve
from bc.control.capacity.usage_windows import UsageWindow
from bc.control.health import decide as hd
from bc.control.health.conditions import GpuCondition, signals_of
from bc.control.health.policy import Policy
from bc.control.nodes.liveness import Liveness, LivenessConfig
from bc.control.signing.signer import NullSigner
from bc.errors import UsageError
from bc.gateway.sessions import Gateway
from bc.jobs import templates
from bc.jobs.views import JobRequest
from bc.pki import quorum as q
from bc.protocol.pb import common_pb2, kinds_pb2
from bc.seams.clock import LoopClock
from bc.sim import breaks
from bc.sim.breaks import (
    PRODUCTION,
    RULES,
    DoubleBookingPass,
    DoubleCountingPass,
    ForgetfulJournal,
    NoGraceLiveness,
    OpenJournal,
    ReleasingDevices,
    ReleasingLiveness,
    UnfencedGateway,
    apply_any_generation,
    count_duplicate_signers,
    forget_unfinished,
    seams_for,
)
from bc.sim.checkers import (
    DoubleExecution,
    FalseUnreachable,
    UnderQuorum,
    WentBack,
    check_all,
    check_i2,
    check_i4,
    check_node_kept_holds,
    check_q1,
    check_spec_order,
)
from bc.sim.facts import (
    BatchRan,
    FactLog,
    NodeRelease,
    QuorumHeld,
    SideEffect,
    connectivity_from_events,
    release_fact,
)
from bc.sim.health_breaks import decide_forgetting_repeats, remediate_without_drain_wait
from bc.store import capacity as cap_sql
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance
from tests.unit.agent.test_agent_session_core import base_spec, desired, full_body, opened, patch_body
from tests.unit.agent.test_dispatch import Harness, command
from tests.unit.agent.test_quorum_check import Approver, Batch, new_approver, reset_payload
from tests.unit.agent.test_quorum_check import command as batch_command
from tests.unit.control.test_liveness import gateway_lease, open_session

SIGNER = NullSigner()
CFG = LivenessConfig()  # lease TTL 40 s, grace 120 s
H = 3_600_000


# ---- the rules ----


def test_each_rule_swaps_a_component_and_names_the_checker_it_must_fail() -> None:
    assert seams_for(None) is PRODUCTION
    assert sorted(RULES) == sorted(
        [
            "skip-journal-dedupe",
            "release-on-disconnect",
            "ignore-epoch-fence",
            "double-book",
            "double-count-usage",
            "unreachable-without-grace",
            "lost-fsync",
            "release-on-journal-loss",
            "spec-out-of-order",
            "quorum-duplicate-signer",
            "health-ignore-limits",
            "health-release-holds",
            "health-reset-under-hold",
            "health-forget-repeats",
            "instance-as-hold",
        ]
    )
    checker = {rule: seams_for(rule).checker for rule in RULES}
    assert checker == {
        "skip-journal-dedupe": "I2",
        "release-on-disconnect": "I5",
        "ignore-epoch-fence": "I4",
        "double-book": "I1",
        "double-count-usage": "I8",
        "unreachable-without-grace": "I4",
        "lost-fsync": "I2",
        "release-on-journal-loss": "I5",
        "spec-out-of-order": "I3",
        "quorum-duplicate-signer": "Q1",
        "health-ignore-limits": "H1",
        "health-release-holds": "H1",
        "health-reset-under-hold": "H1",
        "health-forget-repeats": "H1",
        "instance-as-hold": "V1",
    }
    for rule in RULES:
        seams = seams_for(rule)
        swapped = [
            f.name
            for f in dataclasses.fields(seams)
            if f.name not in ("rule", "checker") and getattr(seams, f.name) is not getattr(PRODUCTION, f.name)
        ]
        assert len(swapped) == 1, (rule, swapped)
    with pytest.raises(UsageError, match="unknown --break rule 'no-such'; rules are skip-journal-dedupe, "):
        seams_for("no-such")


def test_the_production_seams_build_the_production_components(store: InlineSqliteStore, bus: Bus) -> None:
    lv = PRODUCTION.liveness(store, bus, "gw-1", CFG, SIGNER)
    assert type(lv) is Liveness and lv.cfg == CFG
    assert PRODUCTION.gateway_cls is Gateway and PRODUCTION.placement_cls is PlacementPass
    opener = opening(MemoryJournal("j-1"))
    assert PRODUCTION.journal(opener) is opener  # the agent's own opener, unwrapped
    assert PRODUCTION.spec_rule is decide_spec and AgentParts.spec_rule is decide_spec
    assert PRODUCTION.quorum_count is q.count_approvals and AgentParts.quorum_count is q.count_approvals


# ---- skip-journal-dedupe: I2 ----


async def test_a_forgetful_journal_runs_a_redelivered_command_again_and_i2_names_it(tmp_path: Path) -> None:
    async def run(forget: bool) -> int:
        h = Harness(tmp_path / ("forgetful" if forget else "real"))
        if forget:
            h.d.journal = await breaks.forgetful(opening(h.journal))()
        await h.d.start()
        try:
            gpu = h.hw.inventory().gpus[0].uuid
            cmd = command("c1", "gpu.reset", kinds_pb2.GpuResetRequest(gpu_uuids=[gpu]))
            await h.d.on_command(cmd)
            await h.wait_state("c1", "COMMAND_SUCCEEDED")
            await h.d.on_command(cmd)  # a duplicate frame, or the replay after a reconnect
            await advance(1)
        finally:
            await h.d.stop()
        return FakeHardware.read_resets(h.hw.state_dir).get(gpu, 0)  # type: ignore[arg-type]

    assert await run(forget=False) == 1
    resets = await run(forget=True)
    assert resets == 2
    starts = [SideEffect(1000 * i, "n1", "c1", "gpu.reset", "boot-1") for i in range(resets)]
    found = check_i2(starts, [], [], [])
    assert isinstance(found, DoubleExecution) and found.why == "not retry-safe"


def opening(journal: AgentJournal) -> OpenJournal:
    async def open_journal() -> AgentJournal:
        return journal

    return open_journal


async def test_a_forgetful_journal_resolves_every_delivery_as_new() -> None:
    inner = MemoryJournal("j-1")
    j = ForgetfulJournal(inner)
    assert j.journal_id == "j-1"
    await j.accept(Acceptance("c1", "gpu.reset", False, False, "inc-1", "boot-1", b"body", 1.0))
    await j.mark_running("c1", "inc-1", "boot-1", 2.0)
    assert await j.finish("c1", b"result", 3.0)
    # The real journal resends the stored result; the forgetful one executes again, and lets it be accepted.
    assert resolve(await inner.get_command("c1"), "inc-1", "boot-1") is Resolution.RESEND
    assert resolve(await j.get_command("c1"), "inc-1", "boot-1") is Resolution.EXECUTE
    await j.accept(Acceptance("c1", "gpu.reset", False, False, "inc-1", "boot-1", b"body", 4.0))
    entry = await inner.get_command("c1")
    assert entry is not None and entry.state == "accepted"


# ---- lost-fsync: I2 ----


async def test_a_power_loss_under_a_journal_without_fsync_forgets_what_was_not_finished() -> None:
    j = MemoryJournal("j-1")
    for cid in ("accepted", "running", "done"):
        await j.accept(Acceptance(cid, "gpu.reset", False, False, "inc-1", "boot-1", b"body", 1.0))
    await j.mark_running("running", "inc-1", "boot-1", 2.0)
    await j.mark_running("done", "inc-1", "boot-1", 2.0)
    assert await j.finish("done", b"result", 3.0)
    assert seams_for("lost-fsync").power_loss is forget_unfinished and PRODUCTION.power_loss is None
    await forget_unfinished(j)
    # Same journal id, so the gateway replays the running command, and the journal runs it as new (boot 2).
    assert j.journal_id == "j-1"
    assert await j.get_command("accepted") is None and await j.get_command("running") is None
    assert resolve(await j.get_command("running"), "inc-2", "boot-2") is Resolution.EXECUTE
    done = await j.get_command("done")
    assert done is not None and resolve(done, "inc-2", "boot-2") is Resolution.RESEND


# ---- release-on-journal-loss: I5 ----


def test_a_devices_converger_without_adoption_keeps_nothing_where_production_adopts_every_hold() -> None:
    held = {"a1": cast(HeldSpec, object())}
    conv = seams_for("release-on-journal-loss").devices_cls
    assert conv is ReleasingDevices and PRODUCTION.devices_cls is DevicesConverger
    assert DevicesConverger.holds_to_keep(cast(DevicesConverger, None), held, 0) == held  # no spec: adopt
    assert DevicesConverger.holds_to_keep(cast(DevicesConverger, None), held, 3) is None  # a spec decides
    assert ReleasingDevices.holds_to_keep(cast(ReleasingDevices, None), held, 0) is None  # no spec: release


def test_i5_names_a_hold_a_node_released_before_the_control_plane_decided_to_end_it() -> None:
    ok = NodeRelease(5_000, "n1", "r1", "a1", decided_ms=4_000)
    assert check_node_kept_holds([ok]) is None
    early = NodeRelease(6_000, "n2", "r2", "a2", decided_ms=None)
    later = NodeRelease(7_000, "n1", "r3", "a3", decided_ms=9_000)
    found = check_node_kept_holds([later, ok, early])
    assert found is not None and found.release is early
    assert found.sentence.startswith("I5: n2 released r2's hold (allocation a2) by itself")
    facts = FactLog()
    facts.node_releases = [later]
    i5 = next(r for r in check_all(facts) if r.id == "I5")
    assert not i5.ok and i5.at_ms == 7_000 and i5.entities == ("n1", "r3")


# ---- release-on-disconnect: I5 ----


async def add_node(store: InlineSqliteStore, node_id: str = "n1") -> None:
    now_ms = await store.now_ms()
    inv = FakeHardware("hgx-h100-8", node_id).inventory()
    async with store.transaction() as tx:
        await nodes_sql.ensure(tx, node_id, "node", now_ms)
        await nodes_sql.set_connectivity(tx, node_id, "connected", now_ms)
        await nodes_sql.write_inventory(
            tx, node_id, MessageToJson(inv, preserving_proto_field_name=True), inventory_hash(inv)
        )


async def sweep_for(lv: Liveness, seconds: int, renew: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for _ in range(seconds // 10):
        await advance(10)
        for gw in renew:
            assert await gateway_lease(lv.store, gw)
        out += await lv.sweep_once()
    return out


async def facts_of(store: InlineSqliteStore) -> FactLog:
    """What a run would read from the store at its end: connectivity, releases, bookings, spans, usage."""
    facts = FactLog()
    async with store.transaction(write=False) as tx:
        events = [
            (int(r["seq"]), str(r["type"]), str(r["subject"]), str(r["data"]), int(r["at_ms"]))
            for r in await events_sql.list_events(tx, 0, 10_000)
        ]
        rows = await res_sql.list_(tx, include_released=True)
        facts.bookings = bookings_of(await cap_sql.live_bookings(tx))
        facts.spans = [span_of(r) for r in await cap_sql.billing_spans(tx)]
        facts.windows = [
            UsageWindow(
                str(w["reservation_id"]),
                str(w["node_id"]),
                str(w["tenant"]),
                str(w["device_class"]),
                int(w["atoms"]),
                int(w["start_ms"]),
                int(w["end_ms"]),
            )
            for w in await cap_sql.usage_windows(tx, None, None)
        ]
    facts.connectivity = connectivity_from_events(events)
    for r in rows:
        at = r["released_at_ms"] if r["released_at_ms"] is not None else r["ended_at_ms"]
        rel = release_fact(str(r["id"]), str(r["node_id"] or ""), str(r["state"]), str(r["reason"] or ""), int(at or 0))
        if rel is not None:
            facts.releases.append(rel)
    facts.finish(await store.now_ms())
    return facts


async def test_a_releasing_liveness_releases_a_partitioned_nodes_holds_and_i5_names_it(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock
) -> None:
    await add_node(store)
    await gateway_lease(store)
    await open_session(store)
    placed = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), random.Random(1))
    assert placed["state"] == "placed"
    # The gateway stops (nothing renews its lease): n1 goes disconnected, then unreachable.
    lv = ReleasingLiveness(store, bus, "worker-1", CFG, SIGNER)
    assert await sweep_for(lv, 400) == [("n1", "disconnected"), ("n1", "unreachable")]
    facts = await facts_of(store)
    assert [(r.reservation_id, r.reason) for r in facts.releases] == [(str(placed["id"]), "node-unreachable")]
    assert facts.bookings == []  # its devices were freed, and its assignment dropped from n1's spec
    found = invariants.check_no_release_on_disconnect(facts.releases, facts.transitions())
    assert isinstance(found, ReleasedOnDisconnect)
    assert found.away_since_ms == facts.connectivity[0].t_ms
    assert found.sentence.endswith(f"for 'node-unreachable' while n1 was away since {iso(found.away_since_ms)}")
    i5 = check_all(facts)[4]
    assert (i5.id, i5.ok, i5.counterexample) == ("I5", False, found.sentence)


async def test_production_liveness_keeps_a_partitioned_nodes_holds(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock
) -> None:
    await add_node(store)
    await gateway_lease(store)
    await open_session(store)
    await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), random.Random(1))
    transitions = await sweep_for(Liveness(store, bus, "worker-1", CFG), 400)
    assert transitions == [("n1", "disconnected"), ("n1", "unreachable")]
    facts = await facts_of(store)
    assert facts.releases == [] and len(facts.bookings) == 1
    assert check_all(facts)[4].ok


# ---- unreachable-without-grace: I4 ----


async def connectivity_facts(store: InlineSqliteStore, facts: FactLog) -> None:
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 1000, "node.connectivity")
    for r in rows:
        facts.connectivity_changed(int(r["at_ms"]), str(r["subject"]), json.loads(str(r["data"]))["state"])


async def close_after_a_frame(store: InlineSqliteStore, facts: FactLog) -> None:
    """n1's session is open on gw-1, its last frame arrives, and its link resets: the gateway closes it."""
    await add_node(store)
    await gateway_lease(store)
    epoch = await open_session(store)
    now_ms = await store.now_ms()
    facts.heard(now_ms, "n1")
    async with store.transaction() as tx:
        assert await nodes_sql.close_session(tx, "n1", epoch, now_ms, "stream ended")


async def test_a_liveness_without_grace_marks_a_node_unreachable_right_after_hearing_it_and_i4_names_it(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock
) -> None:
    facts = FactLog()
    await close_after_a_frame(store, facts)
    assert await sweep_for(NoGraceLiveness(store, bus, "worker-1", CFG), 10, renew=("gw-1",)) == [("n1", "unreachable")]
    await connectivity_facts(store, facts)
    found = check_i4(facts)
    assert isinstance(found, FalseUnreachable)
    assert found.sentence == (
        f"I4: n1 was marked unreachable at {iso(facts.connectivity[-1].t_ms)}, 10 s after a gateway last heard "
        "from it (the bound is 20 s)"
    )


async def test_production_liveness_waits_the_lease_ttl_before_unreachable(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock
) -> None:
    facts = FactLog()
    await close_after_a_frame(store, facts)
    lv = Liveness(store, bus, "worker-1", CFG)
    assert await sweep_for(lv, 30, renew=("gw-1",)) == []
    assert await sweep_for(lv, 20, renew=("gw-1",)) == [("n1", "unreachable")]
    await connectivity_facts(store, facts)
    assert check_i4(facts) is None


# ---- ignore-epoch-fence: I4 ----


async def test_an_unfenced_close_disconnects_a_node_on_its_newer_session_and_i4_names_the_unreachable_that_follows(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock
) -> None:
    await add_node(store)
    await gateway_lease(store)
    old = await open_session(store, "n1", "gw-1")
    await gateway_lease(store, "gw-2")
    new = await open_session(store, "n1", "gw-2")  # the node redialled; its old session ends after that
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        assert await Gateway.close_session(tx, "n1", old, now_ms) is False  # the fence: nothing written
    assert await connectivity_of(store) == "connected"
    async with store.transaction() as tx:
        assert await UnfencedGateway.close_session(tx, "n1", old, now_ms) is True
        assert await nodes_sql.session_is_current(tx, "n1", new)  # the new session is open and flushing
    assert await connectivity_of(store) == "disconnected"
    # n1 keeps talking to gw-2 (a frame every 10 s), yet liveness goes by the connectivity written.
    facts = FactLog()
    lv = Liveness(store, bus, "worker-1", CFG)
    for _ in range(6):
        facts.heard(await store.now_ms(), "n1")
        await advance(10)
        await gateway_lease(store, "gw-2")
        await lv.sweep_once()
    await connectivity_facts(store, facts)
    assert [c.state for c in facts.connectivity] == ["unreachable"]
    found = check_i4(facts)
    assert isinstance(found, FalseUnreachable)
    assert found.sentence.startswith(
        f"I4: n1 was marked unreachable at {iso(now_ms + 40_000)} while a gateway was hearing from it (frames from "
        f"{iso(now_ms)} to {iso(now_ms + 50_000)}"
    )


async def connectivity_of(store: InlineSqliteStore, node_id: str = "n1") -> str:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    return str(row["connectivity"])


# ---- double-book: I1 ----


async def test_a_blind_pass_books_a_waiting_reservation_over_a_hold_and_i1_names_it(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock
) -> None:
    await add_node(store)
    full = await reserve(store, bus, SIGNER, ReserveRequest(gpus=8), random.Random(1))
    waiting = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), random.Random(2))
    assert (full["state"], waiting["state"]) == ("placed", "pending")
    rng = random.Random(3)
    await PlacementPass(store, bus, SIGNER, rng, holder="w").pass_once(lease=False)
    assert invariants.check_no_overlap((await facts_of(store)).bookings) is None  # production keeps it waiting
    await DoubleBookingPass(store, bus, SIGNER, rng, holder="w").pass_once(lease=False)
    facts = await facts_of(store)
    found = invariants.check_no_overlap(facts.bookings)
    assert isinstance(found, Overlap)
    assert {found.first.reservation_id, found.second.reservation_id} == {str(full["id"]), str(waiting["id"])}
    i1 = check_all(facts)[0]
    assert (i1.id, i1.ok, i1.counterexample) == ("I1", False, found.sentence)


# ---- double-count-usage: I8 ----


async def test_a_double_counting_flush_writes_usage_twice_and_i8_names_it(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock
) -> None:
    await add_node(store)
    hold = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), random.Random(1))
    rng = random.Random(3)
    await advance(2 * H / 1000)
    await PlacementPass(store, bus, SIGNER, rng, holder="w").pass_once(lease=False)
    facts = await facts_of(store)
    assert facts.windows and all(r.ok for r in check_all(facts))  # two hours, flushed once each
    await advance(2 * H / 1000)
    await DoubleCountingPass(store, bus, SIGNER, rng, holder="w").pass_once(lease=False)
    facts = await facts_of(store)
    found = invariants.check_billing_conservation(facts.spans, facts.windows, facts.end_ms)
    assert isinstance(found, BillingMismatch) and found.reservation_id == str(hold["id"])
    assert found.usage_atom_ms > found.booked_atom_ms
    i8 = next(r for r in check_all(facts) if r.id == "I8")
    assert (i8.id, i8.ok, i8.counterexample) == ("I8", False, found.sentence)


# ---- spec-out-of-order: I3 ----


def applied_in_order(rule: SpecRule, generations: list[int]) -> FactLog:
    """A session core (applied generation 3) handed these full specs in this order, with `rule`; each spec it
    accepts is journaled (here: a `SpecApplied` fact, as the run's journal tap records it)."""
    core = opened(applied=3, applied_spec=base_spec())
    core.spec_rule = rule
    facts = FactLog()
    for i, g in enumerate(generations):
        for e in core.on_message(desired(full_body(g)), 600.0 + i, 1_800_000_000_000 + i * 1000):
            if isinstance(e, AcceptSpec):
                facts.spec_applied(1_800_000_000_000 + i * 1000, "n1", "j-1", e.generation)
            else:
                assert isinstance(e, IgnoredSpec), e
    return facts


def test_the_broken_rule_applies_an_older_generation_after_a_newer_one_and_i3_names_it() -> None:
    facts = applied_in_order(apply_any_generation, [5, 4, 4, 6, 2])  # a replay of 4 (twice), then of 2
    assert [a.generation for a in facts.applied] == [5, 4, 4, 6, 2]
    back = check_spec_order(facts.applied)
    assert isinstance(back, WentBack) and (back.newer.generation, back.older.generation) == (5, 4)
    assert back.sentence == (
        "I3: n1 applied spec generation 4 at 2027-01-15T08:00:01Z, after it had applied generation 5 at "
        "2027-01-15T08:00:00Z (journal j-1): a node never goes back"
    )
    i3 = check_all(facts)[2]
    assert (i3.id, i3.ok, i3.at_ms, i3.entities) == ("I3", False, 1_800_000_001_000, ("n1",))


def test_the_production_rule_ignores_the_same_replays_and_i3_holds() -> None:
    facts = applied_in_order(decide_spec, [5, 4, 4, 6, 2])
    assert [a.generation for a in facts.applied] == [5, 6]
    assert check_spec_order(facts.applied) is None and check_all(facts)[2].ok


def test_the_broken_rule_breaks_full_specs_only() -> None:
    """Another node's body is still refused, and a patch is judged by the production rule (it needs its base)."""
    assert apply_any_generation(full_body(2, node_id="n2"), "n1", 5, base_spec()) == "body for node 'n2'"
    assert apply_any_generation(patch_body(4, 3), "n1", 5, base_spec()) == decide_spec(patch_body(4, 3), "n1", 5, None)
    assert apply_any_generation(patch_body(7, 4), "n1", 5, base_spec()) == "patch-base-mismatch"
    assert apply_any_generation(full_body(2), "n1", 5, base_spec()) == full_body(2).full


# ---- quorum-duplicate-signer: Q1 ----

ALICE, ALICE2, BOB = new_approver("alice"), new_approver("alice-second"), new_approver("bob")
"""alice holds two keys (the second registered to her too), bob one; k = 2."""
QUORUM_NOW_MS = 1_800_000_000_000


def held_key(a: Approver, operator: str) -> common_pb2.ApproverKey:
    return common_pb2.ApproverKey(key_id=a.key_id, public_key=a.public, name=a.name, operator=operator)


HELD = QuorumHeld((held_key(ALICE, "alice"), held_key(ALICE2, "alice"), held_key(BOB, "bob")), 2)


def signed(*signers: Approver) -> tuple[Batch, common_pb2.BatchApproval]:
    b = Batch("b-1", ["n1", "n2"], reset_payload("GPU-1"))
    return b, b.approval(*signers, expires_at_ms=QUORUM_NOW_MS + H)


@pytest.mark.parametrize("signers", [(ALICE, ALICE2), (BOB, BOB)], ids=["two keys of one operator", "one key twice"])
def test_the_broken_count_takes_a_signer_twice_where_production_takes_it_once(signers: tuple[Approver, ...]) -> None:
    _, approval = signed(*signers)
    keys = list(HELD.approvers)
    assert len(q.count_approvals(approval, keys, QUORUM_NOW_MS).counted) == 1
    assert len(count_duplicate_signers(approval, keys, QUORUM_NOW_MS).counted) == 2
    # What it still refuses as production does: a stranger's key, an expired or a bad signature.
    _, late = signed(ALICE, BOB)
    assert count_duplicate_signers(late, keys, QUORUM_NOW_MS + 2 * H).counted == []
    assert count_duplicate_signers(late, keys[:1], QUORUM_NOW_MS).refused == [(BOB.key_id, "not an approver key")]


def test_a_node_with_the_broken_count_runs_a_batch_one_person_signed_and_q1_names_it() -> None:
    b, approval = signed(ALICE, ALICE2)
    body = b.body("n1", "c-1")
    cmd = batch_command(body, approval, b.proof(0))
    bundle = common_pb2.TrustBundle(approver_keys=list(HELD.approvers), quorum_k=2)
    why, _, _ = check_batch(cmd, body, bundle, QUORUM_NOW_MS)
    assert why is not None and "1 of 2 approvals hold" in why and "operator alice already approved" in why
    assert check_batch(cmd, body, bundle, QUORUM_NOW_MS, count_duplicate_signers)[0] is None  # it runs

    ran = BatchRan(QUORUM_NOW_MS, "n1", "c-1", "gpu.reset", "b-1", approval.SerializeToString())
    found = check_q1([ran], HELD)
    assert isinstance(found, UnderQuorum) and found.at_ms == QUORUM_NOW_MS
    assert found.sentence.startswith(
        f"Q1: gpu.reset c-1 of batch b-1 started on n1 at {iso(QUORUM_NOW_MS)} with 1 approval(s) that count of "
        "the 2 it needs (not counted: "
    )
    assert "operator alice already approved" in found.sentence
    facts = FactLog(batch_runs=[ran], quorum=HELD)
    q1 = next(r for r in check_all(facts) if r.id == "Q1")
    assert (q1.ok, q1.counterexample, q1.at_ms) == (False, found.sentence, QUORUM_NOW_MS)
    assert q1.entities == ("n1", "c-1", "b-1")  # the trace shows the batch's decisions too


def test_q1_holds_for_k_distinct_approvers_and_refuses_what_carried_no_approval_of_its_batch() -> None:
    _, good = signed(ALICE, ALICE2, BOB)  # alice's second key does not count, bob's does: 2 of 2
    ok = BatchRan(QUORUM_NOW_MS, "n1", "c-1", "gpu.reset", "b-1", good.SerializeToString())
    assert check_q1([ok], HELD) is None
    assert check_q1([ok], None) is None and check_q1([ok], QuorumHeld((), 2)) is None  # nothing enforced
    for approval in (b"", b"\xff\xff", good.SerializeToString()):
        other = BatchRan(QUORUM_NOW_MS + 1, "n2", "c-2", "gpu.reset", "b-2", approval)  # not b-2's approval
        found = check_q1([ok, other], HELD)
        assert found is not None and found.run is other and "no approval of this batch" in found.sentence


def test_a_reconciler_blind_to_ended_episodes_queues_a_second_failure_where_production_quarantines_it() -> None:
    recent = [hd.Episode("n1", "G0", hd.DONE, "reset", started_ms=1000, ended_ms=2000)]
    sick = GpuCondition("n1", "G0", "Xid79", "XID 79", 0, signals_of("Xid79", "XID 79: GPU has fallen off the bus"))
    w = hd.World(3_600_000, Policy(), [sick], [], recent=recent, nodes={"n1": hd.NodeFacts()})
    opened = hd.decide(w)[0]
    assert isinstance(opened, hd.Open) and "second failure" in opened.quarantine_why
    broken = decide_forgetting_repeats(w)
    assert isinstance(broken[0], hd.Open) and broken[0].quarantine_why == ""
    assert any(isinstance(x, hd.Start) and x.key == ("n1", "G0") for x in broken)  # remediated again


def test_the_drainless_template_starts_the_reset_beside_the_drain_and_changes_nothing_else() -> None:
    facts = templates.Facts(frozenset({"n1"}), False, {"n1": ("G0", "G1")})
    req = JobRequest("remediate", ("n1",), gpus=("G0",), gpu_scope=True, deadline_s=600.0)
    good, broken = templates.build(req, "j-1", facts), remediate_without_drain_wait(req, "j-1", facts)
    deps = {n.id: {x.node for x in n.deps} for n in good.nodes}
    assert "drain:n1" in deps["reset:n1"]
    assert {n.id: {x.node for x in n.deps} for n in broken.nodes} == {
        **deps,
        "reset:n1": deps["reset:n1"] - {"drain:n1"},
    }
    drain = JobRequest("drain", ("n1",), deadline_s=600.0)
    assert remediate_without_drain_wait(drain, "j-2", facts) == templates.build(drain, "j-2", facts)
