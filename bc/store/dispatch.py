"""The gateway's own command SQL: the dispatch pass's reads, the Hello resume rules, BUSY requeues.

The rest of the command queue's SQL (enqueue, dispatch marks, cancels, the
sweeper) is in `bc.store.commands`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from bc.store.base import Row, Tx

IN_FLIGHT = ("dispatched", "acked", "running")
_IN_FLIGHT_SQL = "('dispatched', 'acked', 'running')"


async def settle(
    tx: Tx, command_id: str, node_id: str, state: str, reason: str, now_ms: int, from_states: tuple[str, ...]
) -> bool:
    """A server-decided outcome (guards, resume rules); only from the states given."""
    placeholders = ", ".join(f":f{i}" for i in range(len(from_states)))
    params: dict[str, object] = {"id": command_id, "n": node_id, "s": state, "r": reason, "t": now_ms}
    params.update({f"f{i}": v for i, v in enumerate(from_states)})
    n = await tx.execute(
        "UPDATE commands SET state = :s, reason = :r, updated_at_ms = :t, settled_at_ms = :t"
        f" WHERE id = :id AND node_id = :n AND state IN ({placeholders})",
        params,
    )
    return n == 1


async def move_to_epoch(tx: Tx, node_id: str, epoch: int) -> None:
    await tx.execute(
        f"UPDATE commands SET dispatched_epoch = :e WHERE node_id = :n AND state IN {_IN_FLIGHT_SQL}",
        {"n": node_id, "e": epoch},
    )


async def requeue_busy(tx: Tx, command_id: str, node_id: str, retry_at_ms: int, now_ms: int) -> bool:
    """BUSY is not terminal: the command goes back to pending and is sent again after a pause."""
    n = await tx.execute(
        "UPDATE commands SET state = 'pending', dispatched_epoch = NULL, not_before_ms = :r, updated_at_ms = :t"
        " WHERE id = :id AND node_id = :n AND state IN ('dispatched', 'acked')",
        {"id": command_id, "n": node_id, "r": retry_at_ms, "t": now_ms},
    )
    return n == 1


# -- the gateway's batched dispatch (reference "Dispatch") ------------------------

_MINE = "JOIN node_sessions s ON s.node_id = c.node_id WHERE s.gateway_id = :g AND s.open = 1"
_DUE = "c.state = 'pending' AND c.held = 0 AND c.not_before_ms <= :now AND c.not_after_ms > :now"
_CANCEL_UNSENT = (
    f"c.state IN {_IN_FLIGHT_SQL} AND c.cancel_requested_at_ms IS NOT NULL"
    " AND (c.cancel_sent_epoch IS NULL OR c.cancel_sent_epoch <> s.session_epoch)"
)
_PENDING_CANCELLED = "c.state = 'pending' AND c.cancel_requested_at_ms IS NOT NULL"


def _only(nodes: Sequence[str] | None, params: dict[str, object], column: str = "c.node_id") -> str:
    """A pass over some nodes only (those poked since the last pass): their ids as parameters (SQLite)."""
    if nodes is None:
        return ""
    names = [f"o{i}" for i in range(len(nodes))]
    params.update(zip(names, nodes, strict=True))
    return f" AND {column} IN ({', '.join(':' + n for n in names)})" if names else " AND 0 = 1"


# On PostgreSQL every read of a pass is the gateway's session rows (or the listed ones: one array parameter,
# so one statement text whatever the number of nodes, prepared once) and, per session, a LATERAL subquery the
# planner cannot flatten (it has a LIMIT or a GROUP BY): an index seek on that node's commands. A plain join
# let the planner put a scan of `commands` inside a nested loop over the sessions whenever it believed the
# gateway held one session, which is what it believes of a table never analyzed (a new schema; autovacuum off
# or not yet run): a pass over N nodes then read N x the commands table (200 nodes: 40,000 rows, each tested
# against the 200-name IN list; measured 108 ms for the in-flight count alone, 0.6 ms in this shape).
# Two reads look for commands that are rare (a cancelled one still pending, a `not_before` ahead): they start
# from those commands and look each one's session up by its key, in a LATERAL subquery of its own for the same
# reason (the planner cannot then pick the gateway index, which it believes returns one row, for every row).
_PG_MINE = "WHERE s.gateway_id = :g AND s.open = 1"
_PG_SESSION_OF_C = (
    "CROSS JOIN LATERAL (SELECT s.node_id, s.gateway_id, s.open, s.session_epoch FROM node_sessions s"
    " WHERE s.node_id = c.node_id LIMIT 1) s"
)


def _pg_only(nodes: Sequence[str] | None, params: dict[str, object], column: str = "s.node_id") -> str:
    """`_only` on PostgreSQL: the ids as one array parameter."""
    if nodes is None:
        return ""
    params["nodes"] = list(nodes)
    return f" AND {column} = ANY(CAST(:nodes AS text[]))"


async def gateway_has_work(
    tx: Tx, gateway_id: str, now_ms: int, dialect: str, nodes: Sequence[str] | None = None
) -> bool:
    """Whether any node this gateway routes has a command dispatch could send, cancel, or send a Cancel for.

    A read: most passes of a quiet gateway find nothing and take no write lock.
    """
    params: dict[str, object] = {"g": gateway_id, "now": now_ms}
    work = f"(({_DUE}) OR ({_PENDING_CANCELLED}) OR ({_CANCEL_UNSENT}))"
    if dialect == "postgres":
        v = await tx.fetchval(
            "SELECT 1 FROM node_sessions s CROSS JOIN LATERAL (SELECT 1 FROM commands c"
            f" WHERE c.node_id = s.node_id AND {work} LIMIT 1) c {_PG_MINE}{_pg_only(nodes, params)} LIMIT 1",
            params,
        )
    else:
        v = await tx.fetchval(f"SELECT 1 FROM commands c {_MINE}{_only(nodes, params)} AND {work} LIMIT 1", params)
    return v is not None


async def gateway_next_not_before(tx: Tx, gateway_id: str, now_ms: int, dialect: str) -> int | None:
    """The earliest `not_before` still ahead among the pending commands of this gateway's nodes."""
    ahead = "c.state = 'pending' AND c.held = 0 AND c.not_before_ms > :now"
    params: dict[str, object] = {"g": gateway_id, "now": now_ms}
    if dialect == "postgres":
        v = await tx.fetchval(
            f"SELECT MIN(c.not_before_ms) FROM commands c {_PG_SESSION_OF_C} {_PG_MINE} AND {ahead}", params
        )
    else:
        v = await tx.fetchval(  # INDEXED BY: as `gateway_pending_cancelled`'s (migration 0032)
            f"SELECT MIN(c.not_before_ms) FROM commands c INDEXED BY commands_pending_not_before {_MINE} AND {ahead}",
            params,
        )
    return None if v is None else int(v)


LaneWant = tuple[str, str, int]
"""(node, lane, how many): the first commands of one node's lane that its free credits could send."""

_HEADS_PER_SQLITE_STATEMENT = 16
"""(node, lane) queues per SQLite statement."""


@functools.cache
def _sqlite_heads(terms: int) -> str:
    """The lane-heads read of `terms` (node, lane) queues on SQLite: the first `:kJ` due commands of each."""
    return " UNION ALL ".join(
        f"SELECT * FROM (SELECT c.*, s.session_epoch FROM commands c {_MINE} AND c.node_id = :n{j}"
        f" AND c.lane = :l{j} AND {_DUE} ORDER BY c.seq LIMIT :k{j})"
        for j in range(terms)
    )


async def gateway_lane_heads(
    tx: Tx, gateway_id: str, now_ms: int, wants: Sequence[LaneWant], dialect: str
) -> list[Row]:
    """The reference's dispatch query, per lane: for each `(node, lane, k)` the first `k` due pending commands
    of that node's lane, in `(node_id, seq)` order, each with its session's epoch, for the nodes this gateway
    routes. Only what the lanes' free credits could send is read (an index seek per lane on
    `commands_node_lane_state`), never a node's whole backlog.

    On PostgreSQL the commands are locked (`SKIP LOCKED`: a row another transaction holds is left for the
    next pass) and the session rows share-locked, so no epoch bump commits under the pass. SQLite has one
    writer and needs neither.
    """
    out: list[Row] = []
    if dialect != "postgres":
        # Up to `_HEADS_PER_SQLITE_STATEMENT` lanes a statement, each its own index seek in a UNION ALL: one
        # text per number of terms, so SQLite prepares each once (a compound of hundreds of terms costs tens
        # of milliseconds to prepare, measured), and most lanes are empty, which costs a seek, not a statement.
        for i in range(0, len(wants), _HEADS_PER_SQLITE_STATEMENT):
            part = wants[i : i + _HEADS_PER_SQLITE_STATEMENT]
            terms: dict[str, object] = {"g": gateway_id, "now": now_ms}
            for j, (node_id, lane, k) in enumerate(part):
                terms.update({f"n{j}": node_id, f"l{j}": lane, f"k{j}": k})
            out += await tx.fetchall(_sqlite_heads(len(part)), terms)
        # In the order of `wants`, then seq, as one statement a lane read them.
        order = {(node_id, lane): j for j, (node_id, lane, _) in enumerate(wants)}
        out.sort(key=lambda r: (order[(str(r["node_id"]), str(r["lane"]))], int(r["seq"])))
        return out
    if not wants:
        return out
    # The (node, lane, k) queues as three array parameters: one statement text for any number of them.
    params: dict[str, object] = {
        "g": gateway_id,
        "now": now_ms,
        "wn": [node_id for node_id, _, _ in wants],
        "wl": [lane for _, lane, _ in wants],
        "wk": [k for _, _, k in wants],
    }
    out = await tx.fetchall(
        "SELECT c.*, s.session_epoch FROM node_sessions s"
        " JOIN unnest(CAST(:wn AS text[]), CAST(:wl AS text[]), CAST(:wk AS integer[])) AS want(node_id, lane, k)"
        " ON want.node_id = s.node_id"
        " CROSS JOIN LATERAL (SELECT * FROM commands c WHERE c.node_id = want.node_id"
        f" AND c.lane = want.lane AND {_DUE} ORDER BY c.seq LIMIT want.k FOR UPDATE SKIP LOCKED) c"
        f" {_PG_MINE} ORDER BY c.node_id, c.seq FOR SHARE OF s",
        params,
    )
    out.sort(key=lambda r: (str(r["node_id"]), int(r["seq"])))
    return out


async def gateway_pending_cancelled(
    tx: Tx, gateway_id: str, limit: int, dialect: str, nodes: Sequence[str] | None = None
) -> list[Row]:
    """Pending commands whose cancel was requested (a BUSY requeue of a cancelled command), whatever their
    window: a cancel before dispatch wins. With the session's epoch."""
    params: dict[str, object] = {"g": gateway_id, "limit": limit}
    if dialect == "postgres":
        return await tx.fetchall(
            f"SELECT c.id, c.node_id, s.session_epoch FROM commands c {_PG_SESSION_OF_C} {_PG_MINE}"
            f"{_pg_only(nodes, params, 'c.node_id')} AND {_PENDING_CANCELLED} ORDER BY c.node_id, c.seq LIMIT :limit",
            params,
        )
    # INDEXED BY: without the table's statistics (a new store; `PRAGMA optimize` has not run yet) SQLite's
    # planner read every pending command through the (state) index for this (migration 0032).
    return await tx.fetchall(
        f"SELECT c.id, c.node_id, s.session_epoch FROM commands c INDEXED BY commands_cancel_by_state"
        f" {_MINE}{_only(nodes, params)} AND {_PENDING_CANCELLED} ORDER BY c.node_id, c.seq LIMIT :limit",
        params,
    )


async def gateway_in_flight_by_lane(
    tx: Tx, gateway_id: str, nodes: Sequence[str], dialect: str
) -> dict[tuple[str, str], int]:
    """Lane credits in use, per `(node, lane)`, on each session's own epoch, for `nodes`."""
    params: dict[str, object] = {"g": gateway_id}
    in_flight = f"c.state IN {_IN_FLIGHT_SQL} AND c.dispatched_epoch = s.session_epoch"
    if dialect == "postgres":
        rows = await tx.fetchall(
            "SELECT s.node_id, c.lane, c.n FROM node_sessions s CROSS JOIN LATERAL (SELECT c.lane, COUNT(*) AS n"
            f" FROM commands c WHERE c.node_id = s.node_id AND {in_flight} GROUP BY c.lane) c"
            f" {_PG_MINE}{_pg_only(nodes, params)}",
            params,
        )
    else:
        rows = await tx.fetchall(  # INDEXED BY: the planner's statistics of a busy store chose worse (0.34 ms)
            f"SELECT c.node_id, c.lane, COUNT(*) AS n FROM commands c INDEXED BY commands_node_state"
            f" {_MINE}{_only(nodes, params)} AND {in_flight} GROUP BY c.node_id, c.lane",
            params,
        )
    return {(str(r["node_id"]), str(r["lane"])): int(r["n"]) for r in rows}


async def gateway_roles_and_labels(tx: Tx, gateway_id: str, nodes: Sequence[str], dialect: str) -> dict[str, Row]:
    """`role` and `labels` of the live nodes among `nodes` this gateway routes, by node id."""
    params: dict[str, object] = {"g": gateway_id}
    if dialect == "postgres":
        rows = await tx.fetchall(
            "SELECT n.node_id, n.role, n.labels FROM node_sessions s CROSS JOIN LATERAL (SELECT n.node_id, n.role,"
            " n.labels FROM nodes n WHERE n.node_id = s.node_id AND n.deleted_at_ms IS NULL LIMIT 1) n"
            f" {_PG_MINE}{_pg_only(nodes, params)}",
            params,
        )
    else:
        rows = await tx.fetchall(
            "SELECT n.node_id, n.role, n.labels FROM nodes n JOIN node_sessions s ON s.node_id = n.node_id"
            f" WHERE s.gateway_id = :g AND s.open = 1{_only(nodes, params, 'n.node_id')}"
            " AND n.deleted_at_ms IS NULL",
            params,
        )
    return {str(r["node_id"]): r for r in rows}


async def gateway_cancels_to_send(
    tx: Tx, gateway_id: str, limit: int, dialect: str, nodes: Sequence[str] | None = None
) -> list[Row]:
    """In-flight commands of this gateway's nodes whose cancel was not yet sent on the current session."""
    params: dict[str, object] = {"g": gateway_id, "limit": limit}
    if dialect == "postgres":
        return await tx.fetchall(
            "SELECT c.id, c.node_id, c.cancel_reason, s.session_epoch FROM node_sessions s CROSS JOIN LATERAL"
            " (SELECT c.id, c.node_id, c.seq, c.cancel_reason FROM commands c WHERE c.node_id = s.node_id"
            f" AND {_CANCEL_UNSENT} ORDER BY c.seq LIMIT :limit) c {_PG_MINE}{_pg_only(nodes, params)}"
            " ORDER BY c.node_id, c.seq LIMIT :limit",
            params,
        )
    return await tx.fetchall(  # INDEXED BY: as `gateway_pending_cancelled`'s (2.4 ms a pass, seen, without it)
        "SELECT c.id, c.node_id, c.cancel_reason, s.session_epoch FROM commands c INDEXED BY commands_cancel_by_state"
        f" {_MINE}{_only(nodes, params)} AND {_CANCEL_UNSENT} ORDER BY c.node_id, c.seq LIMIT :limit",
        params,
    )
