"""Hold reservations: submitted pending, placed by the placement pass, delivered as a devices assignment.

`reserve` validates the request (issue 13's bad input: one sentence, nothing stored), inserts a `pending`
row and runs a placement pass inline in the same transaction (`bc.control.capacity.placement_pass`), so a
reservation that fits now returns `placed` at once; one that waits (for capacity, for a node that is away
or cordoned, for its window's start) returns `pending` with its reason, and one that can never fit is
refused with the pass's sentence and stores nothing. A booked window that starts later stays `pending`,
booked, until the pass delivers it at its start; the pass ends it (`ended`, `window-ended`) at its end.

A reservation is `placed` when its atoms are booked and its assignment is in
the node's spec, `active` once the node reports `AllocationBound`, `failed`
when the node cannot honour it (its bookings are freed and the assignment
removed), `releasing` after `bc release` until the node reports
`AllocationReleased`, then `released`. Bookings are freed only when the node
says the devices are free, so an atom is never booked twice while a node may
still hold it (I1), and nothing is released because a node went quiet (I5).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from google.protobuf import json_format

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.capacity import placement_pass
from bc.control.capacity.placement_plan import INSTANCE_WHOLE_GPUS, iso
from bc.control.nodes.specs import write_spec
from bc.control.signing.signer import Signer
from bc.errors import Conflict, NotFound, UsageError
from bc.protocol.limits import LIMITS, check_name, check_range
from bc.protocol.pb import common_pb2
from bc.seams.ids import short_id, ulid
from bc.store import Row, Store, Tx
from bc.store import capacity as cap_sql
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql

DEVICE_CLASSES = ("gpu", "gpu.mig", "gpu.slot")
BINDINGS = placement_pass.BINDINGS
PAST_START_SLACK_MS = 5 * 60_000
REFUSED_AT_ADMISSION = "resources-exhausted"
"""A node's AllocationFailed reason for a hold its host cannot admit: placed again elsewhere, not failed."""
"""A window may start up to this long ago (a clock a little behind, a slow terminal); earlier is refused."""


@dataclass(frozen=True)
class ReserveRequest:
    gpus: int
    node_id: str = ""
    device_class: str = "gpu"
    binding: str = "hold"
    start_ms: int | None = None  # None: as soon as possible
    end_ms: int | None = None  # None: open-ended, or `duration_ms` from its start
    duration_ms: int | None = None
    cpus: int = 0
    memory_bytes: int = 0
    hugepages_1g: int = 0
    tenant: str = ""
    selector: Mapping[str, str] = field(default_factory=dict)


def inventory_of(row: Row) -> common_pb2.Inventory:
    inv = common_pb2.Inventory()
    json_format.Parse(str(row["inventory"] or "{}"), inv, ignore_unknown_fields=True)
    return inv


def _validate(req: ReserveRequest, now_ms: int) -> None:
    """Issue 13's bad input: one sentence each, before anything is stored."""
    if req.device_class not in DEVICE_CLASSES:
        raise UsageError(f"unknown device class {req.device_class!r}; classes are {', '.join(DEVICE_CLASSES)}")
    if req.binding not in BINDINGS:
        raise UsageError(f"unknown binding {req.binding!r}; bindings are {', '.join(BINDINGS)}")
    if req.binding == "instance":
        _check_instance_binding(req)
    if not 1 <= req.gpus <= 1024:
        raise UsageError(f"--gpus must be between 1 and 1024, not {req.gpus}")
    check_range("--gpus", req.gpus, 1, "max_gpus")
    if req.duration_ms is not None and req.end_ms is not None:
        raise UsageError("give a duration or an end, not both")
    if req.duration_ms is not None and req.duration_ms <= 0:
        raise UsageError(f"a duration must be positive, not {req.duration_ms} ms")
    if min(req.cpus, req.memory_bytes, req.hugepages_1g) < 0:
        raise UsageError("--cpus, --memory and --hugepages-1g cannot be negative")
    check_window(req.start_ms, req.end_ms, req.duration_ms, now_ms)
    check_range("--cpus", req.cpus, 0, "max_cpus")
    check_range("--memory (bytes)", req.memory_bytes, 0, "max_memory_bytes")
    check_range("--hugepages-1g", req.hugepages_1g, 0, "max_hugepages_1g")
    check_name("the tenant", req.tenant)
    for k, v in req.selector.items():
        if not k or not v or "," in k + v or "=" in k:
            raise UsageError(f"a selector is key=value pairs, not {k!r}={v!r}")


def _check_instance_binding(req: ReserveRequest) -> None:
    """An instance reservation books whole GPUs for a VM; the VM's own CPUs and memory are its instance's
    (vcpus, memory_mib), which the node admits at start, so none are booked beside them."""
    if req.device_class != "gpu":
        raise UsageError(INSTANCE_WHOLE_GPUS)
    if req.cpus or req.memory_bytes or req.hugepages_1g:
        raise UsageError(
            "an instance reservation books whole GPUs only: the VM's CPUs and memory are its instance's"
            " (vcpus, memory_mib), which the node admits at start"
        )


def check_window(start_ms: int | None, end_ms: int | None, duration_ms: int | None, now_ms: int) -> None:
    """A window inside the limits table's bounds (issue 29): a start at most `max_start_ahead_ms` ahead and
    not more than 5 minutes ago, a duration (or end - start) of at most `max_duration_ms`. Checked before
    anything is computed from them, so `iso` and the planner only see instants a datetime can hold."""
    if duration_ms is not None:
        check_range("the duration (ms)", duration_ms, 1, "max_duration_ms")
    if start_ms is not None:
        if start_ms > now_ms + LIMITS.max_start_ahead_ms:
            raise UsageError(
                f"the window starts more than {LIMITS.max_start_ahead_ms // 86_400_000} days ahead "
                f"({start_ms:,} ms; max_start_ahead_ms)"
            )
        if start_ms < now_ms - PAST_START_SLACK_MS:
            raise UsageError(f"the window starts at {iso(start_ms)}, more than 5 minutes ago")
    if end_ms is not None:
        start = now_ms if start_ms is None else start_ms
        if end_ms <= start:
            raise UsageError(f"the window ends at {iso(end_ms)}, before it starts at {iso(start)}")
        check_range("the window's length (ms)", end_ms - start, 1, "max_duration_ms")


async def _check_named(tx: Tx, node_id: str) -> None:
    """A named node must exist and be able to bind a hold some day; away or cordoned, the hold waits for it."""
    rows = await nodes_sql.placement_facts(tx, node_id)
    if not rows:
        raise NotFound(f"no node named {node_id!r}")
    row = rows[0]
    if str(row["role"]) != "node":
        raise Conflict(f"node {node_id} has role {row['role']!r}; holds are placed on role 'node' only")
    if bool(row["revoked"]):
        raise Conflict(f"node {node_id} is revoked; it can never bind a hold")


async def reserve(
    store: Store,
    bus: Bus,
    signer: Signer,
    req: ReserveRequest,
    rng: random.Random,
    *,
    placement: placement_pass.PlacementPass | None = None,
) -> Row:
    """Store a pending reservation and run a placement pass inline, in one transaction.

    A reservation that fits now returns `placed`; one that waits (for capacity, a node that is away or
    cordoned, its window's start) returns `pending` with its reason. One that can never fit stores
    nothing: Conflict with the pass's sentence.

    `placement` is the process's own pass (`bc serve` hands its loop's): the inline pass then goes on from
    the last committed one and decides only what is new when nothing else changed (`PlacementPass.step`);
    a fresh pass re-plans the whole queue, about 0.9 s a submit at 10,000 waiting (docs/scale.md).
    """
    now_ms = await store.now_ms()
    _validate(req, now_ms)
    async with store.transaction() as tx:
        if req.node_id:
            await _check_named(tx, req.node_id)
        rid = "res-" + ulid(now_ms / 1000, rng).lower()
        alloc = short_id("alloc", rng)
        await cap_sql.insert_pending(
            tx,
            id_=rid,
            allocation_id=alloc,
            want_node_id=req.node_id or None,
            device_class=req.device_class,
            gpus=req.gpus,
            binding=req.binding,
            start_ms=req.start_ms,
            end_ms=req.end_ms,
            duration_ms=req.duration_ms,
            tenant=req.tenant,
            selector_json=json.dumps(dict(req.selector), sort_keys=True),
            cpus=req.cpus,
            memory_bytes=req.memory_bytes,
            hugepages_1g=req.hugepages_1g,
            now_ms=now_ms,
        )
        inline = placement or placement_pass.PlacementPass(store, bus, signer, rng, holder="")
        result = await inline.step(tx, now_ms)
        for o in result.plan.failures:
            if o.reservation_id == rid:
                if o.reason.startswith("no node named"):
                    raise NotFound(o.reason)
                raise Conflict(o.reason)  # nothing stored: the transaction rolls back
        await publish(tx, bus, "reservation.submitted", rid, {"gpus": req.gpus, "node_id": req.node_id}, now_ms)
        row = await res_sql.get(tx, rid)
    assert row is not None
    return row


_drop_assignment = placement_pass.drop_assignment


async def release(store: Store, bus: Bus, signer: Signer, reservation_id: str) -> Row:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await res_sql.get(tx, reservation_id)
        if row is None:
            raise NotFound(f"no reservation named {reservation_id!r}")
        state = str(row["state"])
        if state in ("releasing", "released", "ended"):
            return row  # releasing twice (or after its window ended) is a no-op, not an error
        if state == "pending" or row["node_id"] is None:
            # Never delivered, or refused by its node and not placed again: nothing on a node to take back.
            await cap_sql.settle(tx, reservation_id, "released", "released", now_ms, (state,))
            await res_sql.release_bookings(tx, reservation_id, now_ms)
            await placement_pass.flush_usage(tx, now_ms, reservation_id)
            await publish(tx, bus, "reservation.released", reservation_id, {"node_id": row["node_id"] or ""}, now_ms)
            out = await res_sql.get(tx, reservation_id)
            assert out is not None
            return out
        node_id = str(row["node_id"])
        w = await write_spec(
            tx, bus, signer, node_id, _drop_assignment(str(row["allocation_id"])), now_ms, lock=store.for_update()
        )
        if state == "failed":
            await res_sql.set_state(tx, reservation_id, "released", now_ms)
        else:
            await res_sql.set_state(tx, reservation_id, "releasing", now_ms)
            await res_sql.set_generation(tx, reservation_id, w.generation)
            await cap_sql.set_usage_end(tx, reservation_id, now_ms)  # usage ends at the release commit
            await placement_pass.flush_usage(tx, now_ms, reservation_id)
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
        if reason == REFUSED_AT_ADMISSION and str(row["state"]) == "placed" and not row["want_node_id"]:
            return await _place_elsewhere(tx, bus, signer, row, reporting_node, reason, message, now_ms, lock)
        if await res_sql.set_state(tx, rid, "failed", now_ms, reason, only_from=("placed", "active")):
            await cap_sql.set_usage_end(tx, rid, now_ms)
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


async def _place_elsewhere(
    tx: Tx,
    bus: Bus | None,
    signer: Signer,
    row: Row,
    node_id: str,
    reason: str,
    message: str,
    now_ms: int,
    lock: str,
) -> str:
    """The node refused a hold it never bound (its host could not admit it): capacity places it again.

    The refused placement is closed like a release (its usage, from the placement to this commit, flushed
    and kept as an attempt; its bookings freed; its assignment taken back from the node) and the reservation
    goes back to the queue with a new allocation id, never to be offered to this node again. The pass that
    the queue's change wakes places it elsewhere, or fails it when no other node could ever take it.
    """
    rid, old_alloc = str(row["id"]), str(row["allocation_id"])
    await cap_sql.set_usage_end(tx, rid, now_ms)
    await placement_pass.flush_usage(tx, now_ms, rid)
    (span_row,) = [r for r in await cap_sql.billing_spans_of(tx, rid)]
    span = placement_pass.span_of(span_row)
    attempt = await cap_sql.record_refused_attempt(
        tx,
        reservation_id=rid,
        node_id=node_id,
        allocation_id=old_alloc,
        usage_start_ms=span.usage_start_ms,
        usage_end_ms=max(span.usage_start_ms, span.usage_end_ms or now_ms),
        reason=reason,
        message=message,
    )
    await res_sql.release_bookings(tx, rid, now_ms)
    await write_spec(tx, bus, signer, node_id, _drop_assignment(old_alloc), now_ms, lock=lock)
    avoid = sorted({*json.loads(str(row["avoid_nodes"] or "[]")), node_id})
    base = old_alloc.split(".", 1)[0]
    why = f"{node_id} refused it ({reason}: {message}); waiting to be placed on another node"
    await cap_sql.requeue_refused(
        tx, rid, allocation_id=f"{base}.{attempt + 1}", avoid_json=json.dumps(avoid), reason=why
    )
    await publish(
        tx,
        bus,
        "reservation.refused",
        rid,
        {"node_id": node_id, "reason": reason, "message": message, "attempt": attempt, "avoid": avoid},
        now_ms,
    )
    return "refused"


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
