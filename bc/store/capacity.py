"""The placement pass's rows: its lock, the facts it reads, and what it writes (docs/capacity.md).

Every write of a pass commits in the transaction that locked `placement_meta`'s row (PostgreSQL holds the
lock to the commit; SQLite's single writer does the rest), so two passes never book from one look.
"""

from __future__ import annotations

from bc.store.base import Row, Tx


async def lock_pass(tx: Tx, dialect: str) -> None:
    """Take the pass's lock: a concurrent pass waits here for the commit (PostgreSQL's row lock; SQLite has one
    writer). A quiet pass writes nothing, so the lock is a locking read (that waits), not an update."""
    lock = " FOR UPDATE" if dialect == "postgres" else ""
    await tx.fetchval(f"SELECT version FROM placement_meta WHERE id = 1{lock}")


async def live_bookings(tx: Tx) -> list[Row]:
    """Every booking not yet released, with its reservation's host resources, pins and state."""
    return await tx.fetchall(
        "SELECT b.reservation_id, b.node_id, b.device_class, b.atom_id, b.gpu_uuid, b.start_ms, b.end_ms,"
        " r.cpus, r.memory_bytes, r.hugepages_1g, r.cpu_numa, r.mem_numa, r.state, r.allocation_id"
        " FROM device_bookings b JOIN reservations r ON r.id = b.reservation_id"
        " WHERE b.released_at_ms IS NULL ORDER BY r.seq, b.atom_id"
    )


async def live_bookings_on(tx: Tx, node_id: str) -> list[Row]:
    """`live_bookings` of one node (what `bc nodes show` counts)."""
    return await tx.fetchall(
        "SELECT b.reservation_id, b.node_id, b.device_class, b.atom_id, b.gpu_uuid, b.start_ms, b.end_ms,"
        " r.cpus, r.memory_bytes, r.hugepages_1g FROM device_bookings b JOIN reservations r ON r.id = b.reservation_id"
        " WHERE b.node_id = :n AND b.released_at_ms IS NULL ORDER BY r.seq, b.atom_id",
        {"n": node_id},
    )


async def overlapping(tx: Tx, node_id: str, start_ms: int, end_ms: int | None) -> list[Row]:
    """The unreleased bookings on `node_id` whose interval meets `[start_ms, end_ms)` (None: open-ended)."""
    return await tx.fetchall(
        "SELECT reservation_id, device_class, atom_id, gpu_uuid FROM device_bookings"
        " WHERE node_id = :n AND released_at_ms IS NULL AND (CAST(:e AS BIGINT) IS NULL OR start_ms < :e)"
        " AND (end_ms IS NULL OR end_ms > :s)",
        {"n": node_id, "s": start_ms, "e": end_ms},
    )


async def pending_unbooked(tx: Tx) -> list[Row]:
    return await tx.fetchall("SELECT * FROM reservations WHERE state = 'pending' AND node_id IS NULL ORDER BY seq")


async def pending_unbooked_after(tx: Tx, seq: int, id_: str) -> list[Row]:
    """`pending_unbooked` after (seq, id) in submit order: what an incremental pass has not planned yet."""
    return await tx.fetchall(
        "SELECT * FROM reservations WHERE state = 'pending' AND node_id IS NULL"
        " AND (seq > :s OR (seq = :s AND id > :i)) ORDER BY seq, id",
        {"s": seq, "i": id_},
    )


async def pending_unbooked_ids(tx: Tx) -> list[str]:
    """The ids of `pending_unbooked`: an incremental pass checks the queue it left is still there."""
    rows = await tx.fetchall("SELECT id FROM reservations WHERE state = 'pending' AND node_id IS NULL")
    return [str(r["id"]) for r in rows]


_DUE = (
    "r.state = 'pending' AND r.node_id IS NOT NULL AND EXISTS (SELECT 1 FROM device_bookings b"
    " WHERE b.reservation_id = r.id AND b.released_at_ms IS NULL AND b.start_ms <= :t)"
)
"""A booked window that has started and is not delivered yet (pending with a node)."""


async def has_due_window(tx: Tx, now_ms: int) -> bool:
    """A booked window has started and is not delivered yet."""
    return await tx.fetchone(f"SELECT 1 AS w FROM reservations r WHERE {_DUE} LIMIT 1", {"t": now_ms}) is not None


async def has_unbooked_pending(tx: Tx) -> bool:
    """A reservation waits in the queue, booked nowhere."""
    row = await tx.fetchone("SELECT 1 AS w FROM reservations WHERE state = 'pending' AND node_id IS NULL LIMIT 1")
    return row is not None


async def due_windows(tx: Tx, now_ms: int) -> list[Row]:
    """Booked windows that have started and are not delivered yet (pending with a node)."""
    return await tx.fetchall(f"SELECT r.* FROM reservations r WHERE {_DUE} ORDER BY r.seq", {"t": now_ms})


async def insert_pending(
    tx: Tx,
    *,
    id_: str,
    allocation_id: str,
    want_node_id: str | None,
    device_class: str,
    gpus: int,
    binding: str,
    start_ms: int | None,
    end_ms: int | None,
    duration_ms: int | None,
    tenant: str,
    selector_json: str,
    cpus: int,
    memory_bytes: int,
    hugepages_1g: int,
    now_ms: int,
) -> None:
    await tx.execute(
        "INSERT INTO reservations (id, seq, want_node_id, allocation_id, device_class, gpus, binding, state,"
        " created_at_ms, start_ms, end_ms, duration_ms, tenant, selector, cpus, memory_bytes, hugepages_1g)"
        " VALUES (:id, (SELECT COALESCE(MAX(seq), 0) + 1 FROM reservations), :w, :a, :c, :g, :b, 'pending', :t,"
        " :s, :e, :d, :tenant, :sel, :cpus, :mem, :hp)",
        {
            "id": id_,
            "w": want_node_id,
            "a": allocation_id,
            "c": device_class,
            "g": gpus,
            "b": binding,
            "t": now_ms,
            "s": start_ms,
            "e": end_ms,
            "d": duration_ms,
            "tenant": tenant,
            "sel": selector_json,
            "cpus": cpus,
            "mem": memory_bytes,
            "hp": hugepages_1g,
        },
    )


async def book_atom(
    tx: Tx,
    *,
    reservation_id: str,
    node_id: str,
    device_class: str,
    atom_id: str,
    gpu_uuid: str,
    start_ms: int,
    end_ms: int | None,
    now_ms: int,
) -> None:
    await tx.execute(
        "INSERT INTO device_bookings (reservation_id, node_id, device_class, atom_id, gpu_uuid, booked_at_ms,"
        " start_ms, end_ms) VALUES (:r, :n, :c, :a, :g, :t, :s, :e)",
        {
            "r": reservation_id,
            "n": node_id,
            "c": device_class,
            "a": atom_id,
            "g": gpu_uuid,
            "t": now_ms,
            "s": start_ms,
            "e": end_ms,
        },
    )


async def set_booked(
    tx: Tx, reservation_id: str, node_id: str, cpu_numa_json: str, mem_numa_json: str, reason: str, now_ms: int
) -> None:
    """The reservation is booked on `node_id` (still pending until it is delivered); usage counts from now."""
    await tx.execute(
        "UPDATE reservations SET node_id = :n, cpu_numa = :c, mem_numa = :m, reason = :r, placed_at_ms = :t"
        " WHERE id = :id AND state = 'pending'",
        {"n": node_id, "c": cpu_numa_json, "m": mem_numa_json, "r": reason, "t": now_ms, "id": reservation_id},
    )


async def set_delivered(tx: Tx, reservation_id: str, generation: int) -> None:
    await tx.execute(
        "UPDATE reservations SET state = 'placed', reason = '', generation = :g WHERE id = :id AND state = 'pending'",
        {"g": generation, "id": reservation_id},
    )


async def set_wait_reason(tx: Tx, reservation_id: str, reason: str) -> bool:
    """Record why a pending reservation waits; True when the reason changed."""
    n = await tx.execute(
        "UPDATE reservations SET reason = :r WHERE id = :id AND state = 'pending' AND reason <> :r",
        {"r": reason, "id": reservation_id},
    )
    return n == 1


async def settle(
    tx: Tx, reservation_id: str, state: str, reason: str, now_ms: int, only_from: tuple[str, ...], *, end_ms: int = 0
) -> bool:
    """Move to a terminal state (`failed`, `ended`, `released`) from one of `only_from`; True when it moved.
    Usage stops at `end_ms` (a window's end) or else at `now_ms` (the commit)."""
    params: dict[str, object] = {"id": reservation_id, "s": state, "r": reason, "t": now_ms, "e": end_ms or now_ms}
    params.update({f"f{i}": v for i, v in enumerate(only_from)})
    states = ", ".join(f":f{i}" for i in range(len(only_from)))
    n = await tx.execute(
        "UPDATE reservations SET state = :s, reason = :r, ended_at_ms = :e,"
        " released_at_ms = CASE WHEN :s = 'released' THEN :t ELSE released_at_ms END"
        f" WHERE id = :id AND state IN ({states})",
        params,
    )
    return n == 1


# -- usage ----------------------------------------------------------------------------------------

_SPANS = (
    "SELECT r.id, r.node_id, r.tenant, r.device_class, r.gpus, r.placed_at_ms, r.ended_at_ms,"
    " (SELECT MIN(b.start_ms) FROM device_bookings b WHERE b.reservation_id = r.id AND b.node_id = r.node_id)"
    " AS window_start_ms,"
    " (SELECT CASE WHEN COUNT(*) = COUNT(b.end_ms) THEN MAX(b.end_ms) END FROM device_bookings b"
    " WHERE b.reservation_id = r.id AND b.node_id = r.node_id) AS window_end_ms,"
    " (SELECT MAX(u.end_ms) FROM usage_windows u WHERE u.reservation_id = r.id) AS flushed_ms"
    " FROM reservations r WHERE r.placed_at_ms IS NOT NULL AND r.node_id IS NOT NULL"
)


async def unflushed_spans(tx: Tx, reservation_id: str = "") -> list[Row]:
    """Booked reservations whose usage is not all flushed yet (still running, or ended past the last window),
    with their booking interval and where their last committed window ended (`flushed_ms`)."""
    where = " AND r.id = :r" if reservation_id else ""
    return await tx.fetchall(
        f"SELECT * FROM ({_SPANS}{where}) s"
        " WHERE s.ended_at_ms IS NULL OR ((s.flushed_ms IS NULL OR s.flushed_ms < s.ended_at_ms)"
        # Usage starts at the later of the window's start and the placement: one that ended before it started
        # (released before its window began) has nothing to flush, and leaves the scan.
        " AND s.ended_at_ms > CASE WHEN s.window_start_ms > s.placed_at_ms THEN s.window_start_ms"
        " ELSE s.placed_at_ms END) ORDER BY s.id",
        {"r": reservation_id} if reservation_id else {},
    )


_ATTEMPT_SPANS = (
    "SELECT a.reservation_id AS id, a.node_id, r.tenant, r.device_class, r.gpus, a.usage_start_ms AS placed_at_ms,"
    " a.usage_end_ms AS ended_at_ms, NULL AS window_start_ms, NULL AS window_end_ms, NULL AS flushed_ms"
    " FROM placement_attempts a JOIN reservations r ON r.id = a.reservation_id"
)


async def billing_spans(tx: Tx) -> list[Row]:
    """Every span usage is billed on, flushed or not: each booked reservation's current placement, and each
    placement a node refused (from the placement to the refusal), in the shape `unflushed_spans` returns."""
    return await tx.fetchall(f"{_SPANS} UNION ALL {_ATTEMPT_SPANS} ORDER BY id, placed_at_ms")


async def billing_spans_of(tx: Tx, reservation_id: str) -> list[Row]:
    """The current placement's span of one reservation (`unflushed_spans`' shape, flushed or not)."""
    return await tx.fetchall(f"{_SPANS} AND r.id = :r", {"r": reservation_id})


async def record_refused_attempt(
    tx: Tx,
    *,
    reservation_id: str,
    node_id: str,
    allocation_id: str,
    usage_start_ms: int,
    usage_end_ms: int,
    reason: str,
    message: str,
) -> int:
    """Keep a placement the node refused, for audit and billing; returns its attempt number (1, 2, ...)."""
    n = await tx.fetchval("SELECT COUNT(*) FROM placement_attempts WHERE reservation_id = :r", {"r": reservation_id})
    attempt = int(n or 0) + 1
    await tx.execute(
        "INSERT INTO placement_attempts (reservation_id, attempt, node_id, allocation_id, usage_start_ms,"
        " usage_end_ms, reason, message) VALUES (:r, :n, :node, :a, :s, :e, :why, :m)",
        {
            "r": reservation_id,
            "n": attempt,
            "node": node_id,
            "a": allocation_id,
            "s": usage_start_ms,
            "e": usage_end_ms,
            "why": reason,
            "m": message,
        },
    )
    return attempt


async def attempts_of(tx: Tx, reservation_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT * FROM placement_attempts WHERE reservation_id = :r ORDER BY attempt", {"r": reservation_id}
    )


async def requeue_refused(tx: Tx, reservation_id: str, *, allocation_id: str, avoid_json: str, reason: str) -> bool:
    """A placed reservation its node refused goes back to the queue, unbooked, under a new allocation id
    (the refused one stays the old node's), never to be offered to the nodes in `avoid_json` again."""
    n = await tx.execute(
        "UPDATE reservations SET state = 'pending', node_id = NULL, allocation_id = :a, avoid_nodes = :v,"
        " reason = :why, placed_at_ms = NULL, ended_at_ms = NULL, bound_at_ms = NULL, generation = 0,"
        " cpu_numa = '[]', mem_numa = '[]' WHERE id = :id AND state = 'placed'",
        {"a": allocation_id, "v": avoid_json, "why": reason, "id": reservation_id},
    )
    return n == 1


async def insert_usage_window(
    tx: Tx, *, reservation_id: str, start_ms: int, end_ms: int, node_id: str, tenant: str, device_class: str, atoms: int
) -> None:
    """A closed usage window; a retried flush writes the same key and inserts nothing."""
    await tx.execute(
        "INSERT INTO usage_windows (reservation_id, start_ms, end_ms, node_id, tenant, device_class, atoms)"
        " VALUES (:r, :s, :e, :n, :t, :c, :a) ON CONFLICT (reservation_id, start_ms) DO NOTHING",
        {"r": reservation_id, "s": start_ms, "e": end_ms, "n": node_id, "t": tenant, "c": device_class, "a": atoms},
    )


async def usage_windows(tx: Tx, since_ms: int | None, until_ms: int | None) -> list[Row]:
    """The flushed windows that meet `[since_ms, until_ms)` (None: unbounded)."""
    return await tx.fetchall(
        "SELECT * FROM usage_windows WHERE (CAST(:u AS BIGINT) IS NULL OR start_ms < :u)"
        " AND (CAST(:s AS BIGINT) IS NULL OR end_ms > :s) ORDER BY reservation_id, start_ms",
        {"s": since_ms, "u": until_ms},
    )


_USAGE_KEYS = {"reservation": "reservation_id", "tenant": "tenant", "node": "node_id"}


async def usage_sums(tx: Tx, since_ms: int | None, until_ms: int | None, by: str) -> list[Row]:
    """The flushed windows summed in the store: per key, atoms x the milliseconds of each window inside
    `[since, until)` (prorated at the edges, as `usage_windows.aggregate` does) and how many windows."""
    key = _USAGE_KEYS[by]
    lo = "CASE WHEN CAST(:s AS BIGINT) IS NULL OR start_ms > :s THEN start_ms ELSE :s END"
    hi = "CASE WHEN CAST(:u AS BIGINT) IS NULL OR end_ms < :u THEN end_ms ELSE :u END"
    return await tx.fetchall(
        f"SELECT {key} AS key, SUM(atoms * (({hi}) - ({lo}))) AS atom_ms, COUNT(*) AS windows FROM usage_windows"
        " WHERE (CAST(:u AS BIGINT) IS NULL OR start_ms < :u) AND (CAST(:s AS BIGINT) IS NULL OR end_ms > :s)"
        f" GROUP BY {key} ORDER BY {key}",
        {"s": since_ms, "u": until_ms},
    )


async def usage_sums_by_class(tx: Tx, since_ms: int | None, until_ms: int | None, by: str) -> list[Row]:
    """`usage_sums` per key and device class, and per reservation for `gpu.mig` (`mig_reservation`, "" for
    the other classes): the MIG part is cut by profile afterwards (bc.control.capacity.usage_classes)."""
    key = _USAGE_KEYS[by]
    lo = "CASE WHEN CAST(:s AS BIGINT) IS NULL OR start_ms > :s THEN start_ms ELSE :s END"
    hi = "CASE WHEN CAST(:u AS BIGINT) IS NULL OR end_ms < :u THEN end_ms ELSE :u END"
    mig = "CASE WHEN device_class = 'gpu.mig' THEN reservation_id ELSE '' END"
    return await tx.fetchall(
        f"SELECT {key} AS key, device_class, {mig} AS mig_reservation,"
        f" SUM(atoms * (({hi}) - ({lo}))) AS atom_ms, COUNT(*) AS windows FROM usage_windows"
        " WHERE (CAST(:u AS BIGINT) IS NULL OR start_ms < :u) AND (CAST(:s AS BIGINT) IS NULL OR end_ms > :s)"
        f" GROUP BY {key}, device_class, {mig} ORDER BY {key}, device_class, {mig}",
        {"s": since_ms, "u": until_ms},
    )


async def mig_bookings(tx: Tx, reservation_ids: list[str]) -> list[Row]:
    """The MIG atoms these reservations booked on their node, with that node's inventory (JSON) to name
    each instance's profile."""
    if not reservation_ids:
        return []
    names = {f"r{i}": r for i, r in enumerate(reservation_ids)}
    return await tx.fetchall(
        "SELECT b.reservation_id, b.atom_id, b.gpu_uuid, n.inventory FROM device_bookings b"
        " JOIN reservations r ON r.id = b.reservation_id AND r.node_id = b.node_id"
        " LEFT JOIN nodes n ON n.node_id = b.node_id"
        f" WHERE b.device_class = 'gpu.mig' AND b.reservation_id IN ({', '.join(':' + k for k in names)})"
        " ORDER BY b.reservation_id, b.atom_id",
        names,
    )


async def set_usage_end(tx: Tx, reservation_id: str, at_ms: int) -> None:
    """Usage stops here (a release or a failure committed): kept if an earlier end is already set."""
    await tx.execute(
        "UPDATE reservations SET ended_at_ms = :t WHERE id = :id AND (ended_at_ms IS NULL OR ended_at_ms > :t)",
        {"t": at_ms, "id": reservation_id},
    )
