"""The destructive-batch quorum on the server: batches and their approvals (reference: the quorum).

A batch is one destructive kind on a list of nodes with one payload. Its
leaves `(node, kind, payload digest)` are hashed into a Merkle tree whose root
is the batch's scope; its commands are enqueued `held` in the same
transaction. Approvers sign the scope (with the batch id, the requester and an
expiry) with their own keys, each decision sent under the certificate of the
operator the key is registered to; once `threshold` distinct approvers (of
distinct operators) other than the requester have signed, the batch is approved: each command is released
with its leaf's proof, and the gateway sends it with the batch's approvals. A
rejection by any approver fails the batch and cancels its commands.

The server checks every signature it stores, but it is not the one to trust:
the agent checks them again against the approver keys in its own trust
bundle, so a compromised control plane (which holds a worker key) still
cannot run a destructive command on its own. The approver set itself lives in
`bc.control.quorum.approvers`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.commands import queue as cmds
from bc.control.quorum import approvers as appr
from bc.control.quorum import views as quorum_views
from bc.control.signing.signer import Signer
from bc.errors import Conflict, NotFound, UsageError
from bc.pki import merkle
from bc.pki import quorum as q
from bc.protocol import kinds
from bc.protocol.pb import common_pb2
from bc.seams.ids import ulid
from bc.store import Row, Store, Tx
from bc.store import quorum as q_sql

DEFAULT_BATCH_NOT_AFTER_S = 3600.0
MAX_BATCH_LEAVES = 100_000


# -- batches -----------------------------------------------------------------------


@dataclass(frozen=True)
class BatchRequest:
    kind: str
    node_ids: list[str]
    payload_json: str = ""
    reason: str = ""
    not_after_s: float = DEFAULT_BATCH_NOT_AFTER_S


async def create_batch(
    store: Store, bus: Bus, signer: Signer, req: BatchRequest, requested_by: str, rng: random.Random
) -> str:
    """Store a batch and enqueue its commands held, in one transaction; returns the batch id."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        return await create_batch_in(tx, bus, signer, req, requested_by, rng, now_ms)


async def create_batch_in(
    tx: Tx,
    bus: Bus,
    signer: Signer,
    req: BatchRequest,
    requested_by: str,
    rng: random.Random,
    now_ms: int,
    *,
    dag_id: str = "",
) -> str:
    """`create_batch` in the caller's transaction. A batch a job DAG owns (`dag_id`) releases nothing when
    approved: each of the DAG's Command nodes releases its own leaf (`release_leaf`) when it runs."""
    kind = kinds.get(req.kind)
    if kind is None:
        raise UsageError(f"unknown command kind {req.kind!r}")
    cmds.check_batch_size(req.kind, req.node_ids, req.payload_json)
    if not kind.destructive:
        raise UsageError(f"{req.kind} is not destructive: run it with `bc cmd run`, it needs no batch")
    nodes = [n.strip() for n in req.node_ids if n.strip()]
    if not nodes:
        raise UsageError("a batch needs at least one node (--nodes n1,n2)")
    if len(set(nodes)) != len(nodes):
        raise UsageError("a node appears twice in --nodes; each node gets one leaf")
    if len(nodes) > MAX_BATCH_LEAVES:
        raise UsageError(f"a batch holds at most {MAX_BATCH_LEAVES} leaves")
    if len(req.reason) > 500:
        raise UsageError("the reason is longer than 500 characters")
    payload = cmds.payload_from_json(req.kind, req.payload_json or "{}")
    probe = cmds.EnqueueRequest(nodes[0], req.kind, payload, not_after_s=req.not_after_s)
    cmds.check_request(probe)
    payload = cmds.payload_for(req.kind, payload)
    digest = merkle.payload_digest(payload.type_url, payload.value)
    tree = merkle.MerkleTree([merkle.leaf_bytes(n, req.kind, digest) for n in nodes])
    batch_id = "b-" + ulid(now_ms / 1000, rng)
    await check_can_approve(tx, requested_by)
    k = await appr.threshold(tx)
    await q_sql.insert_batch(
        tx,
        id_=batch_id,
        kind=req.kind,
        requested_by=requested_by,
        reason=req.reason,
        payload_json=req.payload_json or "{}",
        scope_root=tree.root,
        threshold=k,
        now_ms=now_ms,
        not_after_ms=now_ms + round(req.not_after_s * 1000),
        dag_id=dag_id,
    )
    for idx, node_id in enumerate(nodes):
        er = cmds.EnqueueRequest(
            node_id,
            req.kind,
            payload,
            not_after_s=req.not_after_s,
            idempotency_key=f"batch:{batch_id}:{idx}",
            batch_id=batch_id,
            requested_by=requested_by,
        )
        row = await cmds.enqueue_in(tx, bus, signer, er, kind, payload, now_ms, rng, held=True)
        await q_sql.insert_leaf(tx, batch_id, idx, node_id, req.kind, digest, str(row["id"]))
    data: dict[str, object] = {
        "kind": req.kind,
        "nodes": nodes,
        "requested_by": requested_by,
        "scope_root": tree.root.hex(),
    }
    if dag_id:
        data["dag_id"] = dag_id
    await publish(tx, bus, "batch.created", batch_id, data, now_ms)
    return batch_id


async def check_can_approve(tx: Tx, requested_by: str) -> None:
    """Conflict unless approvers exist and at least k of them are someone other than the requester."""
    approvers = appr.approver_keys(await q_sql.list_approvers(tx))
    if not approvers:
        raise Conflict("no approvers are configured: add them first (bc approve keygen, bc approvers add)")
    k = await appr.threshold(tx)
    eligible = {a.operator or a.key_id for a in approvers if not q.is_requesters(a, requested_by)}
    if len(eligible) < k:
        raise Conflict(
            f"the threshold is {k} but only {len(eligible)} approver(s) other than {requested_by}'s own exist:"
            " this batch could never be approved"
        )


async def approval_progress(
    tx: Tx, batch_id: str, now_ms: int, *, count: q.CountApprovals = q.count_approvals
) -> tuple[int, int] | None:
    """(approvals that count now, k) of a batch still waiting for its quorum; None once it is not waiting.

    Counted by the rule that decides it (`quorum_views.batch_info`): an expired or removed approver's does not count.
    `count` is that rule (a seam: `bc sim --break quorum-duplicate-signer` hands a broken one).
    """
    batch = await q_sql.get_batch(tx, batch_id)
    if batch is None or str(batch["state"]) != "pending" or int(batch["not_after_ms"]) <= now_ms:
        return None
    approval = quorum_views.batch_approval(
        batch, await q_sql.count_leaves(tx, batch_id), await q_sql.decisions(tx, batch_id)
    )
    tally = count(approval, appr.approver_keys(await q_sql.list_approvers(tx)), now_ms)
    return len(tally.counted), int(batch["threshold"])


async def has_approvers(tx: Tx) -> bool:
    return bool(await q_sql.list_approvers(tx))


async def decide(
    store: Store,
    bus: Bus,
    batch_id: str,
    key_id: str,
    signature: bytes,
    *,
    approve: bool,
    caller: str,
    expires_at_ms: int = 0,
    reason: str = "",
    count: q.CountApprovals = q.count_approvals,
) -> None:
    """Record one approver's signed decision; approve the batch at the threshold, fail it on a rejection.

    `caller` is the operator whose certificate carried it: a key registered to another operator is refused.
    `count` is the rule that decides whether the approvals reach k (`bc.pki.quorum.count_approvals`; a seam the
    simulator's `--break quorum-duplicate-signer` swaps, as the node's `AgentParts.quorum_count`).
    """
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        batch = await q_sql.get_batch(tx, batch_id, store.for_update())
        if batch is None:
            raise NotFound(f"no batch named {batch_id!r}")
        if str(batch["state"]) != "pending":
            raise Conflict(f"batch {batch_id} is already {batch['state']}")
        if int(batch["not_after_ms"]) <= now_ms:
            raise Conflict(f"batch {batch_id} expired; its commands will not run")
        row = await q_sql.approver_by(tx, key_id=key_id)
        if row is None:
            raise UsageError(f"the key {key_id} is not an approver key of this server (bc approvers list)")
        approver = appr.approver_keys([row])[0]
        name = approver.name
        root = bytes(batch["scope_root"])
        requested_by = str(batch["requested_by"])
        appr.check_holder(approver, caller)
        if approve:
            appr.check_approver(approver, caller, requested_by, f"batch {batch_id}")
            if expires_at_ms <= now_ms:
                raise UsageError("the approval has already expired; sign again")
            leaf_count = await q_sql.count_leaves(tx, batch_id)
            msg = q.approval_message(batch_id, root, leaf_count, requested_by, expires_at_ms)
        else:
            if not reason.strip():
                raise UsageError("a rejection needs a reason (--reason)")
            msg = q.rejection_message(batch_id, root, reason)
        if not q.verify(bytes(approver.public_key), msg, signature):
            raise UsageError(f"the signature does not verify with {name}'s key for this batch's scope")
        stored = await q_sql.insert_decision(
            tx,
            batch_id=batch_id,
            key_id=key_id,
            name=name,
            operator=caller,
            decision="approve" if approve else "reject",
            signature=signature,
            expires_at_ms=expires_at_ms,
            reason=reason,
            now_ms=now_ms,
        )
        if not stored:
            raise Conflict(f"{name} has already decided on batch {batch_id}")
        data = {"key_id": key_id, "name": name, "expires_at_ms": expires_at_ms, "reason": reason}
        await publish(tx, bus, "batch.approval" if approve else "batch.rejection", batch_id, data, now_ms)
        dag_id = str(batch["dag_id"] or "")
        if dag_id:
            # A job waiting for this batch shows how many have signed: its watchers wake on its own events.
            await publish(tx, bus, "job.approval", dag_id, {"batch_id": batch_id, "name": name}, now_ms)
        if approve:
            await _maybe_approve(tx, bus, batch, now_ms, count)
        else:
            await _reject(tx, bus, batch_id, name, reason, now_ms)


async def _maybe_approve(
    tx: Tx, bus: Bus, batch: Row, now_ms: int, count: q.CountApprovals = q.count_approvals
) -> None:
    batch_id = str(batch["id"])
    leaves = await q_sql.leaves(tx, batch_id)
    # The same approval and the same rule as the view shows (`bc.control.quorum.views.batch_info`).
    approval = quorum_views.batch_approval(batch, len(leaves), await q_sql.decisions(tx, batch_id))
    tally = count(approval, appr.approver_keys(await q_sql.list_approvers(tx)), now_ms)
    if len(tally.counted) < int(batch["threshold"]):
        return
    # The nodes get only the signatures that count (an expired or removed approver's would be refused anyway).
    kept = [sig for sig in approval.signatures if sig.key_id in tally.counted]
    del approval.signatures[:]
    approval.signatures.extend(kept)
    await q_sql.settle_batch(tx, batch_id, "approved", approval.SerializeToString(deterministic=True), now_ms)
    if not str(batch["dag_id"] or ""):
        # A standalone batch releases every leaf now; a job's batch leaves that to its Command nodes.
        for r in leaves:
            await _release(tx, bus, leaves, r)
    await publish(tx, bus, "batch.approved", batch_id, {"approvers": tally.counted}, now_ms)


async def _release(tx: Tx, bus: Bus, leaves: list[Row], leaf: Row) -> bool:
    """Release one held leaf command with its Merkle proof; False when it was not held any more."""
    tree = merkle.MerkleTree(
        [merkle.leaf_bytes(str(r["node_id"]), str(r["kind"]), bytes(r["payload_digest"])) for r in leaves]
    )
    idx = int(leaf["idx"])
    proof = common_pb2.BatchProof(leaf_index=idx, tree_size=len(tree), path=tree.proof(idx))
    if await q_sql.release_command(tx, str(leaf["command_id"]), proof.SerializeToString(deterministic=True)):
        tx.on_commit(partial(bus.node_changed, str(leaf["node_id"])))
        return True
    return False


async def release_leaf(tx: Tx, bus: Bus, batch_id: str, node_id: str) -> str:
    """Release an approved job batch's leaf for `node_id`; returns its command id (a repeat is harmless)."""
    batch = await q_sql.get_batch(tx, batch_id)
    if batch is None or str(batch["state"]) != "approved":
        state = "missing" if batch is None else str(batch["state"])
        raise Conflict(f"batch {batch_id} is {state}, not approved: its leaf for {node_id} cannot run")
    leaves = await q_sql.leaves(tx, batch_id)
    leaf = next((r for r in leaves if str(r["node_id"]) == node_id), None)
    if leaf is None:
        raise Conflict(f"batch {batch_id} has no leaf for node {node_id}")
    await _release(tx, bus, leaves, leaf)
    return str(leaf["command_id"])


async def withdraw(tx: Tx, bus: Bus, batch_id: str, reason: str, now_ms: int) -> bool:
    """A job no longer needs its batch: a pending or approved batch becomes `withdrawn` and its leaves
    not yet released are cancelled (released ones run and report). False when it was already settled."""
    batch = await q_sql.get_batch(tx, batch_id)
    if batch is None or str(batch["state"]) not in ("pending", "approved"):
        return False
    leaves = await q_sql.leaves(tx, batch_id)
    if str(batch["state"]) == "approved" and not [r for r in leaves if await q_sql.is_held(tx, str(r["command_id"]))]:
        return False  # every leaf was used: the batch did its work and stays approved
    await q_sql.withdraw_batch(tx, batch_id, now_ms)
    for r in leaves:
        cid, node_id = str(r["command_id"]), str(r["node_id"])
        if await q_sql.is_held(tx, cid):
            await cmds.settle_by_server(tx, bus, cid, node_id, "cancelled", "batch-withdrawn", now_ms, ("pending",))
    await publish(tx, bus, "batch.withdrawn", batch_id, {"reason": reason}, now_ms)
    return True


async def resolve(tx: Tx, bus: Bus, batch_id: str, outcome: str, reason: str, now_ms: int) -> None:
    """Record how the owning DAG ended (done, failed, cancelled), withdrawing whatever it did not use."""
    withdrawn = await withdraw(tx, bus, batch_id, reason or f"the job {outcome}", now_ms)
    await q_sql.set_resolution(tx, batch_id, outcome)
    await publish(tx, bus, "batch.resolved", batch_id, {"outcome": outcome, "withdrawn": withdrawn}, now_ms)


async def _reject(tx: Tx, bus: Bus, batch_id: str, name: str, reason: str, now_ms: int) -> None:
    await q_sql.settle_batch(tx, batch_id, "rejected", None, now_ms)
    for r in await q_sql.leaves(tx, batch_id):
        cid, node_id = str(r["command_id"]), str(r["node_id"])
        if cid:  # a metal.bulk leaf has none until its step releases it (bc.control.quorum.bulk)
            await cmds.settle_by_server(tx, bus, cid, node_id, "cancelled", "batch-rejected", now_ms, ("pending",))
    await publish(tx, bus, "batch.rejected", batch_id, {"by": name, "reason": reason}, now_ms)
