"""Hold reservations: placement and booking, delivery through the devices section, node reports."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable

import pytest
from google.protobuf.json_format import MessageToJson

from agent.hw.base import inventory_hash
from bc.control.base.bus import Bus
from bc.control.capacity.reservations import ReserveRequest, on_allocation_report, release, reserve
from bc.control.signing.signer import NullSigner
from bc.errors import Conflict, NotFound, UsageError
from bc.protocol import canonical
from bc.protocol.pb import common_pb2, spec_pb2
from bc.store import Row
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql
from bc.store.sqlite import InlineSqliteStore

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner
RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]
Count = Callable[[str], Awaitable[int]]


async def node(store: InlineSqliteStore, node_id: str = "n1") -> Row:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    return row


async def spec_of(store: InlineSqliteStore, node_id: str = "n1") -> spec_pb2.NodeSpec:
    return canonical.spec_from_json(str((await node(store, node_id))["spec"]))


async def res(store: InlineSqliteStore, rid: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await res_sql.get(tx, rid)
    assert row is not None
    return row


async def bookings(store: InlineSqliteStore, rid: str) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await res_sql.bookings(tx, rid)


async def live_bookings(store: InlineSqliteStore, node_id: str = "n1") -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await res_sql.live_bookings_on(tx, node_id)


async def events(store: InlineSqliteStore, prefix: str) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await events_sql.list_events(tx, 0, 1000, prefix)


async def report(
    store: InlineSqliteStore, bus: Bus, reporting_node: str, kind: str, allocation_id: str, reason: str = ""
) -> str:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await on_allocation_report(tx, bus, SIGNER, reporting_node, kind, allocation_id, reason, "msg", now_ms)


async def snapshot(store: InlineSqliteStore) -> dict[str, list[Row]]:
    async with store.transaction(write=False) as tx:
        return {
            "reservations": await tx.fetchall("SELECT * FROM reservations ORDER BY id"),
            "device_bookings": await tx.fetchall("SELECT * FROM device_bookings ORDER BY reservation_id, atom_id"),
            "nodes": await tx.fetchall(
                "SELECT node_id, spec, spec_hash, spec_body, generation FROM nodes ORDER BY node_id"
            ),
        }


def assignment(spec: spec_pb2.NodeSpec, allocation_id: str) -> spec_pb2.DeviceAssignment | None:
    for a in spec.devices.assignments:
        if a.allocation_id == allocation_id:
            return a
    return None


async def waits(store: InlineSqliteStore, bus: Bus, req: ReserveRequest) -> str:
    """Issue 13: what does not fit now waits `pending`, unbooked (it was a Conflict); it is withdrawn at
    once so that the test goes on as before. Returns the reason it waited."""
    row = await reserve(store, bus, SIGNER, req, RNG)
    assert (row["state"], row["node_id"]) == ("pending", None)
    assert (await release(store, bus, SIGNER, str(row["id"])))["state"] == "released"
    return str(row["reason"])


async def test_reserve_places_books_and_writes_the_assignment(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    inv = await add_node("n1")
    gen_before = int((await node(store))["generation"])
    poked: list[str] = []
    bus.on_node_changed(poked.append)
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), random.Random(1))
    assert row["state"] == "placed"
    assert row["node_id"] == "n1"
    rid, alloc = str(row["id"]), str(row["allocation_id"])
    booked = await bookings(store, rid)
    assert len(booked) == 2
    assert {b["gpu_uuid"] for b in booked} <= {g.uuid for g in inv.gpus}
    assert len({b["atom_id"] for b in booked}) == 2
    n = await node(store)
    assert int(n["generation"]) == gen_before + 1
    assert int(row["generation"]) == int(n["generation"])
    a = assignment(await spec_of(store), alloc)
    assert a is not None
    assert a.reservation_id == rid
    assert a.binding == spec_pb2.BINDING_HOLD
    assert sorted((d.device_class, d.atom_id) for d in a.devices) == sorted(("gpu", str(b["atom_id"])) for b in booked)
    assert poked == ["n1"]
    placed = await events(store, "reservation.placed")
    assert [e["subject"] for e in placed] == [rid]


async def test_reserve_picks_a_node_when_none_is_named(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    await add_node("n2", profile="l4-slots-4")
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=6), RNG)
    assert row["node_id"] == "n1"  # only n1 has 6 whole GPUs


async def test_reserving_beyond_the_fleet_is_a_conflict_and_changes_nothing(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count
) -> None:
    await add_node("n1")
    await reserve(store, bus, SIGNER, ReserveRequest(gpus=6, node_id="n1"), RNG)
    before = await snapshot(store)
    events_before = await count("events")
    with pytest.raises(Conflict, match="no node in the fleet has 9 GPUs"):
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=9), RNG)
    with pytest.raises(Conflict, match="node n1 has 8; 9 GPUs asked"):
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=9, node_id="n1"), RNG)
    assert await snapshot(store) == before
    assert await count("events") == events_before
    assert await count("reservations") == 1
    assert await count("device_bookings") == 6


async def test_reserving_beyond_what_is_free_now_waits_pending_unbooked(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count
) -> None:
    # Issue 13: what does not fit now is pending with its reason (it was a Conflict before).
    await add_node("n1")
    await reserve(store, bus, SIGNER, ReserveRequest(gpus=6, node_id="n1"), RNG)
    before = await snapshot(store)
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=3, node_id="n1"), RNG)
    assert (row["state"], row["node_id"], row["reason"]) == ("pending", None, "node n1 does not have 3 free GPUs")
    after = await snapshot(store)
    assert (after["nodes"], after["device_bookings"]) == (before["nodes"], before["device_bookings"])


async def test_reserving_on_an_unknown_node_is_not_found(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count
) -> None:
    await add_node("n1")
    with pytest.raises(NotFound):
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, node_id="ghost"), RNG)
    assert await count("reservations") == 0


@pytest.mark.parametrize(
    "req",
    [
        ReserveRequest(gpus=1, node_id="n1", device_class="tpu"),
        ReserveRequest(gpus=1, node_id="n1", binding="lease"),
        ReserveRequest(gpus=0, node_id="n1"),
    ],
)
async def test_a_bad_request_is_a_usage_error(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count, req: ReserveRequest
) -> None:
    await add_node("n1")
    with pytest.raises(UsageError):
        await reserve(store, bus, SIGNER, req, RNG)
    assert await count("reservations") == 0
    assert int((await node(store))["generation"]) == 0


# -- node reports ---------------------------------------------------------------------


async def test_bound_makes_the_reservation_active(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), RNG)
    assert await report(store, bus, "n1", "bound", str(row["allocation_id"])) == "active"
    r = await res(store, str(row["id"]))
    assert r["state"] == "active"
    assert r["bound_at_ms"] is not None
    assert [e["subject"] for e in await events(store, "reservation.active")] == [row["id"]]
    # a duplicate report (a replayed event) changes nothing
    await report(store, bus, "n1", "bound", str(row["allocation_id"]))
    assert (await res(store, str(row["id"])))["state"] == "active"
    assert len(await events(store, "reservation.active")) == 1


@pytest.mark.parametrize("kind", ["bound", "released", "failed"])
async def test_a_report_from_another_node_changes_nothing(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, kind: str
) -> None:
    await add_node("n1")
    await add_node("n2")
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), RNG)
    alloc = str(row["allocation_id"])
    if kind == "released":
        await release(store, bus, SIGNER, str(row["id"]))
    before = await snapshot(store)
    await report(store, bus, "n2", kind, alloc, reason="overlap")
    assert await snapshot(store) == before
    mismatches = await events(store, "security.node-mismatch")
    assert len(mismatches) == 1
    assert mismatches[0]["subject"] == "n2"
    data = json.loads(str(mismatches[0]["data"]))
    assert data["allocation_id"] == alloc
    assert data["placed_on"] == "n1"


async def test_a_report_about_an_unknown_allocation_changes_nothing(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, node_id="n1"), RNG)
    before = await snapshot(store)
    await report(store, bus, "n1", "bound", "alloc-nope")
    assert await snapshot(store) == before


async def test_release_removes_the_assignment_and_keeps_the_bookings_until_the_node_says_so(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), RNG)
    rid, alloc = str(row["id"]), str(row["allocation_id"])
    await report(store, bus, "n1", "bound", alloc)
    gen = int((await node(store))["generation"])
    out = await release(store, bus, SIGNER, rid)
    assert out["state"] == "releasing"
    assert int((await node(store))["generation"]) == gen + 1
    assert assignment(await spec_of(store), alloc) is None
    assert len(await live_bookings(store)) == 2  # the node may still hold them
    # releasing twice is a no-op
    again = await release(store, bus, SIGNER, rid)
    assert again["state"] == "releasing"
    assert int((await node(store))["generation"]) == gen + 1


async def test_released_frees_the_bookings_so_the_atoms_can_be_booked_again(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=8, node_id="n1"), RNG)
    rid, alloc = str(row["id"]), str(row["allocation_id"])
    atoms = {str(b["atom_id"]) for b in await bookings(store, rid)}
    await report(store, bus, "n1", "bound", alloc)
    await release(store, bus, SIGNER, rid)
    await waits(store, bus, ReserveRequest(gpus=1, node_id="n1"))  # waits (was a Conflict)
    assert await report(store, bus, "n1", "released", alloc) == "released"
    r = await res(store, rid)
    assert r["state"] == "released"
    assert r["released_at_ms"] is not None
    assert await live_bookings(store) == []
    again = await reserve(store, bus, SIGNER, ReserveRequest(gpus=8, node_id="n1"), RNG)
    assert {str(b["atom_id"]) for b in await bookings(store, str(again["id"]))} == atoms


async def test_released_before_release_was_asked_is_ignored(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), RNG)
    await report(store, bus, "n1", "bound", str(row["allocation_id"]))
    before = await snapshot(store)
    await report(store, bus, "n1", "released", str(row["allocation_id"]))
    assert await snapshot(store) == before


async def test_failed_frees_the_bookings_and_removes_the_assignment(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    keep = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), RNG)
    row = await reserve(store, bus, SIGNER, ReserveRequest(gpus=6, node_id="n1"), RNG)
    rid, alloc = str(row["id"]), str(row["allocation_id"])
    gen = int((await node(store))["generation"])
    assert await report(store, bus, "n1", "failed", alloc, reason="device-missing") == "failed"
    r = await res(store, rid)
    assert r["state"] == "failed"
    assert r["reason"] == "device-missing"
    spec = await spec_of(store)
    assert assignment(spec, alloc) is None
    assert assignment(spec, str(keep["allocation_id"])) is not None
    assert int((await node(store))["generation"]) == gen + 1
    assert {str(b["reservation_id"]) for b in await live_bookings(store)} == {str(keep["id"])}
    failed = await events(store, "reservation.failed")
    assert json.loads(str(failed[0]["data"]))["reason"] == "device-missing"
    again = await reserve(store, bus, SIGNER, ReserveRequest(gpus=6, node_id="n1"), RNG)
    assert again["state"] == "placed"


# -- parent-aware conflicts (MIG instances and whole GPUs) ------------------------------


async def test_whole_gpu_and_mig_reservations_never_share_a_gpu(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    inv = await add_node("n1", profile="mig-a100-4")
    mig_gpus = [g.uuid for g in inv.gpus if g.mig_enabled]
    whole_gpus = [g.uuid for g in inv.gpus if not g.mig_enabled]
    migs = await reserve(store, bus, SIGNER, ReserveRequest(gpus=3, node_id="n1", device_class="gpu.mig"), RNG)
    mig_atoms = await bookings(store, str(migs["id"]))
    assert {str(b["gpu_uuid"]) for b in mig_atoms} == {mig_gpus[0]}  # all of GPU 0's instances
    whole = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), RNG)
    assert {str(b["gpu_uuid"]) for b in await bookings(store, str(whole["id"]))} == set(whole_gpus)
    await waits(store, bus, ReserveRequest(gpus=1, node_id="n1"))  # waits (was a Conflict)
    more = await reserve(store, bus, SIGNER, ReserveRequest(gpus=3, node_id="n1", device_class="gpu.mig"), RNG)
    assert {str(b["gpu_uuid"]) for b in await bookings(store, str(more["id"]))} == {mig_gpus[1]}
    await waits(store, bus, ReserveRequest(gpus=1, node_id="n1", device_class="gpu.mig"))  # waits (was a Conflict)


async def set_inventory(store: InlineSqliteStore, node_id: str, inv: common_pb2.Inventory) -> None:
    async with store.transaction() as tx:
        await nodes_sql.write_inventory(
            tx, node_id, MessageToJson(inv, preserving_proto_field_name=True), inventory_hash(inv)
        )


async def test_a_whole_gpu_is_not_booked_while_its_mig_instances_are(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    inv = await add_node("n1", profile="mig-a100-4")
    gpu0 = inv.gpus[0]
    migs = await reserve(store, bus, SIGNER, ReserveRequest(gpus=3, node_id="n1", device_class="gpu.mig"), RNG)
    assert {str(b["gpu_uuid"]) for b in await bookings(store, str(migs["id"]))} == {gpu0.uuid}
    # MIG is switched off on GPU 0 while its instances are still booked: the GPU is offered whole again
    gpu0.mig_enabled = False
    del gpu0.mig_instances[:]
    await set_inventory(store, "n1", inv)
    await waits(store, bus, ReserveRequest(gpus=3, node_id="n1"))  # waits (was a Conflict)
    whole = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, node_id="n1"), RNG)
    assert {str(b["gpu_uuid"]) for b in await bookings(store, str(whole["id"]))} == {inv.gpus[2].uuid}


async def test_mig_instances_are_not_booked_while_their_gpu_is_booked_whole(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    inv = await add_node("n1", profile="mig-a100-4")
    whole = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, node_id="n1"), RNG)
    held_uuid = str((await bookings(store, str(whole["id"])))[0]["gpu_uuid"])
    gpu = next(g for g in inv.gpus if g.uuid == held_uuid)
    # MIG is switched on for the booked GPU: its new instances must not be offered while it is held whole
    gpu.mig_enabled = True
    gpu.mig_instances.add(gi=1, ci=0, uuid="MIG-x1", profile="3g.40gb")
    gpu.mig_instances.add(gi=2, ci=0, uuid="MIG-x2", profile="3g.40gb")
    await set_inventory(store, "n1", inv)
    migs = await reserve(store, bus, SIGNER, ReserveRequest(gpus=6, node_id="n1", device_class="gpu.mig"), RNG)
    assert gpu.uuid not in {str(b["gpu_uuid"]) for b in await bookings(store, str(migs["id"]))}
    await waits(store, bus, ReserveRequest(gpus=1, node_id="n1", device_class="gpu.mig"))  # waits (was a Conflict)


async def test_a_cordoned_node_gets_no_reservation(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, count: Count
) -> None:
    # Issue 13: a cordoned node makes a reservation wait with that reason (it was a Conflict before).
    await add_node("n1")
    async with store.transaction() as tx:
        await tx.execute("UPDATE nodes SET cordoned = 1 WHERE node_id = 'n1'")
    assert await waits(store, bus, ReserveRequest(gpus=1, node_id="n1")) == "node n1 is cordoned"
    assert await waits(store, bus, ReserveRequest(gpus=1)) == "no schedulable node: node n1 is cordoned"
    assert await count("device_bookings") == 0
