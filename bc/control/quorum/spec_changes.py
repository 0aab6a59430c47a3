"""Root-equivalent spec changes on the server: admin only, and with approvers registered, a quorum batch first.

`set_section` is `bc spec set` (the Admin `SetSpecSection`): it checks the
section as `bc.control.nodes.specs.section_mutation` does, then asks the one table,
`bc.protocol.root_equiv`, whether the change from the stored section is
root-equivalent. An operator's change that is goes no further (exit 6, the
reason in the sentence). An admin's is written at once while no approvers are
registered (a lab, as destructive commands are); once they exist it becomes a
batch of kind `spec.set` over the exact change, with one leaf
`(node, "spec.set", section_digest(section, content))` and the section in its
payload, and nothing else moves: the generation stays where it was until k
approvers signed with `bc approve sign` (which recomputes the leaf from the
payload itself). The batch is listed by `bc approve list` and the TUI like
every batch.

At the threshold, `apply_approved` writes the approved section (whatever the
section holds by then is replaced, as `bc spec set` replaces it) and puts the
batch's signatures and the leaf's proof in the body (`SectionApproval`), which
later generations carry forward while the section stays the same, so the node
can check the quorum itself (agent.spec_quorum). The batch's resolution
becomes `applied` in the same transaction as the write, so it is written once
whoever gets there first.

The approval (the k-th signature) and the write are two transactions: the
ApproveBatch call tries the write at once, but a store error there, or a
process that dies in between, leaves the batch approved and unwritten. So
`apply_pending` runs on every pass of the command sweeper (and so at start):
it writes every approved `spec.set` batch whose resolution is still empty.
A batch that can never be written (its node deleted, its payload unreadable)
gets the resolution `failed: why` and a `spec.root-change-failed` event
instead of being retried forever.

Writes that are not an operator's hand-written section — the access section
the server derives from grants and revocations (bc.control.trust.ssh), the devices
section reservations write — are not guarded here: their own paths decide who
may make them (a `root` grant is its own batch).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bc.control.base.actor import RANK, ROLES, Caller
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.nodes import specs
from bc.control.quorum import approvers as appr
from bc.control.quorum import batches as quorum
from bc.control.signing.signer import Signer
from bc.errors import BcError, Unauthenticated
from bc.pki import merkle
from bc.protocol import canonical, root_equiv
from bc.protocol.pb import common_pb2, spec_pb2
from bc.protocol.pb.session_pb2 import SectionApproval
from bc.seams.ids import ulid
from bc.store import Store, StoreError, Tx
from bc.store import quorum as q_sql

log = logging.getLogger("bc.control.quorum.spec_changes")

SPEC_BATCH_NOT_AFTER_S = 24 * 3600.0
"""How long a root-equivalent change waits for its quorum (approvals signed in it stay valid that long)."""
APPLIED = "applied"
FAILED = "failed"
PENDING_BATCH = 100
"""How many approved, unwritten batches one pass of `apply_pending` writes (the next pass takes the rest)."""


@dataclass(frozen=True)
class SetOutcome:
    write: specs.SpecWrite | None
    """The write, when the change was stored now."""
    batch_id: str = ""
    """The `spec.set` batch waiting for the quorum, when it was not."""


def _refusal(caller: Caller, section: str, reasons: list[str]) -> Unauthenticated:
    more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
    return Unauthenticated(
        f"this {section} change is root-equivalent (it {reasons[0]}{more}): it needs the admin role, and the"
        f" approvers' quorum once they exist; operator {caller.name} has the {caller.role} role"
    )


async def set_section(
    store: Store,
    bus: Bus,
    signer: Signer,
    rng: random.Random,
    node_id: str,
    section: str,
    section_json: str,
    caller: Caller,
) -> SetOutcome:
    """Replace one section, or (a root-equivalent change with approvers registered) open its batch."""
    mutate = specs.section_mutation(section, section_json)
    return await change_section(store, bus, signer, rng, node_id, section, mutate, caller)


async def change_section(
    store: Store,
    bus: Bus,
    signer: Signer,
    rng: random.Random,
    node_id: str,
    section: str,
    mutate: Callable[[spec_pb2.NodeSpec], None],
    caller: Caller,
    then: Callable[[Tx, SetOutcome], Awaitable[None]] | None = None,
) -> SetOutcome:
    """`set_section` with any change of the stored section (`mutate` reads it and may raise to refuse) under
    the same rules; `then` runs in the same transaction with the outcome (`bc metal enroll`'s machine row)."""
    now_ms = await store.now_ms()
    lock = store.for_update()
    async with store.transaction() as tx:
        stored, _generation = await specs.load_spec(tx, node_id, lock)
        wanted = spec_pb2.NodeSpec()
        wanted.CopyFrom(stored)
        mutate(wanted)
        reasons = root_equiv.changes(section, getattr(stored, section), getattr(wanted, section))
        if reasons and RANK[caller.role] < RANK[ROLES[-1]]:
            raise _refusal(caller, section, reasons)
        if not reasons or not await quorum.has_approvers(tx):
            outcome = SetOutcome(await specs.write_spec(tx, bus, signer, node_id, mutate, now_ms, lock=lock))
        else:
            content = getattr(wanted, section)
            outcome = SetOutcome(
                None, await _open_batch(tx, bus, rng, node_id, section, content, reasons, caller, now_ms)
            )
        if then is not None:
            await then(tx, outcome)
        return outcome


async def _open_batch(
    tx: Tx,
    bus: Bus,
    rng: random.Random,
    node_id: str,
    section: str,
    content: spec_pb2.NodeSpec,
    reasons: list[str],
    caller: Caller,
    now_ms: int,
) -> str:
    await quorum.check_can_approve(tx, caller.name)
    digest = root_equiv.section_digest(section, content)
    root = merkle.merkle_root([merkle.leaf_bytes(node_id, root_equiv.SPEC_BATCH_KIND, digest)])
    batch_id = "b-" + ulid(now_ms / 1000, rng)
    section_json = canonical.canonical_json(canonical.message_to_dict(content))
    payload = {"node_id": node_id, "section": section, "section_json": section_json}
    await q_sql.insert_batch(
        tx,
        id_=batch_id,
        kind=root_equiv.SPEC_BATCH_KIND,
        requested_by=caller.name,
        reason="; ".join(reasons)[:500],
        payload_json=canonical.canonical_json(payload),
        scope_root=root,
        threshold=await appr.threshold(tx),
        now_ms=now_ms,
        not_after_ms=now_ms + round(SPEC_BATCH_NOT_AFTER_S * 1000),
    )
    # No command runs for this leaf: the section is written when the batch is approved (apply_approved).
    await q_sql.insert_leaf(tx, batch_id, 0, node_id, root_equiv.SPEC_BATCH_KIND, digest, "")
    data = {"kind": root_equiv.SPEC_BATCH_KIND, "nodes": [node_id], "requested_by": caller.name, "section": section}
    await publish(tx, bus, "batch.created", batch_id, data | {"scope_root": root.hex()}, now_ms)
    return batch_id


def payload_of(payload_json: str) -> tuple[str, str, str]:
    """(node, section, section JSON) of a `spec.set` batch's payload; ValueError when it is not one."""
    doc = json.loads(payload_json or "{}")
    if not isinstance(doc, dict):
        raise ValueError("the payload is not an object")
    node_id, section, text = doc.get("node_id"), doc.get("section"), doc.get("section_json")
    if not isinstance(node_id, str) or not isinstance(section, str) or not isinstance(text, str):
        raise ValueError("the payload does not name a node, a section and its JSON")
    return node_id, section, text


async def apply_approved(store: Store, bus: Bus, signer: Signer, batch_id: str) -> specs.SpecWrite | None:
    """Write an approved `spec.set` batch's section with its approval, once; None for any other batch."""
    now_ms = await store.now_ms()
    lock = store.for_update()
    async with store.transaction() as tx:
        batch = await q_sql.get_batch(tx, batch_id, lock)
        if batch is None or str(batch["kind"]) != root_equiv.SPEC_BATCH_KIND or str(batch["state"]) != "approved":
            return None
        if str(batch["resolution"] or ""):
            return None  # written already (or resolved failed): each batch is written once
        node_id, section, section_json = payload_of(str(batch["payload_json"]))
        content = canonical.section_from_json(section, section_json)
        leaves = await q_sql.leaves(tx, batch_id)
        tree = merkle.MerkleTree(
            [merkle.leaf_bytes(str(r["node_id"]), str(r["kind"]), bytes(r["payload_digest"])) for r in leaves]
        )
        proof = common_pb2.BatchProof(leaf_index=0, tree_size=len(tree), path=tree.proof(0))
        approval = SectionApproval(
            section=section,
            batch_approval=await q_sql.approval_of(tx, batch_id) or b"",
            batch_proof=proof.SerializeToString(deterministic=True),
        )

        def mutate(spec: spec_pb2.NodeSpec) -> None:
            getattr(spec, section).CopyFrom(content)
            if content.ByteSize() == 0:
                spec.ClearField(section)  # type: ignore[arg-type,unused-ignore]

        w = await specs.write_spec(tx, bus, signer, node_id, mutate, now_ms, lock=lock, approvals=[approval])
        await q_sql.set_resolution(tx, batch_id, APPLIED)
        data = {"section": section, "generation": w.generation, "batch_id": batch_id}
        await publish(tx, bus, "spec.root-change-applied", node_id, data, now_ms)
        return w


async def apply_pending(store: Store, bus: Bus, signer: Signer) -> list[str]:
    """Write every approved `spec.set` batch not written yet (`apply_now` each); returns the ids written."""
    async with store.transaction(write=False) as tx:
        ids = await q_sql.approved_unresolved(tx, root_equiv.SPEC_BATCH_KIND, PENDING_BATCH)
    return [batch_id for batch_id in ids if await apply_now(store, bus, signer, batch_id) is not None]


async def apply_now(store: Store, bus: Bus, signer: Signer, batch_id: str) -> specs.SpecWrite | None:
    """`apply_approved`, never raising: a store error leaves the batch for the next `apply_pending` pass; a
    batch that can never be written is resolved `failed: why` with a `spec.root-change-failed` event."""
    try:
        w = await apply_approved(store, bus, signer, batch_id)
    except StoreError as e:
        log.warning("event=spec.root-change-retry batch_id=%s error=%s", batch_id, e)
        return None
    except (BcError, ValueError) as e:
        await _failed(store, bus, batch_id, getattr(e, "message", str(e)))
        return None
    if w is not None:
        log.info("event=spec.root-change-applied batch_id=%s generation=%d", batch_id, w.generation)
    return w


async def _failed(store: Store, bus: Bus, batch_id: str, why: str) -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        batch = await q_sql.get_batch(tx, batch_id, store.for_update())
        if batch is None or str(batch["resolution"] or ""):
            return  # another pass settled it meanwhile
        await q_sql.set_resolution(tx, batch_id, f"{FAILED}: {why}"[:500])
        await publish(tx, bus, "spec.root-change-failed", batch_id, {"reason": why}, now_ms)
    log.warning("event=spec.root-change-failed batch_id=%s reason=%s", batch_id, why)
