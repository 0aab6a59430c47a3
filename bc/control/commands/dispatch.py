"""A gateway's dispatch pass: what every session it routes sends now, in one transaction per 1,000 nodes.

The reference's dispatch (delivery.md, "Dispatch"): on a poke or every second the gateway joins the pending
commands to the sessions it holds (`FOR UPDATE OF c SKIP LOCKED FOR SHARE OF s` on PostgreSQL). A command is
marked dispatched under its session's epoch only when that epoch is the one the gateway holds in memory for
the node (a session that moved, or is mid-Hello, sends nothing here), and only as the pure rules of
`dispatch_rules` allow: lane credits, `seq` order within a lane, and the guards, whose refusals are settled
here instead of sent. A fleet-wide command (one command to each of N nodes) costs ceil(N / 1000) write
transactions, not N.

Per lane, a pass reads only what the lane's free credits could send (`bc.store.dispatch.gateway_lane_heads`:
the lane's credits minus its commands in flight on the session's epoch, from the head of the lane's queue):
a node with a backlog of thousands costs an index seek per lane, not a read of the backlog, bodies and all,
on every pass. Everything that decides and writes is here; the gateway only relays the stored bytes each
`SessionSends` carries.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from bc.control.base.bus import Bus
from bc.control.commands import dispatch_rules
from bc.control.commands.queue import settle_by_server
from bc.protocol import kinds
from bc.store import Store, Tx
from bc.store import commands as commands_sql
from bc.store import dispatch as dispatch_sql
from bc.store.base import Row

log = logging.getLogger("bc.dispatch")

PAGE = commands_sql.DISPATCH_BATCH
"""Nodes planned (their commands read, and on PostgreSQL locked) per write transaction of a pass."""
CREDITS = kinds.GATEWAY_CREDITS


@dataclass(frozen=True)
class CommandFrame:
    """A command as stored, to relay verbatim: the gateway never re-encodes or signs."""

    id: str
    body: bytes
    signature: bytes | None
    signer_key_id: str
    attempt: int
    batch_id: str
    batch_proof: bytes
    preapproval: int = 0  # the health policy version whose signed pre-approval goes with it (0: none)

    @classmethod
    def of(cls, row: Row, attempt: int | None = None) -> CommandFrame:
        return cls(
            id=str(row["id"]),
            body=bytes(row["body"]),
            signature=None if row["signature"] is None else bytes(row["signature"]),
            signer_key_id=str(row["signer_key_id"] or ""),
            attempt=int(row["attempt"] or 0) if attempt is None else attempt,
            batch_id=str(row["batch_id"] or ""),
            batch_proof=bytes(row["batch_proof"] or b""),
            preapproval=int(row.get("preapproval") or 0),
        )


@dataclass
class SessionSends:
    """What one session sends, in this order: its commands (by seq), then its Cancels."""

    epoch: int
    commands: list[CommandFrame] = field(default_factory=list)
    cancels: list[tuple[str, str]] = field(default_factory=list)  # (command id, reason)


@dataclass
class GatewayDispatch:
    sends: dict[str, SessionSends] = field(default_factory=dict)
    transactions: int = 0
    """Write transactions the pass took (0 when a read found nothing to do)."""
    next_due_ms: int | None = None
    """The earliest `not_before` still ahead among this gateway's pending commands (store time)."""

    def to(self, node_id: str, epoch: int) -> SessionSends:
        s = self.sends.get(node_id)
        if s is None:
            s = self.sends[node_id] = SessionSends(epoch)
        return s


async def dispatch_gateway(
    store: Store,
    bus: Bus,
    gateway_id: str,
    epochs: Mapping[str, int],
    *,
    page: int = PAGE,
    nodes: Collection[str] | None = None,
) -> GatewayDispatch:
    """One pass over every node `gateway_id` routes (or, with `nodes`, over those only: the nodes poked since
    the last pass), `page` nodes per write transaction; `epochs` is the gateway's in-memory epoch per open
    session. Only a pass over every node says when the next `not_before` falls due."""
    out = GatewayDispatch()
    only = sorted(epochs) if nodes is None else sorted(n for n in nodes if n in epochs)
    if not only:
        return out
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        work = await dispatch_sql.gateway_has_work(
            tx, gateway_id, now_ms, store.dialect, None if nodes is None else only
        )
        if nodes is None:
            out.next_due_ms = await dispatch_sql.gateway_next_not_before(tx, gateway_id, now_ms, store.dialect)
    if not work:
        return out
    for i in range(0, len(only), page):
        part = only[i : i + page]
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            out.transactions += 1
            in_flight = await dispatch_sql.gateway_in_flight_by_lane(tx, gateway_id, part, store.dialect)
            wants = [
                (node_id, lane, credit - used)
                for node_id in part
                for lane, credit in CREDITS.items()
                if (used := in_flight.get((node_id, lane), 0)) < credit
            ]
            rows = await dispatch_sql.gateway_lane_heads(tx, gateway_id, now_ms, wants, store.dialect)
            cancelled = await dispatch_sql.gateway_pending_cancelled(tx, gateway_id, page, store.dialect, part)
            await _plan_page(tx, bus, gateway_id, epochs, rows, cancelled, in_flight, now_ms, out, store.dialect)
            await _cancels_to_send(tx, gateway_id, epochs, page, out, part, store.dialect)
    return out


def _pending(row: Row) -> dispatch_rules.PendingCommand:
    return dispatch_rules.PendingCommand(
        id=str(row["id"]),
        node_id=str(row["node_id"]),
        seq=int(row["seq"]),
        lane=str(row["lane"]),
        kind=str(row["kind"]),
        body=bytes(row["body"]),
        cancel_requested=row["cancel_requested_at_ms"] is not None,
    )


async def _plan_page(
    tx: Tx,
    bus: Bus,
    gateway_id: str,
    epochs: Mapping[str, int],
    rows: list[Row],
    cancelled: list[Row],
    in_flight_by_lane: Mapping[tuple[str, str], int],
    now_ms: int,
    out: GatewayDispatch,
    dialect: str,
) -> None:
    """Plan each node of one page with the pure rules; settle the refusals, mark the sends in one statement."""

    def current(r: Row) -> bool:  # the session row read here is the one this gateway holds
        return epochs.get(str(r["node_id"])) == int(r["session_epoch"])

    by_node: dict[str, list[dispatch_rules.PendingCommand]] = {}
    frames: dict[str, Row] = {}
    for r in rows:
        if current(r):
            by_node.setdefault(str(r["node_id"]), []).append(_pending(r))
            frames[str(r["id"])] = r
    for r in cancelled:  # a cancel before dispatch wins, whatever the command's window
        if current(r) and str(r["id"]) not in frames:
            by_node.setdefault(str(r["node_id"]), []).append(
                dispatch_rules.PendingCommand(str(r["id"]), str(r["node_id"]), 0, "", "", b"", True)
            )
    if not by_node:
        return
    in_flight: dict[str, dict[str, int]] = {}
    for (nid, lane), n in in_flight_by_lane.items():
        in_flight.setdefault(nid, {})[lane] = n
    nodes = await dispatch_sql.gateway_roles_and_labels(tx, gateway_id, sorted(by_node), dialect)
    send: list[str] = []
    for node_id, pending in by_node.items():
        node = nodes.get(node_id)
        if node is None:  # deleted meanwhile
            continue
        labels = json.loads(str(node["labels"] or "{}"))
        plan = dispatch_rules.plan_dispatch(
            pending,
            in_flight.get(node_id, {}),
            str(node["role"]),
            tenant_controlled=labels.get("bc.dev/tenant-controlled") == "true",
        )
        for cid, reason in plan.cancel:
            await settle_by_server(tx, bus, cid, node_id, "cancelled", reason, now_ms, ("pending",))
        send += plan.send
    marked = await commands_sql.mark_dispatched_routed(tx, send, gateway_id, now_ms, dialect)
    for cid in send:  # in (node, seq) order, as planned
        if cid not in marked:
            continue
        node_id, epoch, attempt = marked[cid]
        if epochs.get(node_id) != epoch:  # cannot happen: the session row is locked (or SQLite's one writer)
            log.error("event=dispatch.epoch-moved node=%s command=%s epoch=%d", node_id, cid, epoch)
            continue
        out.to(node_id, epoch).commands.append(CommandFrame.of(frames[cid], attempt))


async def _cancels_to_send(
    tx: Tx,
    gateway_id: str,
    epochs: Mapping[str, int],
    limit: int,
    out: GatewayDispatch,
    nodes: Sequence[str] | None,
    dialect: str,
) -> None:
    """Cancels of in-flight commands, once per session (again after every reconnect) until the node settles them."""
    for r in await dispatch_sql.gateway_cancels_to_send(tx, gateway_id, limit, dialect, nodes):
        node_id, epoch = str(r["node_id"]), int(r["session_epoch"])
        if epochs.get(node_id) != epoch:
            continue
        out.to(node_id, epoch).cancels.append((str(r["id"]), str(r["cancel_reason"] or "cancelled")))
        await commands_sql.mark_cancel_sent(tx, str(r["id"]), node_id, epoch)
