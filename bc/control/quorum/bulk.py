"""A provisioning job's `metal.bulk` batch (docs/metal.md): one quorum over every destructive step of every
machine of the job, released leaf by leaf as the steps run.

Unlike a batch of one kind (`bc.control.quorum.batches`), its leaves have their own node, kind and payload
(`bmc.power off` and `on`, `bmc.boot pxe` on the site; `disk.wipe` and `deploy.image` on each machine's
ramdisk), listed in the batch's payload so an approver recomputes every leaf and the root from what is shown
(`bc.pki.batch_scope.bulk_leaves`). And its commands are not enqueued when it is created: a ramdisk's node
does not exist until the machine boots it. A leaf's command is made when its step releases it (held, then
released with its proof in the same transaction, `batch:<id>:<idx>` as its idempotency key), so a repeat
finds it; the agent checks the proof against the approved root as for any batch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.commands import queue as cmds
from bc.control.quorum import approvers as appr
from bc.control.quorum.batches import _release, check_can_approve
from bc.control.signing.signer import Signer
from bc.errors import Conflict, UsageError
from bc.pki import merkle
from bc.pki.batch_scope import BULK_BATCH_KIND, bulk_leaves
from bc.protocol import kinds
from bc.seams.ids import ulid
from bc.store import Tx
from bc.store import quorum as q_sql

Leaf = tuple[str, str, str]  # node id, kind, payload JSON


def bulk_payload(leaves: Sequence[Leaf]) -> str:
    """The batch's payload: its leaves in order, each payload as canonical JSON (what the steps send)."""
    return json.dumps({"leaves": [{"node_id": n, "kind": k, "payload_json": p} for n, k, p in leaves]}, sort_keys=True)


async def create_bulk_in(
    tx: Tx,
    bus: Bus,
    rng: random.Random,
    leaves: Sequence[Leaf],
    *,
    reason: str,
    requested_by: str,
    now_ms: int,
    dag_id: str,
    not_after_s: float,
) -> str:
    """Store the batch and its leaves (no command yet); returns its id."""
    if not leaves:
        raise UsageError("a metal.bulk batch needs at least one leaf")
    for _, kind, _ in leaves:
        k = kinds.get(kind)
        if k is None or not k.destructive:
            raise UsageError(f"{kind} is not a destructive kind: it has no place in a metal.bulk batch")
    payload_json = bulk_payload(leaves)
    batch_id = "b-" + ulid(now_ms / 1000, rng)
    entries = bulk_leaves(batch_id, payload_json)
    if len({(n, k, d) for n, k, d in entries}) != len(entries):
        raise UsageError("a metal.bulk batch lists one leaf twice")
    tree = merkle.MerkleTree([merkle.leaf_bytes(n, k, d) for n, k, d in entries])
    await check_can_approve(tx, requested_by)
    await q_sql.insert_batch(
        tx,
        id_=batch_id,
        kind=BULK_BATCH_KIND,
        requested_by=requested_by,
        reason=reason[:500],
        payload_json=payload_json,
        scope_root=tree.root,
        threshold=await appr.threshold(tx),
        now_ms=now_ms,
        not_after_ms=now_ms + round(not_after_s * 1000),
        dag_id=dag_id,
    )
    for idx, (node, kind, digest) in enumerate(entries):
        await q_sql.insert_leaf(tx, batch_id, idx, node, kind, digest, "")
    data = {
        "kind": BULK_BATCH_KIND,
        "nodes": sorted({n for n, _, _ in entries}),
        "requested_by": requested_by,
        "scope_root": tree.root.hex(),
        "dag_id": dag_id,
    }
    await publish(tx, bus, "batch.created", batch_id, data, now_ms)
    return batch_id


async def release_bulk_leaf(
    tx: Tx, bus: Bus, signer: Signer, rng: random.Random, batch_id: str, idx: int, requested_by: str, now_ms: int
) -> str:
    """The command of leaf `idx` of an approved bulk batch, made now (held, then released with its proof);
    a repeat returns the one made before."""
    batch = await q_sql.get_batch(tx, batch_id)
    if batch is None or str(batch["state"]) != "approved":
        state = "missing" if batch is None else str(batch["state"])
        raise Conflict(f"batch {batch_id} is {state}, not approved: its leaf {idx} cannot run")
    leaves = await q_sql.leaves(tx, batch_id)
    if not 0 <= idx < len(leaves):
        raise Conflict(f"batch {batch_id} has no leaf {idx}")
    leaf = leaves[idx]
    if str(leaf["command_id"]):
        return str(leaf["command_id"])
    entry = json.loads(str(batch["payload_json"]))["leaves"][idx]
    node, kind, text = str(entry["node_id"]), str(entry["kind"]), str(entry["payload_json"])
    payload = cmds.payload_for(kind, cmds.payload_from_json(kind, text))  # as the leaf's digest was computed
    req = cmds.EnqueueRequest(
        node,
        kind,
        payload,
        not_after_s=max(60.0, (int(batch["not_after_ms"]) - now_ms) / 1000),
        idempotency_key=f"batch:{batch_id}:{idx}",
        batch_id=batch_id,
        requested_by=requested_by,
    )
    row = await cmds.enqueue_in(tx, bus, signer, req, cmds.kind_of(kind), payload, now_ms, rng, held=True)
    command_id = str(row["id"])
    await q_sql.set_leaf_command(tx, batch_id, idx, command_id)
    leaves = await q_sql.leaves(tx, batch_id)
    await _release(tx, bus, leaves, leaves[idx])
    return command_id
