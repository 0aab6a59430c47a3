"""Taking a node out: revoke its certificates, cordon it, delete it.

Revocation is what ends a node's sessions: every gateway's revocation feed
sees `node_certs.revoked_at_ms` within about a second, tells the node, and
closes the stream; the handshake and the Hello refuse the serial from then on.
Nothing a node holds is released by any of this (a revoked node's workloads
keep running); deleting needs the node cordoned and its reservations released
first, so that an operator decides about every workload.
"""

from __future__ import annotations

import json

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.commands import queue as cmds
from bc.control.nodes import specs
from bc.control.signing.signer import Signer
from bc.errors import Conflict, NotFound, UsageError
from bc.protocol import labels as node_labels
from bc.store import Store, Tx
from bc.store import node_lifecycle as life_sql
from bc.store import nodes as nodes_sql
from bc.store import revocation as rev_sql


async def _node(tx: Tx, node_id: str) -> None:
    if await nodes_sql.get(tx, node_id) is None:
        raise NotFound(f"no node named {node_id!r}")


async def revoke(store: Store, bus: Bus, node_id: str, reason: str) -> list[str]:
    """Revoke every live certificate of the node; returns the serials. Revoking twice is not an error."""
    reason = reason.strip() or "revoked by an operator"
    if len(reason) > 200:
        raise UsageError("the revocation reason is longer than 200 characters")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await _node(tx, node_id)
        serials = await rev_sql.revoke_node(tx, node_id, reason, now_ms)
        if serials:
            await publish(tx, bus, "security.node.revoked", node_id, {"reason": reason, "serials": serials}, now_ms)
    return serials


async def cordon(store: Store, bus: Bus, node_id: str, cordoned: bool) -> bool:
    """Cordoned nodes get no new reservations; returns whether anything changed."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await _node(tx, node_id)
        changed = await life_sql.set_cordoned(tx, node_id, cordoned)
        if changed:
            await publish(tx, bus, "node.cordoned" if cordoned else "node.uncordoned", node_id, {}, now_ms)
    return changed


async def label(
    store: Store,
    bus: Bus,
    node_id: str,
    set_: dict[str, str],
    remove: list[str],
    signer: Signer,
) -> dict[str, str]:
    """Set and remove operator labels in one write; returns the node's labels after. The node's spec is
    written again in the same transaction (a new generation: its signed body carries the labels)."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await nodes_sql.role_and_labels(tx, node_id)
        if row is None:
            raise NotFound(f"no node named {node_id!r}")
        before = json.loads(str(row["labels"] or "{}"))
        after = node_labels.edit(before, set_, remove)
        if after != before:
            await nodes_sql.set_labels(tx, node_id, json.dumps(after, sort_keys=True))
            await publish(tx, bus, "node.labelled", node_id, {"set": set_, "removed": remove}, now_ms)
            await specs.write_spec(tx, bus, signer, node_id, lambda _spec: None, now_ms, lock=store.for_update())
    return after


async def delete(store: Store, bus: Bus, node_id: str) -> list[str]:
    """Delete a cordoned node with no live reservation: its certificates are revoked, its open commands
    settle (`node-deleted`), and it becomes a tombstone that keeps its history (`bc nodes --all`)."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await nodes_sql.get(tx, node_id)
        if row is None:
            raise NotFound(f"no node named {node_id!r}")
        if not row["cordoned"]:
            raise Conflict(f"node {node_id} is not cordoned; cordon it first: bc nodes cordon {node_id}")
        live = await life_sql.live_reservations(tx, node_id)
        if live:
            raise Conflict(f"node {node_id} still has {live} reservation(s); release them first")
        serials = await rev_sql.revoke_node(tx, node_id, "node deleted", now_ms)
        for c in await life_sql.open_commands(tx, node_id):
            # Never sent: cancelled. In flight: failed, since the node can no longer report (it is revoked).
            state = "cancelled" if str(c["state"]) == "pending" else "failed"
            await cmds.settle_by_server(
                tx, bus, str(c["id"]), node_id, state, "node-deleted", now_ms, (str(c["state"]),)
            )
        await life_sql.tombstone(tx, node_id, now_ms)
        await publish(tx, bus, "node.deleted", node_id, {"revoked_serials": serials}, now_ms)
    return serials
