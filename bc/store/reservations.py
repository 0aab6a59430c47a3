"""Reservations and the atoms they book. The live-booking unique index is the last line of I1."""

from __future__ import annotations

from bc.store.base import Row, Tx


async def insert(
    tx: Tx,
    *,
    id_: str,
    node_id: str,
    allocation_id: str,
    device_class: str,
    gpus: int,
    binding: str,
    state: str,
    now_ms: int,
) -> None:
    await tx.execute(
        "INSERT INTO reservations (id, seq, node_id, want_node_id, allocation_id, device_class, gpus, binding, state,"
        " created_at_ms, start_ms, placed_at_ms)"
        " VALUES (:id, (SELECT COALESCE(MAX(seq), 0) + 1 FROM reservations), :n, :n, :a, :c, :g, :b, :s, :t, :t, :t)",
        {
            "id": id_,
            "n": node_id,
            "a": allocation_id,
            "c": device_class,
            "g": gpus,
            "b": binding,
            "s": state,
            "t": now_ms,
        },
    )


async def book(
    tx: Tx, *, reservation_id: str, node_id: str, device_class: str, atom_id: str, gpu_uuid: str, now_ms: int
) -> None:
    await tx.execute(
        "INSERT INTO device_bookings (reservation_id, node_id, device_class, atom_id, gpu_uuid, booked_at_ms, start_ms)"
        " VALUES (:r, :n, :c, :a, :g, :t, :t)",
        {"r": reservation_id, "n": node_id, "c": device_class, "a": atom_id, "g": gpu_uuid, "t": now_ms},
    )


async def get(tx: Tx, id_: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM reservations WHERE id = :id", {"id": id_})


async def by_allocation(tx: Tx, allocation_id: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM reservations WHERE allocation_id = :a", {"a": allocation_id})


TERMINAL = ("released", "failed", "lost", "ended")
STATE_GROUPS = {"ended": TERMINAL, "active": ("placed", "active", "releasing")}


async def list_(
    tx: Tx, node_id: str = "", include_released: bool = False, *, state: str = "", tenant: str = ""
) -> list[Row]:
    """Reservations in submit order. `state`: one state, or `active` (placed, active, releasing) or `ended`
    (every terminal state); empty: every one but the released (all of them with `include_released`)."""
    params: dict[str, object] = {"n": node_id, "all": 1 if include_released or state else 0, "tenant": tenant}
    where = ""
    if state:
        states = STATE_GROUPS.get(state, (state,))
        params.update({f"s{i}": v for i, v in enumerate(states)})
        where = " AND state IN (" + ", ".join(f":s{i}" for i in range(len(states))) + ")"
    return await tx.fetchall(
        "SELECT * FROM reservations WHERE (:n = '' OR node_id = :n OR want_node_id = :n)"
        " AND (:all = 1 OR state <> 'released') AND (:tenant = '' OR tenant = :tenant)"
        f"{where} ORDER BY seq, id",
        params,
    )


async def bookings(tx: Tx, reservation_id: str) -> list[Row]:
    """The bookings of the reservation's current placement (a placement a node refused keeps its own rows)."""
    return await tx.fetchall(
        "SELECT b.device_class, b.atom_id, b.gpu_uuid, b.start_ms, b.end_ms FROM device_bookings b"
        " JOIN reservations r ON r.id = b.reservation_id AND r.node_id = b.node_id WHERE b.reservation_id = :r"
        " ORDER BY b.atom_id",
        {"r": reservation_id},
    )


async def live_bookings_on(tx: Tx, node_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT b.reservation_id, b.device_class, b.atom_id, b.gpu_uuid, r.allocation_id, r.binding"
        " FROM device_bookings b JOIN reservations r ON r.id = b.reservation_id"
        " WHERE b.node_id = :n AND b.released_at_ms IS NULL ORDER BY r.created_at_ms, b.atom_id",
        {"n": node_id},
    )


async def set_state(
    tx: Tx, id_: str, state: str, now_ms: int, reason: str = "", *, only_from: tuple[str, ...] = ()
) -> bool:
    where = ""
    params: dict[str, object] = {"id": id_, "s": state, "r": reason, "t": now_ms}
    if only_from:
        where = " AND state IN (" + ", ".join(f":f{i}" for i in range(len(only_from))) + ")"
        params.update({f"f{i}": v for i, v in enumerate(only_from)})
    extra = ""
    if state == "active":
        extra = ", bound_at_ms = :t"
    elif state == "released":
        extra = ", released_at_ms = :t"
    n = await tx.execute(f"UPDATE reservations SET state = :s, reason = :r{extra} WHERE id = :id{where}", params)
    return n == 1


async def set_generation(tx: Tx, id_: str, generation: int) -> None:
    await tx.execute("UPDATE reservations SET generation = :g WHERE id = :id", {"g": generation, "id": id_})


async def release_bookings(tx: Tx, reservation_id: str, now_ms: int) -> None:
    await tx.execute(
        "UPDATE device_bookings SET released_at_ms = :t,"
        " end_ms = CASE WHEN end_ms IS NOT NULL AND end_ms <= :t THEN end_ms"
        " WHEN start_ms < :t THEN :t ELSE start_ms + 1 END"
        " WHERE reservation_id = :r AND released_at_ms IS NULL",
        {"t": now_ms, "r": reservation_id},
    )
