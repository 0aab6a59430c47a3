"""How a deliberately broken component (`bc.sim.breaks`) releases a hold: as the control plane's own release
does, in the caller's transaction. The assignment is dropped from the node's spec, the bookings freed, the
usage closed and the reservation `released` with the component's `reason` (its `reservation.released` event is
what I5 and H1 read)."""

from __future__ import annotations

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.capacity import placement_pass
from bc.control.nodes.specs import write_spec
from bc.control.signing.signer import Signer
from bc.store import Row, Tx
from bc.store import capacity as cap_sql
from bc.store import reservations as res_sql


async def release_reservation(
    tx: Tx, bus: Bus, signer: Signer, row: Row, reason: str, now_ms: int, *, lock: str
) -> bool:
    """Release the placed or active reservation `row` (a `bc.store.reservations` row) on its node; False when it
    was neither (or moved meanwhile). `lock`: the store's `for_update()`."""
    rid, node_id = str(row["id"]), str(row["node_id"] or "")
    if not node_id or str(row["state"]) not in ("placed", "active"):
        return False
    if not await cap_sql.settle(tx, rid, "released", reason, now_ms, ("placed", "active")):
        return False
    await res_sql.release_bookings(tx, rid, now_ms)
    await placement_pass.flush_usage(tx, now_ms, rid)
    drop = placement_pass.drop_assignment(str(row["allocation_id"]))
    await write_spec(tx, bus, signer, node_id, drop, now_ms, lock=lock)
    await publish(tx, bus, "reservation.released", rid, {"node_id": node_id, "reason": reason}, now_ms)
    return True


__all__ = ["release_reservation"]
