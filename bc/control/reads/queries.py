"""Every read the Admin API serves, so the CLI, the TUI and the servicers see the same facts: one function each.

Each function reads in one read-only transaction and returns the wire message
the client gets (rows become messages in `bc.control.reads.views`; `fleet_pages`,
the streamed fleet, reads one short transaction per page, and says what that
keeps of the guarantee below); the servicer
only authenticates, calls one of these and maps errors. The job queue's reads
live beside the queue in `bc.jobs.queries` (that package sits above this one).

Snapshots and the event stream. A snapshot (the fleet, a node, commands,
batches, reservations; the jobs in `bc.jobs.queries`) carries `event_seq`,
the newest event seq read in the same transaction as its rows. Every change
publishes its event in the transaction that makes it, so a change the
snapshot shows has an event at or below that seq and a change it does not
show has one above: a client that then watches with `after_seq=event_seq`
sees each later change exactly once and none twice. (SQLite gives a read
transaction one snapshot from its first read, and writers commit one at a
time, so seqs become visible in order; a store where they could commit out
of order must read the seq under the same guarantee.)

`now_ms` is read from the store's clock just before each transaction, as the
writes do; ages in the messages are relative to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

from bc.control.capacity.views import Explanation, explain, usage
from bc.control.commands import queue as cmds
from bc.control.commands import states as cs
from bc.control.quorum import approvers as appr
from bc.control.quorum import views as quorum_views
from bc.control.reads import views
from bc.control.trust import operators as ops
from bc.errors import NotFound, UsageError
from bc.protocol.limits import LIMITS
from bc.protocol.pb import admin_pb2, common_pb2
from bc.store import Row, Store, Tx
from bc.store import capacity as cap_sql
from bc.store import commands as cmd_sql
from bc.store import events as events_sql
from bc.store import health as health_sql
from bc.store import nodes as nodes_sql
from bc.store import operators as ops_sql
from bc.store import quorum as q_sql
from bc.store import reservations as res_sql
from bc.store import revocation as rev_sql

MAX_EVENTS_LIMIT = 10_000
"""The most events one `ListEvents` asks for (the reply is cut to the frame budget besides)."""

WATCH_PAGE = 500
"""How many events `Watch` reads at a time."""

BATCH_STATES = ("pending", "approved", "rejected", "expired", "withdrawn")


# -- nodes ---------------------------------------------------------------------------------------


NODES_PAGE = 1000
"""Nodes per page of the streamed listing (`ListNodesStream`): about 230 KB of messages, a few ms of reading."""

MAX_NODES_PAGE = 5000
"""The most nodes a client may ask for in one page (a page is one message, under the gRPC limit)."""

_ID: Final = nodes_sql.LISTED_NODE_ID
_INVENTORY_HASH: Final = nodes_sql.LISTED_INVENTORY_HASH
_IDENTITY_GENERATION: Final = nodes_sql.LISTED_IDENTITY_GENERATION


async def fleet(store: Store, *, include_deleted: bool = False) -> admin_pb2.ListNodesResponse:
    """Every node (tombstones too with `include_deleted`), without the detail `node` adds: one message read
    in one transaction (the unary `ListNodes`, for clients older than `fleet_pages`)."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        seq = await events_sql.last_seq(tx)
        page = await _fleet_rows(tx, after="", limit=None, include_deleted=include_deleted)
    return page.response(now_ms, seq)


async def fleet_pages(
    store: Store, *, include_deleted: bool = False, page_size: int = NODES_PAGE
) -> AsyncIterator[admin_pb2.ListNodesResponse]:
    """The fleet as `fleet` lists it, in pages of `page_size` nodes in id order, each read in a short
    transaction of its own, so that no transaction (SQLite's one connection, a PostgreSQL snapshot) is held
    while a client reads a 10,000-node listing, and no message holds it whole. At least one page, the last
    one shorter than `page_size` (possibly empty).

    Each page is keyed by the last id of the one before (`node_id > :after`), so a node is listed at most
    once whatever joins or leaves meanwhile. Every page carries the `event_seq` read with the first: a
    change made while the pages are read has its event above that seq, so `Watch(after_seq=event_seq)`
    misses nothing; what it may do, unlike a one-transaction snapshot, is repeat a change a later page
    already shows (a node that joins mid-listing with an id past the pages read so far is listed and its
    `node.joined` event follows too; one whose id sorts before them is not listed, and only its event
    tells). Applying an event to a row that already shows it changes nothing, which is how the TUI and
    `bc nodes` read them.
    """
    if not 1 <= page_size <= MAX_NODES_PAGE:
        raise UsageError(f"a page of nodes holds 1 to {MAX_NODES_PAGE}, not {page_size}")
    after, seq = "", -1
    while True:
        now_ms = await store.now_ms()
        async with store.transaction(write=False) as tx:
            if seq < 0:
                seq = await events_sql.last_seq(tx)
            page = await _fleet_rows(tx, after=after, limit=page_size, include_deleted=include_deleted)
        yield page.response(now_ms, seq)
        if len(page.rows) < page_size:
            return
        after = page.rows[-1][_ID]


@dataclass(frozen=True)
class _FleetRows:
    """One page's rows, read in one transaction: the nodes, and their certificates' and GPU cordons' rows."""

    rows: list[nodes_sql.ListedRow]
    certs: dict[tuple[str, int], rev_sql.CertState]
    cordons: dict[str, list[Row]]
    unhealthy: dict[str, tuple[str, ...]]

    def response(self, now_ms: int, event_seq: int) -> admin_pb2.ListNodesResponse:
        """The page's message, made outside the transaction (SQLite's one connection is free meanwhile)."""
        out = admin_pb2.ListNodesResponse(event_seq=event_seq)
        nodes, add = out.nodes, views.add_listed_node
        certs, cordons, unhealthy = self.certs.get, self.cordons.get, self.unhealthy
        for r in self.rows:
            node_id = r[_ID]
            add(
                nodes,
                r,
                now_ms,
                certs=certs((node_id, r[_IDENTITY_GENERATION])),
                gpu_cordons=cordons(node_id, ()),
                unhealthy_gpus=unhealthy[node_id],
            )
        return out


async def _fleet_rows(tx: Tx, *, after: str, limit: int | None, include_deleted: bool) -> _FleetRows:
    rows = await nodes_sql.list_page(tx, after=after, limit=limit, include_deleted=include_deleted)
    if not rows:
        return _FleetRows([], {}, {}, {})
    # The certificates and cordons of this page's id range only (all of them for the one-message listing).
    through = rows[-1][_ID] if limit is not None else None
    lower = after or None
    certs = await rev_sql.cert_states(tx, after=lower, through=through)
    cordons: dict[str, list[Row]] = {}
    for c in await health_sql.gpu_cordons(tx, after=lower, through=through):
        cordons.setdefault(str(c["node_id"]), []).append(c)
    # Unhealthy GPUs from the memo of parsed inventories; only the inventories it does not know are read (an
    # inventory is about 2 KB a node, the most of a listed row: a third of the rows' read at 10,000 nodes).
    unhealthy: dict[str, tuple[str, ...]] = {}
    missing: list[nodes_sql.ListedRow] = []
    for r in rows:
        found = views.UNHEALTHY_GPUS.known(r[_ID], r[_INVENTORY_HASH] or "")
        if found is None:
            missing.append(r)
        else:
            unhealthy[r[_ID]] = found
    texts = await nodes_sql.inventories(tx, [r[_ID] for r in missing]) if missing else {}
    for r in missing:
        node_id = r[_ID]
        unhealthy[node_id] = views.UNHEALTHY_GPUS(node_id, texts.get(node_id) or "{}", r[_INVENTORY_HASH] or "")
    return _FleetRows(rows, certs, cordons, unhealthy)


async def node(store: Store, node_id: str) -> admin_pb2.NodeInfo:
    """One node in detail: sections, conditions, inventory and capacity. A deleted node still shows
    (state "deleted"): its history is kept."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        seq = await events_sql.last_seq(tx)
        row = await nodes_sql.get(tx, node_id, include_deleted=True)
        certs = await rev_sql.cert_state(tx, node_id)  # this node's only: the fleet's were 55 ms at 10,000
        bookings = await cap_sql.live_bookings_on(tx, node_id)
        cordons = await health_sql.gpu_cordons(tx, node_id)
    if row is None:
        raise NotFound(f"no node named {node_id!r}")
    info = views.node_info(row, now_ms, detail=True, certs=certs, gpu_cordons=cordons)
    views.add_capacity(info, bookings, now_ms)
    info.event_seq = seq
    return info


async def node_summary(store: Store, node_id: str) -> admin_pb2.NodeInfo:
    """A live node as a row of the fleet shows it: the reply of a write to the node."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        seq = await events_sql.last_seq(tx)
        row = await nodes_sql.get(tx, node_id)
        certs = await rev_sql.cert_state(tx, node_id)
        cordons = await health_sql.gpu_cordons(tx, node_id)
    if row is None:
        raise NotFound(f"no node named {node_id!r}")
    info = views.node_info(row, now_ms, detail=False, certs=certs, gpu_cordons=cordons)
    info.event_seq = seq
    return info


async def spec(store: Store, node_id: str) -> admin_pb2.SpecInfo:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    if row is None:
        raise NotFound(f"no node named {node_id!r}")
    return admin_pb2.SpecInfo(
        node_id=node_id,
        generation=int(row["generation"]),
        spec_hash=str(row["spec_hash"]),
        spec_json=str(row["spec"]),
    )


# -- reservations --------------------------------------------------------------------------------


async def reservation(store: Store, reservation_id: str) -> admin_pb2.Reservation:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await res_sql.get(tx, reservation_id)
        if row is None:
            raise NotFound(f"no reservation named {reservation_id!r}")
        return views.reservation(row, await res_sql.bookings(tx, reservation_id), now_ms)


async def reservations(
    store: Store, *, node_id: str = "", include_released: bool = False, state: str = "", tenant: str = ""
) -> admin_pb2.ListReservationsResponse:
    now_ms = await store.now_ms()
    out = admin_pb2.ListReservationsResponse()
    async with store.transaction(write=False) as tx:
        out.event_seq = await events_sql.last_seq(tx)
        for row in await res_sql.list_(tx, node_id, include_released, state=state, tenant=tenant):
            out.reservations.append(views.reservation(row, await res_sql.bookings(tx, str(row["id"])), now_ms))
    return out


# -- commands ------------------------------------------------------------------------------------


async def command(store: Store, command_id: str) -> admin_pb2.CommandInfo:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await cmd_sql.get(tx, command_id)
    if row is None:
        raise NotFound(f"no command {command_id!r}")
    return views.command_info(row, now_ms)


async def commands(
    store: Store, *, node_id: str = "", state: str = "", limit: int = 0
) -> admin_pb2.ListCommandsResponse:
    """Newest first, at most `limit` (0: the default 100; at most 1000); results that would outgrow the
    frame are left out (`result_omitted`)."""
    if state and state not in cs.STATES:
        raise UsageError(f"unknown command state {state!r}; states: {', '.join(cs.STATES)}")
    if limit < 0:
        raise UsageError(f"the limit must not be negative, not {limit}")
    limit = min(limit or cmds.DEFAULT_LIST_LIMIT, cmds.MAX_LIST_LIMIT)
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        seq = await events_sql.last_seq(tx)
        rows = await cmd_sql.list_(tx, node_id=node_id, state=state, limit=limit)
    infos = views.fit_command_results([views.command_info(r, now_ms) for r in rows], LIMITS.max_frame_bytes)
    return admin_pb2.ListCommandsResponse(commands=infos, event_seq=seq)


async def command_info(store: Store, row: Row) -> admin_pb2.CommandInfo:
    """The reply of a write that returns the command's row (run, cancel)."""
    return views.command_info(row, await store.now_ms())


async def enqueued(store: Store, rows: list[Row]) -> admin_pb2.EnqueueCommandsResponse:
    """The reply of `EnqueueCommands`: the rows it wrote (or found by key), in order; results that would
    outgrow the frame are left out (`result_omitted`)."""
    now_ms = await store.now_ms()
    infos = views.fit_command_results([views.command_info(r, now_ms) for r in rows], LIMITS.max_frame_bytes)
    return admin_pb2.EnqueueCommandsResponse(commands=infos)


# -- the destructive-batch quorum ----------------------------------------------------------------


async def _approver_keys(tx: Tx) -> list[common_pb2.ApproverKey]:
    return appr.approver_keys(await q_sql.list_approvers(tx))


async def _batch_in(tx: Tx, row: Row, approvers: list[common_pb2.ApproverKey], now_ms: int) -> admin_pb2.BatchInfo:
    batch_id = str(row["id"])
    leaves = await q_sql.leaves(tx, batch_id)
    return quorum_views.batch_info(row, leaves, await q_sql.decisions(tx, batch_id), approvers, now_ms)


async def batch(store: Store, batch_id: str) -> admin_pb2.BatchInfo:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await q_sql.get_batch(tx, batch_id)
        if row is None:
            raise NotFound(f"no batch named {batch_id!r}")
        return await _batch_in(tx, row, await _approver_keys(tx), now_ms)


async def batches(store: Store, state: str = "") -> admin_pb2.ListBatchesResponse:
    """The newest batches (every state, or the one `state` names as shown: `expired` is a pending batch
    past its expiry, and `pending` leaves those out), newest first."""
    if state and state not in BATCH_STATES:
        raise UsageError(f"unknown batch state {state!r}; states: {', '.join(BATCH_STATES)}")
    now_ms = await store.now_ms()
    out = admin_pb2.ListBatchesResponse()
    async with store.transaction(write=False) as tx:
        out.event_seq = await events_sql.last_seq(tx)
        approvers = await _approver_keys(tx)
        for row in await q_sql.list_batches(tx, "pending" if state == "expired" else state):
            if not state or quorum_views.batch_state(row, now_ms) == state:
                out.batches.append(await _batch_in(tx, row, approvers, now_ms))
    return out


# -- approvers, quorum changes and operators ---------------------------------------------------------


async def approver_set(store: Store, change_id: str = "") -> admin_pb2.ApproverSet:
    """The approvers, k and the allowance; with `change_id`, that change as well (a proposal's reply)."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        out = appr.set_info(await appr.stored(tx), now_ms)
    if change_id:
        out.change.CopyFrom(await appr.get_change(store, change_id))
    return out


async def quorum_change(store: Store, change_id: str) -> admin_pb2.QuorumChangeInfo:
    return await appr.get_change(store, change_id)


async def quorum_changes(store: Store, state: str = "") -> admin_pb2.ListQuorumChangesResponse:
    return admin_pb2.ListQuorumChangesResponse(changes=await appr.list_changes(store, state))


async def operators(store: Store) -> admin_pb2.ListOperatorsResponse:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        rows = await ops_sql.list_all(tx)
    return admin_pb2.ListOperatorsResponse(operators=[ops.info(r, now_ms) for r in rows])


async def operator_info(store: Store, row: Row) -> admin_pb2.OperatorInfo:
    """The reply of a write that returns the operator's row (add, revoke)."""
    return ops.info(row, await store.now_ms())


# -- events and the server -------------------------------------------------------------------------


async def events(
    store: Store, *, after_seq: int = 0, limit: int = 0, type_prefix: str = ""
) -> admin_pb2.ListEventsResponse:
    """Events after `after_seq` (at most `limit`, 0: 1,000), cut to the frame budget: the caller pages on."""
    if not 0 <= limit <= MAX_EVENTS_LIMIT:
        raise UsageError(f"the limit must be between 0 and {MAX_EVENTS_LIMIT:,}, not {limit}")
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, after_seq, limit or 1000, type_prefix)
    return admin_pb2.ListEventsResponse(
        events=views.events_within([views.event_record(r) for r in rows], LIMITS.max_frame_bytes)
    )


async def events_after(
    store: Store, after_seq: int, type_prefix: str = "", limit: int = WATCH_PAGE
) -> list[admin_pb2.EventRecord]:
    """The next page of the stream `Watch` (and `WatchJob`'s wake-ups) read: events after `after_seq`."""
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, after_seq, limit, type_prefix)
    return [views.event_record(r) for r in rows]


@dataclass(frozen=True)
class ServerFacts:
    """What `ServerInfo` reads of the store: the caller's role ("" when unknown), the newest seq, the time."""

    role: str
    event_seq: int
    now_ms: int


async def server_facts(store: Store, operator: str) -> ServerFacts:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await ops_sql.get(tx, operator)
        seq = await events_sql.last_seq(tx)
    return ServerFacts(str(row["role"]) if row else "", seq, now_ms)


__all__ = [
    "MAX_EVENTS_LIMIT",
    "Explanation",
    "ServerFacts",
    "approver_set",
    "batch",
    "batches",
    "command",
    "command_info",
    "commands",
    "events",
    "events_after",
    "explain",
    "fleet",
    "node",
    "node_summary",
    "operator_info",
    "operators",
    "quorum_change",
    "quorum_changes",
    "reservation",
    "reservations",
    "server_facts",
    "spec",
    "usage",
]
