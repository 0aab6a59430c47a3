"""Hold reservations: placed and booked in one transaction, delivered as a devices assignment.

A reservation is `placed` when its atoms are booked and its assignment is in
the node's spec, `active` once the node reports `AllocationBound`, `failed`
when the node cannot honour it (its bookings are freed and the assignment
removed), `releasing` after `bc release` until the node reports
`AllocationReleased`, then `released`. Bookings are freed only when the node
says the devices are free, so an atom is never booked twice while a node may
still hold it (I1), and nothing is released because a node went quiet (I5).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf import json_format

from bc.control import capacity
from bc.control.bus import Bus
from bc.control.events import publish
from bc.control.signer import Signer
from bc.control.specs import write_spec
from bc.errors import Conflict, NotFound, UsageError
from bc.ids import short_id, ulid
from bc.protocol.atoms import Atom, parse_atom
from bc.protocol.pb import common_pb2, spec_pb2
from bc.store import Row, Store, Tx
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql

DEVICE_CLASSES = ("gpu", "gpu.mig", "gpu.slot")
BINDINGS = {"hold": spec_pb2.BINDING_HOLD, "kubernetes": spec_pb2.BINDING_KUBERNETES}


@dataclass(frozen=True)
class ReserveRequest:
    gpus: int
    node_id: str = ""
    device_class: str = "gpu"
    binding: str = "hold"


def inventory_of(row: Row) -> common_pb2.Inventory:
    inv = common_pb2.Inventory()
    json_format.Parse(str(row["inventory"] or "{}"), inv, ignore_unknown_fields=True)
    return inv


async def _booked_atoms(tx: Tx, node_id: str) -> list[Atom]:
    return [parse_atom(str(b["device_class"]), str(b["atom_id"])) for b in await res_sql.live_bookings_on(tx, node_id)]


def _facts(row: Row) -> capacity.NodeFacts:
    return capacity.NodeFacts(
        node_id=str(row["node_id"]),
        role=str(row["role"]),
        cordoned=bool(row["cordoned"]),
        connectivity=str(row["connectivity"]),
        revoked=bool(row["revoked"]),
    )


def _validate(req: ReserveRequest) -> None:
    if req.device_class not in DEVICE_CLASSES:
        raise UsageError(f"unknown device class {req.device_class!r}; classes are {', '.join(DEVICE_CLASSES)}")
    if req.binding not in BINDINGS:
        raise UsageError(f"unknown binding {req.binding!r}; bindings are {', '.join(BINDINGS)}")
    if not 1 <= req.gpus <= 1024:
        raise UsageError(f"--gpus must be between 1 and 1024, not {req.gpus}")


async def reserve(store: Store, bus: Bus, signer: Signer, req: ReserveRequest, rng: random.Random) -> Row:
    _validate(req)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        if req.node_id:
            rows = await nodes_sql.placement_facts(tx, req.node_id)
            if not rows:
                raise NotFound(f"no node named {req.node_id!r}")
            why = capacity.refusal(_facts(rows[0]), named=True)
            if why is not None:
                raise Conflict(why)
            candidates = rows
        else:
            rows = await nodes_sql.placement_facts(tx)
            candidates = [n for n in rows if capacity.refusal(_facts(n), named=False) is None]
        options = [(str(n["node_id"]), inventory_of(n), await _booked_atoms(tx, str(n["node_id"]))) for n in candidates]
        choice = capacity.choose_node(options, req.device_class, req.gpus)
        if choice is None:
            if req.node_id:
                free = len(capacity.free_atoms(options[0][1], options[0][2], req.device_class))
                raise Conflict(f"node {req.node_id} has {free} free {req.device_class} atom(s); {req.gpus} asked")
            raise Conflict(f"no connected, uncordoned node has {req.gpus} free {req.device_class} atom(s)")
        node_id, atoms = choice
        rid = "res-" + ulid(now_ms / 1000, rng).lower()
        alloc = short_id("alloc", rng)
        await res_sql.insert(
            tx,
            id_=rid,
            node_id=node_id,
            allocation_id=alloc,
            device_class=req.device_class,
            gpus=req.gpus,
            binding=req.binding,
            state="placed",
            now_ms=now_ms,
        )
        for a in atoms:
            await res_sql.book(
                tx,
                reservation_id=rid,
                node_id=node_id,
                device_class=a.device_class,
                atom_id=a.atom_id,
                gpu_uuid=a.gpu_uuid,
                now_ms=now_ms,
            )

        def add(spec: spec_pb2.NodeSpec) -> None:
            da = spec.devices.assignments.add(allocation_id=alloc, reservation_id=rid, binding=BINDINGS[req.binding])
            for a in atoms:
                da.devices.add(device_class=a.device_class, atom_id=a.atom_id)

        w = await write_spec(tx, bus, signer, node_id, add, now_ms, lock=store.for_update())
        await res_sql.set_generation(tx, rid, w.generation)
        await publish(
            tx,
            bus,
            "reservation.placed",
            rid,
            {
                "node_id": node_id,
                "allocation_id": alloc,
                "atoms": [a.atom_id for a in atoms],
                "generation": w.generation,
            },
            now_ms,
        )
        row = await res_sql.get(tx, rid)
    assert row is not None
    return row


def _drop_assignment(allocation_id: str) -> Callable[[spec_pb2.NodeSpec], None]:
    def mutate(spec: spec_pb2.NodeSpec) -> None:
        keep = [a for a in spec.devices.assignments if a.allocation_id != allocation_id]
        del spec.devices.assignments[:]
        spec.devices.assignments.extend(keep)
        if not keep:
            spec.ClearField("devices")

    return mutate


async def release(store: Store, bus: Bus, signer: Signer, reservation_id: str) -> Row:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await res_sql.get(tx, reservation_id)
        if row is None:
            raise NotFound(f"no reservation named {reservation_id!r}")
        state = str(row["state"])
        if state in ("releasing", "released"):
            return row  # releasing twice is a no-op, not an error
        node_id = str(row["node_id"])
        w = await write_spec(
            tx, bus, signer, node_id, _drop_assignment(str(row["allocation_id"])), now_ms, lock=store.for_update()
        )
        if state == "failed":
            await res_sql.set_state(tx, reservation_id, "released", now_ms)
        else:
            await res_sql.set_state(tx, reservation_id, "releasing", now_ms)
            await res_sql.set_generation(tx, reservation_id, w.generation)
        await publish(
            tx, bus, "reservation.releasing", reservation_id, {"node_id": node_id, "generation": w.generation}, now_ms
        )
        out = await res_sql.get(tx, reservation_id)
    assert out is not None
    return out


async def on_allocation_report(
    tx: Tx,
    bus: Bus | None,
    signer: Signer,
    reporting_node: str,
    kind: str,
    allocation_id: str,
    reason: str,
    message: str,
    now_ms: int,
    lock: str = "",
) -> str:
    """The allocation handlers. Returns what happened, for the caller's log.

    A report about an allocation that is not placed on the reporting node
    changes nothing: one node's session cannot bind, release or fail another
    node's allocation.
    """
    row = await res_sql.by_allocation(tx, allocation_id)
    if row is None:
        return "unknown-allocation"
    if str(row["node_id"]) != reporting_node:
        await publish(
            tx,
            bus,
            "security.node-mismatch",
            reporting_node,
            {"allocation_id": allocation_id, "placed_on": str(row["node_id"]), "kind": kind},
            now_ms,
        )
        return "foreign-allocation"
    rid = str(row["id"])
    if kind == "bound":
        if await res_sql.set_state(tx, rid, "active", now_ms, only_from=("placed",)):
            await publish(tx, bus, "reservation.active", rid, {"node_id": reporting_node}, now_ms)
            return "active"
        return "ignored"
    if kind == "released":
        if str(row["state"]) == "releasing":
            await res_sql.set_state(tx, rid, "released", now_ms)
            await res_sql.release_bookings(tx, rid, now_ms)
            await publish(tx, bus, "reservation.released", rid, {"node_id": reporting_node}, now_ms)
            return "released"
        return "ignored"
    if kind == "failed":
        if await res_sql.set_state(tx, rid, "failed", now_ms, reason, only_from=("placed", "active")):
            await res_sql.release_bookings(tx, rid, now_ms)
            await write_spec(tx, bus, signer, reporting_node, _drop_assignment(allocation_id), now_ms, lock=lock)
            await publish(
                tx,
                bus,
                "reservation.failed",
                rid,
                {"node_id": reporting_node, "reason": reason, "message": message},
                now_ms,
            )
            return "failed"
        return "ignored"
    return "unknown-kind"


async def mark_binding_lost(
    tx: Tx, bus: Bus | None, node_id: str, allocation_id: str, why: str, now_ms: int, lock: str = ""
) -> bool:
    """A forged report about an active binding: the binding is `lost`, not replaced, and nothing is released.

    The hold stays in the node's spec and its devices stay booked; an operator
    looks and releases it (reference: "Compromised gateway").
    """
    row = await res_sql.by_allocation(tx, allocation_id)
    if row is None or str(row["node_id"]) != node_id or str(row["state"]) != "active":
        return False
    rid = str(row["id"])
    if not await res_sql.set_state(tx, rid, "lost", now_ms, f"forged-report:{why}", only_from=("active",)):
        return False
    await publish(tx, bus, "reservation.lost", rid, {"node_id": node_id, "reason": f"forged-report:{why}"}, now_ms)
    return True


__all__ = ["ReserveRequest", "mark_binding_lost", "on_allocation_report", "release", "reserve"]
