"""The command queue's SQL: enqueue, dispatch, updates from the node, cancel flags and the sweeper.

Every state change is guarded by the state it expects to leave (`AND state =
:from`, or `IN` a set of them), so two writers that race on one command (the
gateway applying a result, the sweeper timing it out, an operator cancelling
it) cannot both win: the loser's UPDATE matches nothing and returns False,
and the caller re-reads. Updates that come from a node are also scoped to
that node (`AND node_id = :node`), so one node can never move another node's
command. `mark_dispatched` is fenced twice: the command must still be
`pending`, and the session epoch it is sent under must be the node's open
session.

The body bytes are written once by `insert` and never rewritten here.
"""

from __future__ import annotations

from collections.abc import Iterable

from bc.store.base import Row, Tx

IN_FLIGHT: tuple[str, ...] = ("dispatched", "acked", "running")


def _in(name: str, values: Iterable[str], params: dict[str, object]) -> str:
    """`:name0, :name1, …` for an IN list, filling `params`."""
    keys = []
    for i, v in enumerate(values):
        params[f"{name}{i}"] = v
        keys.append(f":{name}{i}")
    return ", ".join(keys)


# -- enqueue ---------------------------------------------------------------------


async def next_seq(tx: Tx, node_id: str) -> int | None:
    """Take the node's next command seq, raising `nodes.next_cmd_seq` in the same transaction.

    None when the node does not exist. The UPDATE holds the node row until commit,
    so two enqueues for one node never take the same seq.
    """
    v = await tx.fetchval(
        "UPDATE nodes SET next_cmd_seq = next_cmd_seq + 1 WHERE node_id = :n RETURNING next_cmd_seq - 1",
        {"n": node_id},
    )
    return None if v is None else int(v)


async def set_next_seq(tx: Tx, node_id: str, next_seq: int) -> None:
    """After seqs were handed out from one `next_seq` (one enqueue call, many commands for the node): the
    node's next one. The row is still held by that `next_seq`'s UPDATE, so nobody took a seq in between."""
    await tx.execute("UPDATE nodes SET next_cmd_seq = :s WHERE node_id = :n", {"s": next_seq, "n": node_id})


async def insert(
    tx: Tx,
    *,
    id_: str,
    node_id: str,
    seq: int,
    kind: str,
    lane: str,
    body: bytes,
    signature: bytes | None,
    signer_key_id: str = "",
    not_before_ms: int,
    not_after_ms: int,
    min_generation: int,
    idempotency_key: str,
    retry_safe: bool,
    self_terminating: bool,
    attested: bool,
    batch_id: str,
    now_ms: int,
    held: bool = False,
    requested_by: str = "",
    preapproval: int = 0,
) -> Row | None:
    """Insert a pending command and return its row; None when the node already has one with this idempotency
    key (nothing inserted). The row comes back with the INSERT (`RETURNING *`), as `get` would read it."""
    return await tx.fetchone(
        "INSERT INTO commands (id, node_id, seq, kind, lane, body, signature, signer_key_id, state, not_before_ms,"
        " not_after_ms, held,"
        " min_generation, idempotency_key, retry_safe, self_terminating, attested, batch_id, requested_by,"
        " preapproval, created_at_ms, updated_at_ms)"
        " VALUES (:id, :n, :seq, :kind, :lane, :body, :sig, :signer, 'pending', :nb, :na, :held, :mg, :key, :rs, :st,"
        " :at, :batch, :rb, :pre, :t, :t)"
        " ON CONFLICT (node_id, idempotency_key) DO NOTHING RETURNING *",
        {
            "id": id_,
            "n": node_id,
            "seq": seq,
            "kind": kind,
            "lane": lane,
            "body": body,
            "sig": signature,
            "signer": signer_key_id,
            "held": int(held),
            "nb": not_before_ms,
            "na": not_after_ms,
            "mg": min_generation,
            "key": idempotency_key,
            "rs": int(retry_safe),
            "st": int(self_terminating),
            "at": int(attested),
            "batch": batch_id,
            "rb": requested_by,
            "pre": preapproval,
            "t": now_ms,
        },
    )


# -- reads -----------------------------------------------------------------------


async def get(tx: Tx, id_: str) -> Row | None:
    return await tx.fetchone("SELECT * FROM commands WHERE id = :id", {"id": id_})


async def get_for_node(tx: Tx, id_: str, node_id: str, lock: str = "") -> Row | None:
    """The command only if it belongs to `node_id`: what a node's session may see and move."""
    return await tx.fetchone(
        f"SELECT * FROM commands WHERE id = :id AND node_id = :n {lock}", {"id": id_, "n": node_id}
    )


async def by_idempotency_key(tx: Tx, node_id: str, key: str) -> Row | None:
    return await tx.fetchone(
        "SELECT * FROM commands WHERE node_id = :n AND idempotency_key = :k", {"n": node_id, "k": key}
    )


async def list_(tx: Tx, *, node_id: str = "", state: str = "", limit: int = 100) -> list[Row]:
    """Newest first; within one millisecond a node's commands by descending seq."""
    return await tx.fetchall(
        "SELECT * FROM commands WHERE (:n = '' OR node_id = :n) AND (:s = '' OR state = :s)"
        " ORDER BY created_at_ms DESC, node_id, seq DESC LIMIT :limit",
        {"n": node_id, "s": state, "limit": limit},
    )


DISPATCH_BATCH = 1000
"""At most this many pending commands are read (and on PostgreSQL locked) per dispatch transaction."""


async def pending_for_node(tx: Tx, node_id: str, now_ms: int, limit: int = DISPATCH_BATCH) -> list[Row]:
    """Dispatchable commands in seq order: pending, inside their [not_before, not_after) window."""
    return await tx.fetchall(
        "SELECT * FROM commands WHERE node_id = :n AND state = 'pending' AND held = 0"
        " AND not_before_ms <= :now AND not_after_ms > :now ORDER BY seq LIMIT :limit",
        {"n": node_id, "now": now_ms, "limit": limit},
    )


async def in_flight_for_node(tx: Tx, node_id: str) -> list[Row]:
    """Dispatched, acked or running commands in seq order: what a new session replays."""
    params: dict[str, object] = {"n": node_id}
    return await tx.fetchall(
        f"SELECT * FROM commands WHERE node_id = :n AND state IN ({_in('s', IN_FLIGHT, params)}) ORDER BY seq",
        params,
    )


# -- dispatch --------------------------------------------------------------------


async def mark_dispatched(tx: Tx, id_: str, node_id: str, epoch: int, now_ms: int, gateway_id: str = "") -> bool:
    """`pending` → `dispatched` under `epoch`; False if it is no longer pending or the session moved on.

    With `gateway_id`, also only while the session row still routes the node to that gateway: a zombie
    gateway's dispatch matches nothing.
    """
    n = await tx.execute(
        "UPDATE commands SET state = 'dispatched', dispatched_epoch = :e, attempt = attempt + 1, updated_at_ms = :t"
        " WHERE id = :id AND node_id = :n AND state = 'pending'"
        " AND EXISTS (SELECT 1 FROM node_sessions s WHERE s.node_id = :n AND s.session_epoch = :e AND s.open = 1"
        "  AND (:g = '' OR s.gateway_id = :g))",
        {"id": id_, "n": node_id, "e": epoch, "t": now_ms, "g": gateway_id},
    )
    return n == 1


async def mark_dispatched_routed(
    tx: Tx, ids: Iterable[str], gateway_id: str, now_ms: int, dialect: str
) -> dict[str, tuple[str, int, int]]:
    """The gateway's batched mark: each `pending` command in `ids` → `dispatched` under its node's open session,
    only while that session is routed to `gateway_id`. Returns `{id: (node_id, epoch, attempt)}` for the rows it
    moved.

    The caller read the session rows in this transaction (share-locked on PostgreSQL; SQLite has one writer)
    and checked their epochs against its own, so the epoch written is the one it checked. On PostgreSQL the ids
    are one array parameter: one statement text, prepared once, whatever their number.
    """
    params: dict[str, object] = {"g": gateway_id, "t": now_ms}
    if dialect == "postgres":
        params["ids"] = list(ids)
        which = "id = ANY(CAST(:ids AS text[]))" if params["ids"] else ""
    else:
        listed = _in("i", ids, params)
        which = f"id IN ({listed})" if listed else ""
    if not which:
        return {}
    rows = await tx.fetchall(
        "UPDATE commands SET state = 'dispatched', attempt = attempt + 1, updated_at_ms = :t,"
        " dispatched_epoch = (SELECT s.session_epoch FROM node_sessions s WHERE s.node_id = commands.node_id)"
        f" WHERE {which} AND state = 'pending'"
        " AND EXISTS (SELECT 1 FROM node_sessions s WHERE s.node_id = commands.node_id AND s.open = 1"
        "  AND s.gateway_id = :g)"
        " RETURNING id, node_id, dispatched_epoch, attempt",
        params,
    )
    return {str(r["id"]): (str(r["node_id"]), int(r["dispatched_epoch"]), int(r["attempt"])) for r in rows}


async def mark_resent(tx: Tx, id_: str, node_id: str, epoch: int, now_ms: int) -> bool:
    """An in-flight command replayed on a newer session: its epoch moves and its attempt counts up."""
    params: dict[str, object] = {"id": id_, "n": node_id, "e": epoch, "t": now_ms}
    n = await tx.execute(
        "UPDATE commands SET dispatched_epoch = :e, attempt = attempt + 1, updated_at_ms = :t"
        f" WHERE id = :id AND node_id = :n AND state IN ({_in('s', IN_FLIGHT, params)})"
        " AND (dispatched_epoch IS NULL OR dispatched_epoch < :e)",
        params,
    )
    return n == 1


# -- state changes ---------------------------------------------------------------


async def advance(tx: Tx, id_: str, node_id: str, *, expected: str, state: str, boot_id: str, now_ms: int) -> bool:
    """A non-terminal move reported by the node (`acked`, `running`), guarded by the expected state."""
    n = await tx.execute(
        "UPDATE commands SET state = :s, boot_id = :b, updated_at_ms = :t"
        " WHERE id = :id AND node_id = :n AND state = :from",
        {"s": state, "b": boot_id, "t": now_ms, "id": id_, "n": node_id, "from": expected},
    )
    return n == 1


async def report(
    tx: Tx,
    id_: str,
    node_id: str,
    *,
    expected: str,
    state: str,
    boot_id: str,
    now_ms: int,
    settled: tuple[str, str, bytes, bytes] | None = None,
    not_kinds: Iterable[str] = (),
) -> str | None:
    """A node's report applied in one statement: the command moves to `state` if it belongs to `node_id`, is in
    `expected` and its kind is none of `not_kinds`. One state, not a list: `state IN (…)` cost SQLite about as
    much as the read it saves (25-38 us against 18-30, measured on the commands table).
    `settled`: `(reason, message, result, node_sig)` of a terminal report, stored as `settle` stores them.

    Returns the command's kind when it moved, None when nothing matched (unknown, another node's, in another
    state, or a kind the caller must read first): the caller then reads the row to learn which.
    """
    params: dict[str, object] = {"id": id_, "n": node_id, "s": state, "b": boot_id, "t": now_ms}
    sets = "state = :s, boot_id = :b, updated_at_ms = :t"
    if settled is not None:
        params["r"], params["m"], params["res"], params["sig"] = settled
        sets += ", reason = :r, message = :m, result = :res, node_sig = :sig, settled_at_ms = :t"
    params["from"] = expected
    where = "id = :id AND node_id = :n AND state = :from"
    for i, kind in enumerate(not_kinds):
        # `<>` each, not `NOT IN (…)`: SQLite built the list into a table on every run (61-88 us a statement
        # against 26-31, measured on the commands table).
        params[f"k{i}"] = kind
        where += f" AND kind <> :k{i}"
    v = await tx.fetchval(f"UPDATE commands SET {sets} WHERE {where} RETURNING kind", params)
    return None if v is None else str(v)


async def settle(
    tx: Tx,
    id_: str,
    *,
    expected: str,
    state: str,
    reason: str,
    message: str,
    now_ms: int,
    node_id: str | None = None,
    result: bytes | None = None,
    node_sig: bytes | None = None,
    boot_id: str | None = None,
) -> bool:
    """Move to a terminal state from `expected`; the node's result fields are stored as given.

    `node_id` scopes the write to one node (updates from a session); the server's own
    settlements (sweeper, cancel) leave it None. `boot_id` None keeps the stored one.
    """
    params: dict[str, object] = {
        "id": id_,
        "from": expected,
        "s": state,
        "r": reason,
        "m": message,
        "res": result,
        "sig": node_sig,
        "t": now_ms,
    }
    sets = "state = :s, reason = :r, message = :m, result = :res, node_sig = :sig, updated_at_ms = :t"
    sets += ", settled_at_ms = :t"
    if boot_id is not None:
        sets += ", boot_id = :b"
        params["b"] = boot_id
    where = "id = :id AND state = :from"
    if node_id is not None:
        where += " AND node_id = :n"
        params["n"] = node_id
    return await tx.execute(f"UPDATE commands SET {sets} WHERE {where}", params) == 1


# -- cancel ----------------------------------------------------------------------


async def request_cancel(tx: Tx, id_: str, reason: str, now_ms: int) -> bool:
    """Flag an in-flight command for a `Cancel`; False if it is not in flight or already flagged."""
    params: dict[str, object] = {"id": id_, "r": reason, "t": now_ms}
    n = await tx.execute(
        "UPDATE commands SET cancel_requested_at_ms = :t, cancel_reason = :r, updated_at_ms = :t"
        f" WHERE id = :id AND cancel_requested_at_ms IS NULL AND state IN ({_in('s', IN_FLIGHT, params)})",
        params,
    )
    return n == 1


async def cancel_pending(tx: Tx, id_: str, reason: str, now_ms: int) -> bool:
    """A cancel before dispatch wins: `pending` → `cancelled` at once, never sent."""
    n = await tx.execute(
        "UPDATE commands SET state = 'cancelled', reason = 'cancelled', message = :r, cancel_reason = :r,"
        " cancel_requested_at_ms = :t, updated_at_ms = :t, settled_at_ms = :t"
        " WHERE id = :id AND state = 'pending'",
        {"id": id_, "r": reason, "t": now_ms},
    )
    return n == 1


async def cancels_to_send(tx: Tx, node_id: str, epoch: int) -> list[Row]:
    """In-flight commands whose cancel has not yet been sent on this session, in seq order.

    A cancel goes out once per session and again after every reconnect, until the node settles it.
    """
    params: dict[str, object] = {"n": node_id, "e": epoch}
    return await tx.fetchall(
        f"SELECT * FROM commands WHERE node_id = :n AND state IN ({_in('s', IN_FLIGHT, params)})"
        " AND cancel_requested_at_ms IS NOT NULL AND (cancel_sent_epoch IS NULL OR cancel_sent_epoch <> :e)"
        " ORDER BY seq",
        params,
    )


async def mark_cancel_sent(tx: Tx, id_: str, node_id: str, epoch: int) -> bool:
    n = await tx.execute(
        "UPDATE commands SET cancel_sent_epoch = :e WHERE id = :id AND node_id = :n",
        {"e": epoch, "id": id_, "n": node_id},
    )
    return n == 1


# -- the sweeper -----------------------------------------------------------------


async def pending_past(tx: Tx, now_ms: int, limit: int = 1000) -> list[Row]:
    """Pending commands whose `not_after` has come: they must never start."""
    return await tx.fetchall(
        "SELECT id, node_id, kind, state, not_after_ms FROM commands"
        " WHERE state = 'pending' AND not_after_ms <= :now ORDER BY not_after_ms LIMIT :limit",
        {"now": now_ms, "limit": limit},
    )


async def in_flight_past(tx: Tx, cutoff_ms: int, limit: int = 1000) -> list[Row]:
    """In-flight commands whose `not_after` is at or before `cutoff_ms`.

    A superset of the timed-out ones: each kind's timeout is added by the caller,
    which passes `now - the shortest timeout` to keep the set small.
    """
    params: dict[str, object] = {"c": cutoff_ms, "limit": limit}
    return await tx.fetchall(
        "SELECT id, node_id, kind, state, not_after_ms FROM commands"
        f" WHERE state IN ({_in('s', IN_FLIGHT, params)}) AND not_after_ms <= :c ORDER BY not_after_ms LIMIT :limit",
        params,
    )
