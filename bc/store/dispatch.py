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
    """A pass over some nodes only (those poked since the last pass): their ids as parameters."""
    if nodes is None:
        return ""
    names = [f"o{i}" for i in range(len(nodes))]
    params.update(zip(names, nodes, strict=True))
    return f" AND {column} IN ({', '.join(':' + n for n in names)})" if names else " AND 0 = 1"


async def gateway_has_work(tx: Tx, gateway_id: str, now_ms: int, nodes: Sequence[str] | None = None) -> bool:
    """Whether any node this gateway routes has a command dispatch could send, cancel, or send a Cancel for.

    A read: most passes of a quiet gateway find nothing and take no write lock.
    """
    params: dict[str, object] = {"g": gateway_id, "now": now_ms}
    only = _only(nodes, params)
    v = await tx.fetchval(
        f"SELECT 1 FROM commands c {_MINE}{only}"
        f" AND (({_DUE}) OR ({_PENDING_CANCELLED}) OR ({_CANCEL_UNSENT})) LIMIT 1",
        params,
    )
    return v is not None


async def gateway_next_not_before(tx: Tx, gateway_id: str, now_ms: int) -> int | None:
    """The earliest `not_before` still ahead among the pending commands of this gateway's nodes."""
    v = await tx.fetchval(
        f"SELECT MIN(c.not_before_ms) FROM commands c {_MINE}"
        " AND c.state = 'pending' AND c.held = 0 AND c.not_before_ms > :now",
        {"g": gateway_id, "now": now_ms},
    )
    return None if v is None else int(v)


LaneWant = tuple[str, str, int]
"""(node, lane, how many): the first commands of one node's lane that its free credits could send."""

_HEADS_PER_STATEMENT = 400
"""(node, lane) queues per PostgreSQL statement."""


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
    for i in range(0, len(wants), _HEADS_PER_STATEMENT):
        part = wants[i : i + _HEADS_PER_STATEMENT]
        params: dict[str, object] = {"g": gateway_id, "now": now_ms}
        for j, (node_id, lane, k) in enumerate(part):
            params.update({f"n{j}": node_id, f"l{j}": lane, f"k{j}": k})
        values = ", ".join(f"(:n{j}, :l{j}, CAST(:k{j} AS integer))" for j in range(len(part)))
        out += await tx.fetchall(
            "SELECT c.*, s.session_epoch FROM node_sessions s"
            f" JOIN (VALUES {values}) AS want(node_id, lane, k) ON want.node_id = s.node_id"
            " CROSS JOIN LATERAL (SELECT * FROM commands c WHERE c.node_id = want.node_id"
            f" AND c.lane = want.lane AND {_DUE} ORDER BY c.seq LIMIT want.k FOR UPDATE SKIP LOCKED) c"
            " WHERE s.gateway_id = :g AND s.open = 1 ORDER BY c.node_id, c.seq FOR SHARE OF s",
            params,
        )
    out.sort(key=lambda r: (str(r["node_id"]), int(r["seq"])))
    return out


async def gateway_pending_cancelled(
    tx: Tx, gateway_id: str, limit: int, nodes: Sequence[str] | None = None
) -> list[Row]:
    """Pending commands whose cancel was requested (a BUSY requeue of a cancelled command), whatever their
    window: a cancel before dispatch wins. With the session's epoch."""
    params: dict[str, object] = {"g": gateway_id, "limit": limit}
    only = _only(nodes, params)
    return await tx.fetchall(
        f"SELECT c.id, c.node_id, s.session_epoch FROM commands c {_MINE}{only} AND {_PENDING_CANCELLED}"
        " ORDER BY c.node_id, c.seq LIMIT :limit",
        params,
    )


async def gateway_in_flight_by_lane(tx: Tx, gateway_id: str, nodes: Sequence[str]) -> dict[tuple[str, str], int]:
    """Lane credits in use, per `(node, lane)`, on each session's own epoch, for `nodes`."""
    params: dict[str, object] = {"g": gateway_id}
    rows = await tx.fetchall(
        f"SELECT c.node_id, c.lane, COUNT(*) AS n FROM commands c {_MINE}{_only(nodes, params)}"
        f" AND c.state IN {_IN_FLIGHT_SQL} AND c.dispatched_epoch = s.session_epoch GROUP BY c.node_id, c.lane",
        params,
    )
    return {(str(r["node_id"]), str(r["lane"])): int(r["n"]) for r in rows}


async def gateway_roles_and_labels(tx: Tx, gateway_id: str, nodes: Sequence[str]) -> dict[str, Row]:
    """`role` and `labels` of the live nodes among `nodes` this gateway routes, by node id."""
    params: dict[str, object] = {"g": gateway_id}
    rows = await tx.fetchall(
        "SELECT n.node_id, n.role, n.labels FROM nodes n JOIN node_sessions s ON s.node_id = n.node_id"
        f" WHERE s.gateway_id = :g AND s.open = 1{_only(nodes, params, 'n.node_id')}"
        " AND n.deleted_at_ms IS NULL",
        params,
    )
    return {str(r["node_id"]): r for r in rows}


async def gateway_cancels_to_send(tx: Tx, gateway_id: str, limit: int, nodes: Sequence[str] | None = None) -> list[Row]:
    """In-flight commands of this gateway's nodes whose cancel was not yet sent on the current session."""
    params: dict[str, object] = {"g": gateway_id, "limit": limit}
    only = _only(nodes, params)
    return await tx.fetchall(
        f"SELECT c.id, c.node_id, c.cancel_reason, s.session_epoch FROM commands c {_MINE}{only}"
        f" AND {_CANCEL_UNSENT} ORDER BY c.node_id, c.seq LIMIT :limit",
        params,
    )
