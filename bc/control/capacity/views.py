"""What `bc usage`, `bc reservation show` and `bc capacity explain` read (docs/capacity.md).

Usage adds up the flushed windows and, for each hold whose usage is not all flushed yet, its open window
up to now (`usage_windows.aggregate`); the explanation runs the pure `plan` over the stored facts in a
read-only transaction, so it says exactly what the next pass would decide, and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import json_format

from bc.control.capacity.placement_pass import load_facts, span_of
from bc.control.capacity.placement_plan import Failure, Placement, Wait, plan
from bc.control.capacity.usage_classes import ClassPart, ClassRow, add_windows, class_rows
from bc.control.capacity.usage_windows import BY, UsageWindow, open_window
from bc.errors import NotFound, UsageError
from bc.protocol.pb import common_pb2
from bc.store import Row, Store
from bc.store import capacity as cap_sql
from bc.store import reservations as res_sql


def window_of(row: Row) -> UsageWindow:
    return UsageWindow(
        reservation_id=str(row["reservation_id"]),
        node_id=str(row["node_id"]),
        tenant=str(row["tenant"]),
        device_class=str(row["device_class"]),
        atoms=int(row["atoms"]),
        start_ms=int(row["start_ms"]),
        end_ms=int(row["end_ms"]),
    )


async def usage(store: Store, since_ms: int | None, until_ms: int | None, by: str) -> tuple[list[ClassRow], int]:
    """The usage rows in `[since_ms, until_ms)` (None: unbounded; open windows count up to now), and now:
    one per key and device class, MIG instances per profile (`bc.control.capacity.usage_classes`)."""
    by = by or "reservation"
    if by not in BY:
        raise UsageError(f"usage is grouped by {', '.join(BY)}, not {by!r}")
    if since_ms is not None and until_ms is not None and until_ms <= since_ms:
        raise UsageError("--until must be after --since")
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        # The flushed windows (a year of hourly ones is millions of rows) are summed by the store; the open
        # windows of holds still running, a few, by the same pure rule; then the two are added per part.
        sums = {
            ClassPart(str(r["key"]), str(r["device_class"]), str(r["mig_reservation"] or "")): (
                int(r["atom_ms"] or 0),
                int(r["windows"]),
            )
            for r in await cap_sql.usage_sums_by_class(tx, since_ms, until_ms, by)
        }
        open_windows: list[UsageWindow] = []
        for row in await cap_sql.unflushed_spans(tx):
            flushed = None if row["flushed_ms"] is None else int(row["flushed_ms"])
            w = open_window(span_of(row), flushed, now_ms)
            if w is not None:
                open_windows.append(w)
        add_windows(sums, open_windows, since_ms, until_ms, by)
        mig = sorted({p.mig_reservation for p in sums if p.mig_reservation})
        mig_profiles = _mig_profiles(await cap_sql.mig_bookings(tx, mig))
    return class_rows(sums, mig_profiles), now_ms


def _mig_profiles(rows: list[Row]) -> dict[str, list[str]]:
    """reservation -> the profile of each MIG instance it booked, as its node's inventory names it now."""
    inventories: dict[str, dict[str, str]] = {}  # inventory text -> atom id -> profile
    out: dict[str, list[str]] = {}
    for r in rows:
        text = str(r["inventory"] or "{}")
        if text not in inventories:
            inv = common_pb2.Inventory()
            json_format.Parse(text, inv, ignore_unknown_fields=True)
            inventories[text] = {f"{g.uuid}/{m.gi}/{m.ci}": m.profile for g in inv.gpus for m in g.mig_instances}
        out.setdefault(str(r["reservation_id"]), []).append(inventories[text].get(str(r["atom_id"]), ""))
    return out


@dataclass(frozen=True)
class Explanation:
    reservation_id: str
    state: str
    reason: str
    earliest_start_ms: int | None = None
    held_node_id: str = ""
    queue_position: int = 0


async def explain(store: Store, reservation_id: str) -> Explanation:
    """Why the reservation is where it is; for a pending, unbooked one, what the next pass would decide."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await res_sql.get(tx, reservation_id)
        if row is None:
            raise NotFound(f"no reservation named {reservation_id!r}")
        state, reason = str(row["state"]), str(row["reason"] or "")
        if state != "pending" or row["node_id"] is not None:
            if state == "pending":
                return Explanation(reservation_id, state, reason or "booked; waiting for its window to start")
            where = f" on {row['node_id']}" if row["node_id"] else ""
            return Explanation(reservation_id, state, reason or f"{state}{where}")
        facts = await load_facts(tx)
    position = next((i + 1 for i, r in enumerate(facts.pending) if r.reservation_id == reservation_id), 0)
    p = plan(facts.nodes, facts.bookings, facts.pending, now_ms)
    for o in p.outcomes:
        if o.reservation_id != reservation_id:
            continue
        if isinstance(o, Wait):
            held = o.held.node_id if o.held is not None else ""
            return Explanation(reservation_id, state, o.reason, o.earliest_start_ms, held, position)
        if isinstance(o, Placement):
            return Explanation(
                reservation_id, state, f"fits on {o.node_id} now; the next pass places it", None, o.node_id, position
            )
        if isinstance(o, Failure):
            return Explanation(reservation_id, state, f"can never fit ({o.code}): {o.reason}", None, "", position)
    return Explanation(reservation_id, state, reason, None, "", position)


__all__ = ["Explanation", "explain", "usage"]
