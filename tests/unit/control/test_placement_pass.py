"""The placement pass wired to the store: windows booked, delivered at their start and ended at their end,
I1 checked in the booking transaction, host resources reaching the node as limits, issue 13's bad input."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.capacity import placement_pass, placement_wake
from bc.control.capacity.placement_pass import LEASE_NAME, PassResult, PlacementPass, cpulist_ids
from bc.control.capacity.placement_plan import GIB
from bc.control.capacity.reservations import ReserveRequest, release, reserve
from bc.control.nodes.admin import cordon
from bc.control.signing.signer import NullSigner
from bc.errors import Conflict, UsageError
from bc.protocol import canonical
from bc.protocol.pb import common_pb2, spec_pb2
from bc.seams.clock import LoopClock
from bc.store import Row, Tx
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance
from tests.unit.control.conftest import AddNode, Count, write_inventory

SIGNER = NullSigner()
RNG = random.Random(7)


async def res(store: InlineSqliteStore, rid: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await res_sql.get(tx, rid)
    assert row is not None
    return row


async def booked(store: InlineSqliteStore, rid: str) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await tx.fetchall(
            "SELECT atom_id, start_ms, end_ms, released_at_ms FROM device_bookings WHERE reservation_id = :r"
            " ORDER BY atom_id",
            {"r": rid},
        )


async def assignments(store: InlineSqliteStore, node_id: str = "n1") -> dict[str, spec_pb2.DeviceAssignment]:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    spec = canonical.spec_from_json(str(row["spec"]))
    return {a.reservation_id: a for a in spec.devices.assignments}


def pass_(store: InlineSqliteStore, bus: Bus) -> PlacementPass:
    return PlacementPass(store, bus, SIGNER, RNG, holder="w-1")


async def test_a_later_window_is_booked_pending_then_delivered_at_its_start_and_ended_at_its_end(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    now = await store.now_ms()
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=8, start_ms=now + 10_000, duration_ms=60_000), RNG)
    rid = str(row["id"])
    assert (row["state"], row["node_id"]) == ("pending", "n1")
    assert str(row["reason"]).startswith("starts at ")
    assert {(b["start_ms"], b["end_ms"]) for b in await booked(store, rid)} == {(now + 10_000, now + 70_000)}
    assert await assignments(store) == {}  # booked, not delivered
    # A second window on the same GPUs right after it: disjoint, so both are booked (I1 is over intervals).
    after = await reserve(store, bus, SIGNER, ReserveRequest(gpus=8, start_ms=now + 70_000, duration_ms=5_000), RNG)
    assert (after["state"], after["node_id"]) == ("pending", "n1")
    # An open-ended hold asked now fits nowhere for ever: it waits without a start, unbooked.
    forever = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), RNG)
    assert (forever["state"], forever["node_id"]) == ("pending", None)

    p = pass_(store, bus)
    assert (await p.pass_once()) is not None
    assert p.next_wake_ms == now + 10_000
    await advance(10)
    result = await p.pass_once()
    assert result is not None and result.delivered == (rid,)
    assert (await res(store, rid))["state"] == "placed"
    assert len((await assignments(store))[rid].devices) == 8
    assert p.next_wake_ms == now + 70_000

    await advance(60)
    result = await p.pass_once()
    assert result is not None and result.ended == (rid,) and result.delivered == (str(after["id"]),)
    ended = await res(store, rid)
    assert (ended["state"], ended["reason"]) == ("ended", "window-ended")
    assert all(b["released_at_ms"] is not None and b["end_ms"] == now + 70_000 for b in await booked(store, rid))
    assert set(await assignments(store)) == {str(after["id"])}
    assert (await release(store, bus, SIGNER, rid))["state"] == "ended"  # releasing an ended one is a no-op


async def test_the_pass_checks_i1_against_the_stored_bookings_in_its_transaction(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count, monkeypatch: pytest.MonkeyPatch
) -> None:
    await add_node("n1")
    await reserve(store, bus, SIGNER, ReserveRequest(gpus=8), RNG)
    before = await count("device_bookings")

    async def forgetful(tx: object) -> list[Row]:  # a planner that does not see the stored bookings
        return []

    monkeypatch.setattr(placement_pass.cap_sql, "live_bookings", forgetful)
    with pytest.raises(Conflict, match=r"overlaps a stored booking \(I1\)"):
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), RNG)
    assert await count("device_bookings") == before
    assert await count("reservations") == 1


def numa_inventory(inv: common_pb2.Inventory) -> common_pb2.Inventory:
    """Two NUMA nodes of 8 CPUs and 64 GiB; GPUs 0-3 on node 0, 4-7 on node 1."""
    del inv.numa_nodes[:]
    inv.numa_nodes.add(id=0, cpus="0-7", memory_bytes=64 * GIB, hugepages_1g=4)
    inv.numa_nodes.add(id=1, cpus="8-15", memory_bytes=64 * GIB, hugepages_1g=4)
    for g in inv.gpus:
        g.numa_node = 0 if g.index < 4 else 1
    return inv


async def set_caps(store: InlineSqliteStore, node_id: str, caps: list[str]) -> None:
    async with store.transaction() as tx:
        await tx.execute("UPDATE nodes SET capabilities = :c WHERE node_id = :n", {"c": json.dumps(caps), "n": node_id})


async def test_host_resources_reach_the_node_as_limits_pinned_to_the_gpus_numa_node(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    inv = numa_inventory(await add_node("n1"))
    await write_inventory(store, "n1", inv)
    req = ReserveRequest(gpus=2, cpus=4, memory_bytes=16 * GIB, hugepages_1g=2)
    # Without the capability the node cannot take limits: the reservation waits, saying so.
    waiting = await reserve(store, bus, SIGNER, req, RNG)
    assert (waiting["state"], waiting["reason"]) == ("pending", "no node advertises devices.limits")
    await set_caps(store, "n1", ["devices.limits"])
    await pass_(store, bus).pass_once()
    row = await res(store, str(waiting["id"]))
    assert (row["state"], row["node_id"], row["cpu_numa"], row["mem_numa"]) == ("placed", "n1", "[0]", "[0]")
    lim = (await assignments(store))[str(row["id"])].limits
    assert (lim.cpu_millis, lim.memory_bytes, lim.hugepages_1gi, lim.cpus, lim.mems) == (4000, 16 * GIB, 2, "0-7", "0")
    # More CPUs than any node has can never fit: refused at once, nothing stored.
    with pytest.raises(Conflict, match="no node in the fleet has 1 GPU and 17 CPUs"):
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, cpus=17), RNG)


async def test_cpus_on_a_node_without_host_inventory_never_fit(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count
) -> None:
    inv = await add_node("n1")
    del inv.numa_nodes[:]  # no host inventory: no CPUs to book
    await write_inventory(store, "n1", inv)
    await set_caps(store, "n1", ["devices.limits"])
    with pytest.raises(Conflict, match="no node in the fleet has 1 GPU and 16 CPUs"):
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, cpus=16), RNG)
    assert await count("reservations") == 0


@pytest.mark.parametrize(
    ("make", "sentence"),
    [
        (lambda now: ReserveRequest(gpus=1, start_ms=now + 10_000, end_ms=now + 5_000), "before it starts"),
        (lambda now: ReserveRequest(gpus=1, end_ms=now - 1), "before it starts"),
        (lambda now: ReserveRequest(gpus=1, start_ms=now - 301_000), "more than 5 minutes ago"),
        (lambda now: ReserveRequest(gpus=1, duration_ms=0), "a duration must be positive"),
        (lambda now: ReserveRequest(gpus=1, duration_ms=5, end_ms=now + 10), "a duration or an end, not both"),
        (lambda now: ReserveRequest(gpus=1, cpus=-1), "cannot be negative"),
        (lambda now: ReserveRequest(gpus=1, binding="lease"), "unknown binding"),
        (lambda now: ReserveRequest(gpus=1, selector={"pool": ""}), "key=value"),
    ],
)
async def test_bad_input_is_one_sentence_and_stores_nothing(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count, make: object, sentence: str
) -> None:
    await add_node("n1")
    now = await store.now_ms()
    assert callable(make)
    with pytest.raises(UsageError, match=sentence):
        await reserve(store, bus, SIGNER, make(now), RNG)
    assert await count("reservations") == 0
    assert await count("events") == 0


async def test_a_start_a_little_in_the_past_is_placed_now(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    now = await store.now_ms()
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, start_ms=now - 60_000, duration_ms=120_000), RNG)
    assert row["state"] == "placed"
    assert {(b["start_ms"], b["end_ms"]) for b in await booked(store, str(row["id"]))} == {(now, now + 60_000)}


async def test_run_forever_delivers_and_ends_windows_on_time_under_its_lease(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode
) -> None:
    await add_node("n1")
    now = await store.now_ms()
    rid = str(
        (await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, start_ms=now + 5_000, duration_ms=5_000), RNG))["id"]
    )
    other = PlacementPass(store, bus, SIGNER, RNG, holder="w-2")
    task = asyncio.create_task(pass_(store, bus).run_forever(clock))
    try:
        await advance(0.5)
        assert await other.pass_once() is None  # w-1 holds worker:placement
        await advance(4.6)
        assert (await res(store, rid))["state"] == "placed"
        await advance(5)
        assert (await res(store, rid))["state"] == "ended"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    async with store.transaction(write=False) as tx:
        assert await tx.fetchval("SELECT holder FROM leases WHERE name = :n", {"n": LEASE_NAME}) == "w-1"


def test_cpulists() -> None:
    assert cpulist_ids("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert cpulist_ids("") == [] and cpulist_ids("x") == []


async def test_the_pass_sees_a_node_s_new_inventory_and_one_stored_without_a_hash(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    """The pass keeps inventory texts by (node, hash) across passes: a changed inventory must still reach the
    planner, and a row written without a hash (an older writer) is read from its own text."""
    inv = await add_node("n1")
    await add_node("n2")
    async with store.transaction(write=False) as tx:
        before = {n.node_id: len(n.gpus) for n in (await placement_pass.load_facts(tx)).nodes}
    assert before == {"n1": 8, "n2": 8}

    smaller = common_pb2.Inventory()
    smaller.CopyFrom(inv)
    del smaller.gpus[2:]
    await write_inventory(store, "n1", smaller)
    async with store.transaction() as tx:  # n2's text with no hash beside it
        await tx.execute("UPDATE nodes SET inventory = '{}', inventory_hash = '' WHERE node_id = 'n2'")
        facts = await placement_pass.load_facts(tx)
    assert {n.node_id: len(n.gpus) for n in facts.nodes} == {"n1": 2, "n2": 0}
    assert len(facts.inventories["n1"].gpus) == 2

    # What the planner does with it: 4 GPUs on n1 never fit now, and `reserve` says so.
    with pytest.raises(Conflict, match="node n1 has 2; 4 GPUs asked"):
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=4, node_id="n1"), RNG)


async def test_the_loop_passes_again_only_for_news_a_waiting_reservation_can_use(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a reservation waits, a burst of events that cannot make room (a command settling, a node going
    away) costs no pass; the node it waits for coming back is placed within the loop's gap, not at the
    backstop (a full pass every third of the lease's TTL)."""
    await add_node("n1")
    await add_node("n2", connectivity="unreachable")
    await cordon(store, bus, "n1", True)
    rid = str((await reserve(store, bus, SIGNER, ReserveRequest(gpus=2), RNG))["id"])
    assert (await res(store, rid))["state"] == "pending"

    passes: list[float] = []
    step = PlacementPass.step

    async def counted(self: PlacementPass, tx: Tx, now_ms: int, *, full: bool = False) -> PassResult:
        passes.append(clock.monotonic())
        return await step(self, tx, now_ms, full=full)

    monkeypatch.setattr(PlacementPass, "step", counted)
    task = asyncio.create_task(pass_(store, bus).run_forever(clock))
    try:
        await advance(0.1)
        assert len(passes) == 1  # the first pass: the loop knows nothing yet
        now = await store.now_ms()
        for i in range(12):  # three seconds of news no waiting reservation can use
            async with store.transaction() as tx:
                await publish(tx, bus, "command.settled", f"c{i}", {"state": "succeeded"}, now)
                await publish(tx, bus, "node.connectivity", "n2", {"state": "unreachable"}, now)
                await publish(tx, bus, "node.status", "n1", {"applied_generation": 1}, now)
            await advance(0.25)
        assert len(passes) == 1
        assert (await res(store, rid))["state"] == "pending"

        await cordon(store, bus, "n1", False)  # news it can use
        await advance(0.5)
        assert len(passes) == 2
        assert (await res(store, rid))["state"] == "placed"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(
    ("type_", "data", "wakes"),
    [
        ("node.connectivity", '{"state": "connected"}', True),
        ("node.connectivity", '{"state": "unreachable"}', False),
        ("node.connectivity", "not json", False),
        ("node.status", '{"inventory_hash": "sha256:ab"}', True),
        ("node.status", '{"applied_generation": 3}', False),
        ("node.uncordoned", "{}", True),
        ("node.cordoned", "{}", False),
        ("reservation.released", "{}", True),
        ("reservation.submitted", "{}", True),
        ("reservation.booked", "{}", False),
        ("reservation.waiting", "{}", False),
        ("command.settled", "{}", False),
        ("node.job-hold-released", "{}", True),
    ],
)
def test_which_events_can_let_a_waiting_reservation_fit(type_: str, data: str, wakes: bool) -> None:
    assert placement_wake.may_fit_more(type_, data) is wakes
    assert (type_ in placement_wake.WAKING_TYPES) >= wakes  # the store reads every type that may wake
