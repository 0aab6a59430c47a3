"""Nodes, their specs and generations, and the session routing table.

Writes the reference fences carry their fence here, in SQL: routing and
liveness writes match `session_epoch = :epoch`, `observed_generation` only
rises (`WHERE observed_generation < :g`). A fenced write that matches nothing
returns False; the caller decides what that means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, cast

from bc.protocol import connectivity as cx
from bc.store import connectivity as cx_sql
from bc.store.base import Row, Tx

# A deleted node is a tombstone (deleted_at_ms set): kept for history, skipped by every live read.
LIVE = "n.deleted_at_ms IS NULL"


async def get(tx: Tx, node_id: str, *, include_deleted: bool = False) -> Row | None:
    """The node with its session; a tombstone only with `include_deleted` (history, `bc nodes --all`)."""
    live = "" if include_deleted else f" AND {LIVE}"
    return await tx.fetchone(
        "SELECT n.*, s.gateway_id, s.session_epoch, s.open AS session_open, s.journal_id, s.boot_id,"
        " s.incarnation_id, s.acked_event_seq FROM nodes n LEFT JOIN node_sessions s USING (node_id)"
        f" WHERE n.node_id = :n{live}",
        {"n": node_id},
    )


async def list_all(tx: Tx, *, include_deleted: bool = False) -> list[Row]:
    live = "" if include_deleted else f" WHERE {LIVE}"
    return await tx.fetchall(
        "SELECT n.*, s.gateway_id, s.session_epoch, s.open AS session_open, s.journal_id, s.boot_id,"
        f" s.incarnation_id, s.acked_event_seq FROM nodes n LEFT JOIN node_sessions s USING (node_id){live}"
        " ORDER BY n.node_id"
    )


LISTED_COLUMNS = (
    "n.node_id, n.role, n.connectivity, n.connectivity_since_ms, n.generation, n.applied_generation,"
    " n.observed_generation, n.last_seen_ms, n.spec_hash, n.applied_spec_hash, n.capabilities, n.labels,"
    " n.cordoned, n.job_hold, n.inventory_hash, s.gateway_id, s.session_epoch, s.journal_id, s.boot_id,"
    " n.identity_generation"
)
"""What a row of the fleet listing shows (`bc.control.reads.views.add_listed_node`): not the spec, its signed
body or the status document, which are most of a row's bytes (a 10,000-node listing read 0.53 s of rows with
them, 0.11 s without, on SQLite), nor the inventory, whose hash tells the listing whether it parsed it already
(`inventories` reads the others); its identity generation picks its certificates (`revocation.cert_states`).
A `ListedRow`, in this order."""

ListedRow = tuple[
    str,  # node_id
    str,  # role
    str,  # connectivity
    int | None,  # connectivity_since_ms
    int,  # generation
    int,  # applied_generation
    int,  # observed_generation
    int | None,  # last_seen_ms
    str,  # spec_hash
    str,  # applied_spec_hash
    str,  # capabilities (JSON)
    str,  # labels (JSON)
    int,  # cordoned
    str | None,  # job_hold
    str,  # inventory_hash
    str | None,  # gateway_id (None: never had a session)
    int | None,  # session_epoch
    str | None,  # journal_id
    str | None,  # boot_id
    int,  # identity_generation
]
"""A row of `list_page`: a tuple, not a dict (the store's `fetchtuples`), which its reader unpacks by position:
making 10,000 dicts was a tenth of the listing's read."""

LISTED_NODE_ID: Final = 0
LISTED_INVENTORY_HASH: Final = 14
LISTED_IDENTITY_GENERATION: Final = 19
"""The positions in a `ListedRow` the listing reads apart from the message (the page's keys, the memo's, the
certificates')."""


INVENTORIES_PER_READ = 1000
"""Node ids one `inventories` statement names at most (SQLite binds up to 32,766 parameters)."""


async def inventories(tx: Tx, node_ids: list[str]) -> dict[str, str]:
    """The inventories (protobuf JSON) of these nodes, by node id."""
    out: dict[str, str] = {}
    for start in range(0, len(node_ids), INVENTORIES_PER_READ):
        chunk = node_ids[start : start + INVENTORIES_PER_READ]
        names = ", ".join(f":n{i}" for i in range(len(chunk)))
        rows = await tx.fetchall(
            f"SELECT node_id, inventory FROM nodes WHERE node_id IN ({names})",
            {f"n{i}": n for i, n in enumerate(chunk)},
        )
        out.update((str(r["node_id"]), str(r["inventory"] or "{}")) for r in rows)
    return out


async def list_page(
    tx: Tx, *, after: str = "", limit: int | None = None, include_deleted: bool = False
) -> list[ListedRow]:
    """The listing's rows of the nodes whose id sorts after `after` (keyset: the primary key's index), at most
    `limit` of them (all with None), in id order."""
    where = ["n.node_id > :after"]
    if not include_deleted:
        where.append(LIVE)
    params: dict[str, object] = {"after": after}
    tail = ""
    if limit is not None:
        tail, params["limit"] = " LIMIT :limit", limit
    rows = await tx.fetchtuples(
        f"SELECT {LISTED_COLUMNS} FROM nodes n LEFT JOIN node_sessions s USING (node_id)"
        f" WHERE {' AND '.join(where)} ORDER BY n.node_id{tail}",
        params,
    )
    return cast(list[ListedRow], rows)


async def revive(tx: Tx, node_id: str, now_ms: int) -> bool:
    """A tombstoned id joins again: live, uncordoned, `new` (`cx.REVIVE`); its history stays. True when it was
    a tombstone."""
    n = await tx.execute(
        f"UPDATE nodes SET deleted_at_ms = NULL, cordoned = 0, job_hold = NULL, {cx_sql.node_set(cx.REVIVE)}"
        " WHERE node_id = :n AND deleted_at_ms IS NOT NULL",
        {"n": node_id, **cx_sql.node_params(cx.REVIVE, now_ms)},
    )
    return n == 1


# A node is revoked when its current identity has certificates and none of them is live
# (the same rule `bc nodes` shows); a node with no certificate row at all is not revoked.
_REVOKED = (
    "(EXISTS (SELECT 1 FROM node_certs c WHERE c.node_id = n.node_id"
    " AND c.identity_generation = n.identity_generation)"
    " AND NOT EXISTS (SELECT 1 FROM node_certs c WHERE c.node_id = n.node_id"
    " AND c.identity_generation = n.identity_generation AND c.revoked_at_ms IS NULL))"
)


async def placement_facts(tx: Tx, node_id: str | None = None) -> list[Row]:
    """What placement needs to know of each node (or of one): role, cordon, connectivity, revoked, inventory."""
    where = f"WHERE {LIVE}" + (" AND n.node_id = :n" if node_id is not None else "")
    return await tx.fetchall(
        # A job's transient hold (a drain, a reboot) keeps new holds off as a cordon does.
        "SELECT n.node_id, n.role, CASE WHEN n.cordoned <> 0 OR n.job_hold IS NOT NULL THEN 1 ELSE 0 END AS cordoned,"
        " n.connectivity, n.inventory,"
        f" CASE WHEN {_REVOKED} THEN 1 ELSE 0 END AS revoked FROM nodes n {where} ORDER BY n.node_id",
        {"n": node_id} if node_id is not None else {},
    )


async def placement_nodes(tx: Tx) -> list[Row]:
    """`placement_facts` of every live node of role `node` with its job's hold, labels and capabilities, in one read
    the placement pass makes on every pass. The inventory's text comes only where no `inventory_hash` names it:
    the pass keeps each node's text by its hash and reads a changed one with `inventory_with_hash`."""
    return await tx.fetchall(
        "SELECT n.node_id, CASE WHEN n.cordoned <> 0 OR n.job_hold IS NOT NULL THEN 1 ELSE 0 END AS cordoned,"
        " n.connectivity, n.inventory_hash, CASE WHEN n.inventory_hash = '' THEN n.inventory END AS inventory,"
        " n.job_hold, n.labels, n.capabilities,"
        f" CASE WHEN {_REVOKED} THEN 1 ELSE 0 END AS revoked FROM nodes n WHERE {LIVE} AND n.role = 'node'"
        " ORDER BY n.node_id"
    )


async def inventory_with_hash(tx: Tx, node_id: str) -> Row | None:
    """A node's inventory text with the hash it was written with (one statement: the two always agree)."""
    return await tx.fetchone("SELECT inventory, inventory_hash FROM nodes WHERE node_id = :n", {"n": node_id})


async def generation(tx: Tx, node_id: str) -> int | None:
    v = await tx.fetchval("SELECT generation FROM nodes WHERE node_id = :n", {"n": node_id})
    return None if v is None else int(v)


async def set_labels(tx: Tx, node_id: str, labels_json: str) -> None:
    await tx.execute("UPDATE nodes SET labels = :l WHERE node_id = :n", {"l": labels_json, "n": node_id})


async def role_and_labels(tx: Tx, node_id: str) -> Row | None:
    return await tx.fetchone(
        "SELECT role, labels FROM nodes WHERE node_id = :n AND deleted_at_ms IS NULL", {"n": node_id}
    )


async def ensure(tx: Tx, node_id: str, role: str, now_ms: int) -> bool:
    """Create the node row if absent; True when it was created."""
    n = await tx.execute(
        "INSERT INTO nodes (node_id, role, created_at_ms) VALUES (:n, :r, :t) ON CONFLICT (node_id) DO NOTHING",
        {"n": node_id, "r": role, "t": now_ms},
    )
    return n == 1


async def spec_for_update(tx: Tx, node_id: str, lock: str = "") -> Row | None:
    return await tx.fetchone(
        "SELECT node_id, spec, spec_hash, generation, spec_body, labels FROM nodes"
        f" WHERE node_id = :n AND deleted_at_ms IS NULL {lock}",
        {"n": node_id},
    )


async def write_spec(
    tx: Tx,
    node_id: str,
    generation: int,
    spec: str,
    spec_hash: str,
    body: bytes,
    signature: bytes | None,
    key_id: str = "",
    *,
    sign_pending: bool = False,
) -> None:
    """Store a new generation with its encoded body; every bump rewrites body, signature and signer (and
    whether it waits for a key-holding process to sign it)."""
    await tx.execute(
        "UPDATE nodes SET spec = :s, spec_hash = :h, spec_body = :b, spec_signature = :sig, spec_key_id = :k,"
        " spec_sign_pending = :p, generation = :g WHERE node_id = :n",
        {
            "s": spec,
            "h": spec_hash,
            "b": body,
            "sig": signature,
            "k": key_id,
            "p": int(sign_pending),
            "g": generation,
            "n": node_id,
        },
    )


async def spec_delivery(tx: Tx, node_id: str) -> Row | None:
    return await tx.fetchone(
        "SELECT generation, spec_hash, spec_body, spec_signature, spec_key_id, spec_sign_pending FROM nodes"
        " WHERE node_id = :n",
        {"n": node_id},
    )


@dataclass(frozen=True)
class SessionOpened:
    epoch: int
    previous_journal_id: str
    previous_boot_id: str
    previous_gateway_id: str
    previous_open: bool
    previous_incarnation_id: str


@dataclass(frozen=True)
class HelloColumns:
    """What a Hello writes on the node's row besides its connectivity, in the same statement (`open_session`)."""

    applied_generation: int
    applied_spec_hash: str
    capabilities_json: str
    labels_json: str | None = None  # None: the labels stay as they are
    inventory_json: str | None = None  # None: the inventory (and its hash) stay as they are
    inventory_hash: str = ""


_SESSION_COLUMNS = ("gateway_id", "session_epoch", "journal_id", "boot_id", "incarnation_id")


async def open_session(
    tx: Tx,
    *,
    node_id: str,
    gateway_id: str,
    journal_id: str,
    boot_id: str,
    incarnation_id: str,
    cert_serial: str,
    now_ms: int,
    node: Row | None = None,
    hello: HelloColumns | None = None,
) -> SessionOpened:
    """Bump the node's session epoch and route it to this gateway (the Hello transaction).

    `node`: the node's row as `get` read it in this transaction (its session's columns are the previous
    session's), which saves reading the session row again. `hello`: the Hello's own columns of the node's
    row, written in the one statement that marks the node connected and seen (the session row this
    transaction just wrote carries the new epoch, so the epoch fence of `set_applied` holds by construction).
    """
    if node is not None and all(c in node for c in _SESSION_COLUMNS):
        prev: Row | None = None if node["session_epoch"] is None else {**node, "open": node["session_open"]}
    else:
        prev = await tx.fetchone("SELECT * FROM node_sessions WHERE node_id = :n", {"n": node_id})
    row = await tx.fetchone(
        "INSERT INTO node_sessions (node_id, gateway_id, session_epoch, open, journal_id, boot_id,"
        " incarnation_id, cert_serial, acked_event_seq, opened_at_ms)"
        " VALUES (:n, :g, 1, 1, :j, :b, :i, :c, 0, :t)"
        " ON CONFLICT (node_id) DO UPDATE SET gateway_id = excluded.gateway_id,"
        " session_epoch = node_sessions.session_epoch + 1, open = 1, journal_id = excluded.journal_id,"
        " boot_id = excluded.boot_id, incarnation_id = excluded.incarnation_id,"
        " cert_serial = excluded.cert_serial,"
        " acked_event_seq = CASE WHEN node_sessions.journal_id = excluded.journal_id"
        "   THEN node_sessions.acked_event_seq ELSE 0 END,"
        " opened_at_ms = excluded.opened_at_ms, closed_at_ms = NULL"
        " RETURNING session_epoch",
        {
            "n": node_id,
            "g": gateway_id,
            "j": journal_id,
            "b": boot_id,
            "i": incarnation_id,
            "c": cert_serial,
            "t": now_ms,
        },
    )
    assert row is not None
    # The table's Hello (connected; `since` kept when it already was) and the liveness stamp in one statement
    # (every SET reads the old row).
    sets = f"{cx_sql.node_set(cx.HELLO)}, last_seen_ms = :t"
    params: dict[str, object] = {"n": node_id, **cx_sql.node_params(cx.HELLO, now_ms)}
    if hello is not None:
        sets += ", applied_generation = :ag, applied_spec_hash = :ah, capabilities = :caps"
        params.update(ag=hello.applied_generation, ah=hello.applied_spec_hash, caps=hello.capabilities_json)
        if hello.labels_json is not None:
            sets += ", labels = :labels"
            params["labels"] = hello.labels_json
        if hello.inventory_json is not None:
            sets += ", inventory = :inv, inventory_hash = :invh"
            params.update(inv=hello.inventory_json, invh=hello.inventory_hash)
    await tx.execute(f"UPDATE nodes SET {sets} WHERE node_id = :n", params)
    return SessionOpened(
        epoch=int(row["session_epoch"]),
        previous_journal_id=str(prev["journal_id"]) if prev else "",
        previous_boot_id=str(prev["boot_id"]) if prev else "",
        previous_gateway_id=str(prev["gateway_id"]) if prev else "",
        previous_open=bool(prev["open"]) if prev else False,
        previous_incarnation_id=str(prev["incarnation_id"]) if prev else "",
    )


async def set_connectivity(tx: Tx, node_id: str, state: str, now_ms: int, reason: str = "") -> bool:
    """Put the node in `state` outright, outside the table (`bc.protocol.connectivity`): a test's setup of a
    node in a given state, never a product write (those name their event: `open_session`, `close_session`,
    `mark_unreachable`, the tombstone and the revival). True when it changed."""
    n = await tx.execute(
        "UPDATE nodes SET connectivity = :s, connectivity_since_ms = :t, connectivity_reason = :r"
        " WHERE node_id = :n AND connectivity <> :s",
        {"s": state, "t": now_ms, "n": node_id, "r": reason},
    )
    return n == 1


async def mark_unreachable(tx: Tx, node_id: str, now_ms: int) -> bool:
    """The table's `GIVE_UP` (`disconnected` → `unreachable`); False when the node is no longer disconnected (a
    Hello on another gateway committed since the sweep read it: the node stays connected)."""
    return await cx_sql.move(tx, node_id, cx.GIVE_UP, now_ms)


async def close_session(tx: Tx, node_id: str, epoch: int, now_ms: int, reason: str = cx.SESSION_CLOSED) -> bool:
    """The table's `CLOSE`, epoch-fenced: a session superseded by a newer Hello closes nothing."""
    n = await tx.execute(
        "UPDATE node_sessions SET open = 0, closed_at_ms = :t WHERE node_id = :n AND session_epoch = :e AND open = 1",
        {"t": now_ms, "n": node_id, "e": epoch},
    )
    if n == 1:
        await cx_sql.move(tx, node_id, cx.CLOSE, now_ms, reason)
    return n == 1


async def session_is_current(tx: Tx, node_id: str, epoch: int) -> bool:
    v = await tx.fetchval(
        "SELECT 1 FROM node_sessions WHERE node_id = :n AND session_epoch = :e AND open = 1",
        {"n": node_id, "e": epoch},
    )
    return v is not None


async def open_epochs(tx: Tx, node_ids: list[str]) -> dict[str, int]:
    """The open session's epoch of each of these nodes that has one (a liveness flush's one read per batch)."""
    out: dict[str, int] = {}
    for i in range(0, len(node_ids), 500):
        chunk = node_ids[i : i + 500]
        params = {f"n{j}": n for j, n in enumerate(chunk)}
        names = ", ".join(f":n{j}" for j in range(len(chunk)))
        rows = await tx.fetchall(
            f"SELECT node_id, session_epoch FROM node_sessions WHERE open = 1 AND node_id IN ({names})", params
        )
        out.update({str(r["node_id"]): int(r["session_epoch"]) for r in rows})
    return out


async def mark_seen(tx: Tx, node_id: str, epoch: int, seen_ms: int) -> bool:
    """Liveness flush: `seen_ms` comes from the store clock minus the gateway-reported age."""
    return await mark_seen_many(tx, [(node_id, epoch, seen_ms)]) == 1


SEEN_ROWS_PER_UPDATE = 300


async def mark_seen_many(tx: Tx, seen: list[tuple[str, int, int]]) -> int:
    """A liveness flush of many sessions, (node_id, epoch, seen_ms) each: one UPDATE per `SEEN_ROWS_PER_UPDATE`
    instead of one a node, with `mark_seen`'s rules for each row (only forward, only under that epoch).
    The rows changed."""
    changed = 0
    for i in range(0, len(seen), SEEN_ROWS_PER_UPDATE):
        chunk = seen[i : i + SEEN_ROWS_PER_UPDATE]
        params: dict[str, object] = {}
        for k, (node_id, epoch, seen_ms) in enumerate(chunk):
            params.update({f"n{k}": node_id, f"e{k}": epoch, f"t{k}": seen_ms})
        values = ", ".join(f"(:n{k}, :e{k}, :t{k})" for k in range(len(chunk)))
        changed += await tx.execute(
            f"UPDATE nodes SET last_seen_ms = v.column3 FROM (VALUES {values}) AS v"
            " WHERE nodes.node_id = v.column1 AND (nodes.last_seen_ms IS NULL OR nodes.last_seen_ms < v.column3)"
            " AND EXISTS (SELECT 1 FROM node_sessions s WHERE s.node_id = v.column1 AND s.session_epoch = v.column2)",
            params,
        )
    return changed


async def set_applied(tx: Tx, node_id: str, epoch: int, generation: int, spec_hash: str) -> None:
    await tx.execute(
        "UPDATE nodes SET applied_generation = :g, applied_spec_hash = :h WHERE node_id = :n"
        " AND EXISTS (SELECT 1 FROM node_sessions s WHERE s.node_id = :n AND s.session_epoch = :e)",
        {"g": generation, "h": spec_hash, "n": node_id, "e": epoch},
    )


async def advance_observed(tx: Tx, node_id: str, generation: int) -> bool:
    """Only forward, whichever session a late report arrives on; never past the newest spec."""
    n = await tx.execute(
        "UPDATE nodes SET observed_generation = :g"
        " WHERE node_id = :n AND observed_generation < :g AND generation >= :g",
        {"g": generation, "n": node_id},
    )
    return n == 1


async def count_by_connectivity(tx: Tx) -> dict[str, int]:
    """Live nodes per connectivity state (`bc serve --otlp-endpoint`'s `bc.server.nodes`)."""
    rows = await tx.fetchall(
        "SELECT connectivity, count(*) AS n FROM nodes WHERE deleted_at_ms IS NULL GROUP BY connectivity"
    )
    return {str(r["connectivity"]): int(r["n"]) for r in rows}


async def status(tx: Tx, node_id: str) -> str | None:
    """The last status document written (JSON), or None."""
    cur = await tx.fetchone("SELECT status FROM nodes WHERE node_id = :n", {"n": node_id})
    return None if cur is None or cur["status"] is None else str(cur["status"])


async def write_status(tx: Tx, node_id: str, status_json: str) -> None:
    await tx.execute("UPDATE nodes SET status = :s WHERE node_id = :n", {"s": status_json, "n": node_id})


async def write_inventory(tx: Tx, node_id: str, inventory_json: str, inventory_hash: str) -> None:
    await tx.execute(
        "UPDATE nodes SET inventory = :i, inventory_hash = :h WHERE node_id = :n",
        {"i": inventory_json, "h": inventory_hash, "n": node_id},
    )


async def write_capabilities(tx: Tx, node_id: str, capabilities_json: str) -> None:
    await tx.execute("UPDATE nodes SET capabilities = :c WHERE node_id = :n", {"c": capabilities_json, "n": node_id})


async def disconnected_before(tx: Tx, cutoff_ms: int, gateway_lost_cutoff_ms: int) -> list[Row]:
    """Nodes disconnected long enough for the table's `GIVE_UP`: a close for one of `cx.LONG_GRACE_REASONS` (a
    gateway's loss) gets the longer grace."""
    long_grace = cx_sql.in_words(cx.LONG_GRACE_REASONS, "connectivity_reason")
    return await tx.fetchall(
        "SELECT node_id, connectivity_since_ms, connectivity_reason FROM nodes"
        f" WHERE {cx_sql.moving(cx.GIVE_UP)} AND ("
        f"  ({long_grace} AND connectivity_since_ms <= :g)"
        f"  OR (NOT {long_grace} AND connectivity_since_ms <= :c))",
        {"c": cutoff_ms, "g": gateway_lost_cutoff_ms},
    )


async def open_sessions_of_dead_gateways(tx: Tx, now_ms: int) -> list[Row]:
    """Open sessions routed to a gateway whose lease has expired (or never existed, or moved to a holder that is
    not that gateway). A gateway's holder is its id, or its id and `@` and its process (bc serve: `id@host:dir`)."""
    return await tx.fetchall(
        "SELECT s.node_id, s.session_epoch, s.gateway_id FROM node_sessions s"
        " LEFT JOIN leases l ON l.name = 'gateway:' || s.gateway_id"
        " WHERE s.open = 1 AND (l.name IS NULL OR l.expires_at_ms < :t OR (l.holder <> s.gateway_id"
        " AND substr(l.holder, 1, length(s.gateway_id) + 1) <> s.gateway_id || '@'))",
        {"t": now_ms},
    )


async def generations_routed_to(tx: Tx, gateway_id: str) -> dict[str, int]:
    """The stored generation of every node with an open session on this gateway (the backstop's one read)."""
    rows = await tx.fetchall(
        "SELECT n.node_id, n.generation FROM node_sessions s JOIN nodes n ON n.node_id = s.node_id"
        " WHERE s.gateway_id = :g AND s.open = 1",
        {"g": gateway_id},
    )
    return {str(r["node_id"]): int(r["generation"]) for r in rows}


async def sessions_routed_to(tx: Tx, gateway_id: str) -> list[Row]:
    return await tx.fetchall(
        "SELECT node_id, session_epoch FROM node_sessions WHERE gateway_id = :g AND open = 1",
        {"g": gateway_id},
    )


async def silent_open_sessions(tx: Tx, seen_before_ms: int) -> list[Row]:
    """Open sessions whose node has not been heard from since the cutoff (a gateway lost track of one)."""
    return await tx.fetchall(
        "SELECT s.node_id, s.session_epoch, s.gateway_id FROM node_sessions s JOIN nodes n USING (node_id)"
        " WHERE s.open = 1 AND n.last_seen_ms < :c",
        {"c": seen_before_ms},
    )
