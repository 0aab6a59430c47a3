"""The quorum on the server (bc/control/quorum/batches.py) against the real SQLite store, bus and virtual clock.

A batch is stored with its commands held in one transaction; approvers' signed
decisions are checked and stored; at k the commands are released with proofs
the node can check, and the stored approval passes the same rule the node
applies; one rejection cancels them all.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import any_pb2

from agent.quorum import check_batch
from bc.control.base.bus import Bus
from bc.control.commands.queue import EnqueueRequest, enqueue
from bc.control.quorum import approvers as appr
from bc.control.quorum import batches as quorum
from bc.control.signing.signer import KeySigner, NullSigner, Signer
from bc.errors import Conflict, NotFound, UsageError
from bc.pki import merkle
from bc.pki import quorum as q
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import SigningKeys
from bc.protocol.pb import common_pb2, session_pb2
from bc.seams.clock import LoopClock
from bc.store import Row
from bc.store import commands as cmd_sql
from bc.store import events as events_sql
from bc.store import quorum as q_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance
from tests.unit.control.quorum_setup import RNG, add_operator, b64, change, install

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner
SECRETS = SystemSecrets()

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]
Count = Callable[[str], Awaitable[int]]

REQUESTER = "ops"
PAYLOAD = json.dumps({"gpu_uuids": ["GPU-aaaa", "GPU-bbbb"]})
NODES = ["n1", "n2", "n3"]


def raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def kid(key: ed25519.Ed25519PrivateKey) -> str:
    return q.key_id(raw(key))


@pytest.fixture
def keys() -> list[ed25519.Ed25519PrivateKey]:
    return [ed25519.Ed25519PrivateKey.generate() for _ in range(4)]


@pytest.fixture
async def approvers(store: InlineSqliteStore, bus: Bus, keys: list[ed25519.Ed25519PrivateKey]) -> list[str]:
    """alice, bob and carol are approvers (k = 2), each held by the operator of that name; keys[3] is nobody's."""
    names = ["alice", "bob", "carol"]
    await install(store, bus, dict(zip(names, keys, strict=False)), k=2)
    await add_operator(store, REQUESTER)
    return names


async def holder(store: InlineSqliteStore, key: ed25519.Ed25519PrivateKey) -> str:
    """The operator whose certificate an approval by `key` must come under (itself when it is no approver's)."""
    async with store.transaction(write=False) as tx:
        row = await q_sql.approver_by(tx, key_id=kid(key))
    return str(row["operator"]) if row is not None else "stranger"


def named(keys: list[ed25519.Ed25519PrivateKey]) -> dict[str, ed25519.Ed25519PrivateKey]:
    return dict(zip(["alice", "bob", "carol", REQUESTER], keys, strict=False))


@pytest.fixture
async def nodes(add_node: AddNode) -> list[str]:
    for n in NODES:
        await add_node(n, profile=None)
    return NODES


async def create(
    store: InlineSqliteStore, bus: Bus, node_ids: list[str] | None = None, signer: Signer = SIGNER, **kw: Any
) -> tuple[str, Row, list[Row]]:
    req = quorum.BatchRequest(kind=kw.pop("kind", "gpu.reset"), node_ids=node_ids or NODES, payload_json=PAYLOAD, **kw)
    batch_id = await quorum.create_batch(store, bus, signer, req, REQUESTER, random.Random(7))
    batch, leaves = await read_batch(store, batch_id)
    return batch_id, batch, leaves


async def read_batch(store: InlineSqliteStore, batch_id: str) -> tuple[Row, list[Row]]:
    async with store.transaction(write=False) as tx:
        batch = await q_sql.get_batch(tx, batch_id)
        leaves = await q_sql.leaves(tx, batch_id)
    assert batch is not None
    return batch, leaves


async def command(store: InlineSqliteStore, command_id: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await cmd_sql.get(tx, command_id)
    assert row is not None
    return row


async def dispatchable(store: InlineSqliteStore, node_id: str) -> list[str]:
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        return [str(r["id"]) for r in await cmd_sql.pending_for_node(tx, node_id, now_ms)]


async def events(store: InlineSqliteStore, prefix: str = "batch.") -> list[tuple[str, str, dict[str, Any]]]:
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 10_000, prefix)
    return [(str(r["type"]), str(r["subject"]), json.loads(str(r["data"]))) for r in rows]


def approval_sig(batch: Row, leaves: list[Row], key: ed25519.Ed25519PrivateKey, expires_at_ms: int) -> bytes:
    msg = q.approval_message(
        str(batch["id"]), bytes(batch["scope_root"]), len(leaves), str(batch["requested_by"]), expires_at_ms
    )
    return key.sign(msg)


async def approve(
    store: InlineSqliteStore,
    bus: Bus,
    batch: Row,
    leaves: list[Row],
    key: ed25519.Ed25519PrivateKey,
    expires_in_ms: int = 600_000,
) -> int:
    expires = await store.now_ms() + expires_in_ms
    sig = approval_sig(batch, leaves, key, expires)
    caller = await holder(store, key)
    await quorum.decide(store, bus, str(batch["id"]), kid(key), sig, approve=True, caller=caller, expires_at_ms=expires)
    return expires


async def reject(
    store: InlineSqliteStore, bus: Bus, batch: Row, key: ed25519.Ed25519PrivateKey, reason: str = "wrong nodes"
) -> None:
    sig = key.sign(q.rejection_message(str(batch["id"]), bytes(batch["scope_root"]), reason))
    caller = await holder(store, key)
    await quorum.decide(store, bus, str(batch["id"]), kid(key), sig, approve=False, caller=caller, reason=reason)


def leaf_of(body: session_pb2.CommandBody) -> bytes:
    return merkle.leaf_bytes(body.node_id, body.kind, merkle.payload_digest(body.payload.type_url, body.payload.value))


# -- create_batch -----------------------------------------------------------------------------------


async def test_create_batch_enqueues_held_commands_that_are_never_dispatchable(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str]
) -> None:
    batch_id, batch, leaves = await create(store, bus, reason="XID 79")
    assert batch_id.startswith("b-")
    assert (batch["state"], batch["kind"], batch["requested_by"], batch["reason"]) == (
        "pending",
        "gpu.reset",
        REQUESTER,
        "XID 79",
    )
    assert int(batch["threshold"]) == 2 and batch["approval"] is None
    assert [(int(r["idx"]), str(r["node_id"])) for r in leaves] == list(enumerate(NODES))
    for leaf in leaves:
        row = await command(store, str(leaf["command_id"]))
        assert (row["state"], int(row["held"]), row["batch_id"], row["batch_proof"]) == ("pending", 1, batch_id, None)
        assert row["node_id"] == leaf["node_id"] and row["kind"] == "gpu.reset"
        assert row["idempotency_key"] == f"batch:{batch_id}:{leaf['idx']}"
        body = session_pb2.CommandBody.FromString(bytes(row["body"]))
        assert body.batch_id == batch_id and body.node_id == leaf["node_id"]
    # Held commands are not dispatchable; an ordinary command on the same node is.
    lone = await enqueue(store, bus, SIGNER, EnqueueRequest("n1", "inventory.refresh", any_pb2.Any()), RNG)
    assert await dispatchable(store, "n1") == [str(lone["id"])]
    assert await dispatchable(store, "n2") == [] and await dispatchable(store, "n3") == []


async def test_the_leaves_and_root_are_the_merkle_tree_of_the_command_bodies(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str]
) -> None:
    _, batch, leaves = await create(store, bus)
    bodies = [
        session_pb2.CommandBody.FromString(bytes((await command(store, str(r["command_id"])))["body"])) for r in leaves
    ]
    # The digest the server stored is the one the node computes from the body it receives.
    for leaf, body in zip(leaves, bodies, strict=True):
        assert bytes(leaf["payload_digest"]) == merkle.payload_digest(body.payload.type_url, body.payload.value)
        assert leaf["kind"] == body.kind and leaf["node_id"] == body.node_id
    assert bytes(batch["scope_root"]) == merkle.merkle_root([leaf_of(b) for b in bodies])
    data = {
        "kind": "gpu.reset",
        "nodes": NODES,
        "requested_by": REQUESTER,
        "scope_root": bytes(batch["scope_root"]).hex(),
    }
    assert await events(store) == [("batch.created", str(batch["id"]), data)]


@pytest.mark.parametrize(
    ("node_ids", "error", "fragment"),
    [
        (["n1", "n2", "ghost"], NotFound, "no node named 'ghost'"),  # fails after two commands were inserted
        (["n1", "site-1"], UsageError, "does not run on node site-1"),
    ],
)
async def test_a_failure_midway_leaves_nothing(
    store: InlineSqliteStore,
    bus: Bus,
    approvers: list[str],
    nodes: list[str],
    add_node: AddNode,
    count: Count,
    node_ids: list[str],
    error: type[Exception],
    fragment: str,
) -> None:
    await add_node("site-1", profile=None, role="site")
    before = await count("events")
    with pytest.raises(error, match=fragment):
        await create(store, bus, node_ids)
    for table in ("batches", "batch_leaves", "commands"):
        assert await count(table) == 0, table
    assert await count("events") == before
    assert await dispatchable(store, "n1") == []


@pytest.mark.parametrize(
    ("kw", "error", "fragment"),
    [
        ({"kind": "diag.nvml"}, UsageError, "diag.nvml is not destructive"),
        ({"kind": "inventory.refresh"}, UsageError, "is not destructive"),
        ({"kind": "no.such.kind"}, UsageError, "unknown command kind"),
        ({"node_ids": ["n1", "n1"]}, UsageError, "a node appears twice"),
        ({"node_ids": [" ", ""]}, UsageError, "at least one node"),
        ({"not_after_s": 0.5}, UsageError, "not_after must be between"),
        ({"reason": "x" * 501}, UsageError, "longer than 500"),
    ],
)
async def test_bad_requests_are_refused_and_store_nothing(
    store: InlineSqliteStore,
    bus: Bus,
    approvers: list[str],
    nodes: list[str],
    count: Count,
    kw: dict[str, Any],
    error: type[Exception],
    fragment: str,
) -> None:
    kw = dict(kw)  # the parameter is shared by every store's run: never pop from it
    node_ids = kw.pop("node_ids", None)
    with pytest.raises(error, match=fragment):
        await create(store, bus, node_ids, **kw)
    assert await count("batches") == 0 and await count("commands") == 0


async def test_a_bad_payload_is_refused(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str], count: Count
) -> None:
    req = quorum.BatchRequest(kind="gpu.reset", node_ids=["n1"], payload_json='{"gpu_uuid": "typo"}')
    with pytest.raises(UsageError, match="not a valid GpuResetRequest"):
        await quorum.create_batch(store, bus, SIGNER, req, REQUESTER, RNG)
    assert await count("batches") == 0


async def test_a_batch_needs_approvers_and_a_reachable_threshold(
    store: InlineSqliteStore, bus: Bus, nodes: list[str], keys: list[ed25519.Ed25519PrivateKey], count: Count
) -> None:
    with pytest.raises(Conflict, match="no approvers are configured"):
        await create(store, bus)
    # Two approvers, one of them the requester's: k = 2 can never be reached.
    signers = {REQUESTER: keys[0], "bob": keys[1]}
    await install(store, bus, signers, k=2)
    with pytest.raises(Conflict, match=f"only 1 approver\\(s\\) other than {REQUESTER}'s own"):
        await create(store, bus)
    assert await count("batches") == 0 and await count("commands") == 0
    await change(store, bus, appr.SetThreshold(1), signers)
    batch_id, _, _ = await create(store, bus)
    assert batch_id


# -- decide: what is refused -------------------------------------------------------------------------


async def test_a_bad_signature_is_refused_and_nothing_is_stored(
    store: InlineSqliteStore,
    bus: Bus,
    approvers: list[str],
    nodes: list[str],
    keys: list[ed25519.Ed25519PrivateKey],
    count: Count,
) -> None:
    batch_id, batch, leaves = await create(store, bus)
    expires = await store.now_ms() + 60_000
    forged = keys[3].sign(  # a real signature, by a key that is not alice's
        q.approval_message(batch_id, bytes(batch["scope_root"]), len(leaves), REQUESTER, expires)
    )
    with pytest.raises(UsageError, match="does not verify with alice's key"):
        await quorum.decide(
            store, bus, batch_id, kid(keys[0]), forged, approve=True, caller="alice", expires_at_ms=expires
        )
    # alice's own signature over another scope (another leaf count) does not verify for this batch either.
    wrong = keys[0].sign(q.approval_message(batch_id, bytes(batch["scope_root"]), len(leaves) + 1, REQUESTER, expires))
    with pytest.raises(UsageError, match="does not verify"):
        await quorum.decide(
            store, bus, batch_id, kid(keys[0]), wrong, approve=True, caller="alice", expires_at_ms=expires
        )
    # Signed for one expiry, sent with a later one.
    sig = approval_sig(batch, leaves, keys[0], expires)
    with pytest.raises(UsageError, match="does not verify"):
        await quorum.decide(
            store, bus, batch_id, kid(keys[0]), sig, approve=True, caller="alice", expires_at_ms=expires + 1
        )
    assert await count("batch_approvals") == 0
    assert [e for e in await events(store) if e[0] != "batch.created"] == []


async def test_an_unknown_key_is_refused(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str], keys: list[ed25519.Ed25519PrivateKey]
) -> None:
    batch_id, batch, leaves = await create(store, bus)
    with pytest.raises(UsageError, match="is not an approver key of this server"):
        await approve(store, bus, batch, leaves, keys[3])
    with pytest.raises(UsageError, match="is not an approver key"):
        await reject(store, bus, batch, keys[3])
    assert (await read_batch(store, batch_id))[0]["state"] == "pending"


async def test_the_requesters_own_approval_is_refused(
    store: InlineSqliteStore, bus: Bus, nodes: list[str], keys: list[ed25519.Ed25519PrivateKey], count: Count
) -> None:
    await install(store, bus, {REQUESTER: keys[0], "bob": keys[1], "carol": keys[2]})
    batch_id, batch, leaves = await create(store, bus)
    with pytest.raises(UsageError, match=f"{REQUESTER} asked for batch {batch_id}"):
        await approve(store, bus, batch, leaves, keys[0])
    assert await count("batch_approvals") == 0


async def test_a_second_decision_by_the_same_key_is_refused(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str], keys: list[ed25519.Ed25519PrivateKey]
) -> None:
    batch_id, batch, leaves = await create(store, bus)
    await approve(store, bus, batch, leaves, keys[0])
    with pytest.raises(Conflict, match=f"alice has already decided on batch {batch_id}"):
        await approve(store, bus, batch, leaves, keys[0])
    with pytest.raises(Conflict, match="already decided"):
        await reject(store, bus, batch, keys[0])  # nor can alice turn her approval into a rejection
    batch, _ = await read_batch(store, batch_id)
    assert batch["state"] == "pending"
    for leaf in leaves:
        assert int((await command(store, str(leaf["command_id"])))["held"]) == 1


async def test_an_already_expired_approval_is_refused(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str], keys: list[ed25519.Ed25519PrivateKey]
) -> None:
    _, batch, leaves = await create(store, bus)
    with pytest.raises(UsageError, match="already expired"):
        await approve(store, bus, batch, leaves, keys[0], expires_in_ms=0)


async def test_an_expired_batch_takes_no_decision(
    store: InlineSqliteStore,
    bus: Bus,
    clock: LoopClock,
    approvers: list[str],
    nodes: list[str],
    keys: list[ed25519.Ed25519PrivateKey],
) -> None:
    batch_id, batch, leaves = await create(store, bus, not_after_s=60)
    await approve(store, bus, batch, leaves, keys[0])
    await advance(60)
    with pytest.raises(Conflict, match=f"batch {batch_id} expired"):
        await approve(store, bus, batch, leaves, keys[1])
    with pytest.raises(Conflict, match="expired"):
        await reject(store, bus, batch, keys[2])
    batch, _ = await read_batch(store, batch_id)
    assert batch["state"] == "pending" and batch["approval"] is None
    assert await dispatchable(store, "n1") == []


async def test_an_unknown_batch_is_not_found(
    store: InlineSqliteStore, bus: Bus, keys: list[ed25519.Ed25519PrivateKey]
) -> None:
    with pytest.raises(NotFound, match="no batch named 'b-nope'"):
        await quorum.decide(
            store, bus, "b-nope", kid(keys[0]), b"x" * 64, approve=True, caller="alice", expires_at_ms=1
        )


# -- decide: rejection -------------------------------------------------------------------------------


async def test_one_rejection_fails_the_batch_and_cancels_its_held_commands(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str], keys: list[ed25519.Ed25519PrivateKey]
) -> None:
    batch_id, batch, leaves = await create(store, bus)
    await approve(store, bus, batch, leaves, keys[0])
    with pytest.raises(UsageError, match="needs a reason"):
        await reject(store, bus, batch, keys[1], reason="  ")
    # A rejection signed over another reason does not verify.
    sig = keys[1].sign(q.rejection_message(batch_id, bytes(batch["scope_root"]), "fine by me"))
    with pytest.raises(UsageError, match="does not verify"):
        await quorum.decide(store, bus, batch_id, kid(keys[1]), sig, approve=False, caller="bob", reason="wrong nodes")

    await reject(store, bus, batch, keys[1], reason="wrong nodes")
    batch, _ = await read_batch(store, batch_id)
    assert batch["state"] == "rejected" and batch["approval"] is None and batch["settled_at_ms"] is not None
    for leaf in leaves:
        row = await command(store, str(leaf["command_id"]))
        assert (row["state"], row["reason"], row["batch_proof"]) == ("cancelled", "batch-rejected", None)
    for n in NODES:
        assert await dispatchable(store, n) == []
    with pytest.raises(Conflict, match="already rejected"):
        await approve(store, bus, batch, leaves, keys[2])

    seen = await events(store)
    assert [e[0] for e in seen] == ["batch.created", "batch.approval", "batch.rejection", "batch.rejected"]
    assert seen[-1][2] == {"by": "bob", "reason": "wrong nodes"}
    settled = [e for e in await events(store, "command.settled") if e[1] in {str(r["command_id"]) for r in leaves}]
    assert sorted(e[2]["node_id"] for e in settled) == NODES
    assert {(e[2]["state"], e[2]["reason"]) for e in settled} == {("cancelled", "batch-rejected")}


# -- decide: approval ----------------------------------------------------------------------------------


async def test_the_kth_approval_releases_every_command_with_a_proof_that_verifies(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str], keys: list[ed25519.Ed25519PrivateKey]
) -> None:
    batch_id, batch, leaves = await create(store, bus)
    bodies_before = {str(r["command_id"]): bytes((await command(store, str(r["command_id"])))["body"]) for r in leaves}

    await approve(store, bus, batch, leaves, keys[1])
    batch, _ = await read_batch(store, batch_id)
    assert batch["state"] == "pending" and batch["approval"] is None
    for n in NODES:
        assert await dispatchable(store, n) == []

    await approve(store, bus, batch, leaves, keys[2])
    batch, leaves = await read_batch(store, batch_id)
    assert batch["state"] == "approved" and batch["settled_at_ms"] is not None
    root = bytes(batch["scope_root"])

    approval = common_pb2.BatchApproval.FromString(bytes(batch["approval"]))
    assert (approval.batch_id, approval.scope_root, approval.requested_by, approval.leaf_count) == (
        batch_id,
        root,
        REQUESTER,
        len(NODES),
    )
    async with store.transaction(write=False) as tx:
        bundle_keys = appr.approver_keys(await q_sql.list_approvers(tx))
    tally = q.count_approvals(approval, bundle_keys, await store.now_ms())
    assert sorted(tally.counted) == sorted([kid(keys[1]), kid(keys[2])]) and tally.refused == []
    bundle = common_pb2.TrustBundle(approver_keys=bundle_keys, quorum_k=2)

    for leaf in leaves:
        cid, node_id = str(leaf["command_id"]), str(leaf["node_id"])
        row = await command(store, cid)
        assert int(row["held"]) == 0 and row["state"] == "pending"
        assert bytes(row["body"]) == bodies_before[cid]  # released as signed: the proof travels beside the body
        assert await dispatchable(store, node_id) == [cid]
        proof = common_pb2.BatchProof.FromString(bytes(row["batch_proof"]))
        body = session_pb2.CommandBody.FromString(bytes(row["body"]))
        assert (proof.leaf_index, proof.tree_size) == (int(leaf["idx"]), len(NODES))
        assert merkle.verify_proof(leaf_of(body), proof.leaf_index, proof.tree_size, list(proof.path), root)
        # What the gateway sends passes the node's own check.
        cmd = session_pb2.Command(
            envelope=common_pb2.Envelope(body=bytes(row["body"])),
            batch_approval=bytes(batch["approval"]),
            batch_proof=bytes(row["batch_proof"]),
        )
        why, _, _ = check_batch(cmd, body, bundle, await store.now_ms())
        assert why is None, why

    with pytest.raises(Conflict, match="already approved"):
        await approve(store, bus, batch, leaves, keys[0])
    seen = await events(store)
    assert [e[0] for e in seen] == ["batch.created", "batch.approval", "batch.approval", "batch.approved"]
    assert [e[2]["name"] for e in seen[1:3]] == ["bob", "carol"]
    assert seen[-1][1] == batch_id and sorted(seen[-1][2]["approvers"]) == sorted([kid(keys[1]), kid(keys[2])])


async def test_an_approval_that_expired_before_the_kth_does_not_count(
    store: InlineSqliteStore,
    bus: Bus,
    clock: LoopClock,
    approvers: list[str],
    nodes: list[str],
    keys: list[ed25519.Ed25519PrivateKey],
) -> None:
    batch_id, batch, leaves = await create(store, bus)
    await approve(store, bus, batch, leaves, keys[0], expires_in_ms=1_000)
    await advance(1.0)
    await approve(store, bus, batch, leaves, keys[1])
    assert (await read_batch(store, batch_id))[0]["state"] == "pending"
    await approve(store, bus, batch, leaves, keys[2])
    batch, _ = await read_batch(store, batch_id)
    assert batch["state"] == "approved"
    approval = common_pb2.BatchApproval.FromString(bytes(batch["approval"]))
    assert sorted(s.key_id for s in approval.signatures) == sorted([kid(keys[1]), kid(keys[2])])


async def test_an_approval_by_a_removed_approver_no_longer_counts(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str], keys: list[ed25519.Ed25519PrivateKey]
) -> None:
    batch_id, batch, leaves = await create(store, bus)
    await approve(store, bus, batch, leaves, keys[0])
    await change(store, bus, appr.RemoveApprover("alice"), named(keys))
    await approve(store, bus, batch, leaves, keys[1])
    assert (await read_batch(store, batch_id))[0]["state"] == "pending"
    await approve(store, bus, batch, leaves, keys[2])
    assert (await read_batch(store, batch_id))[0]["state"] == "approved"


async def test_release_keeps_the_worker_signature_of_each_body(
    tmp_path: Path,
    store: InlineSqliteStore,
    bus: Bus,
    clock: LoopClock,
    approvers: list[str],
    nodes: list[str],
    keys: list[ed25519.Ed25519PrivateKey],
) -> None:
    signer = KeySigner(SigningKeys.create(tmp_path / "pki", clock, RNG, SECRETS))
    batch_id, batch, leaves = await create(store, bus, signer=signer)
    before = {str(r["command_id"]): (await command(store, str(r["command_id"]))) for r in leaves}
    assert all(r["signature"] is not None for r in before.values())
    await approve(store, bus, batch, leaves, keys[0])
    await approve(store, bus, batch, leaves, keys[1])
    for cid, old in before.items():
        row = await command(store, cid)
        assert (bytes(row["body"]), bytes(row["signature"])) == (bytes(old["body"]), bytes(old["signature"]))
    assert (await read_batch(store, batch_id))[0]["state"] == "approved"


# -- approvers ---------------------------------------------------------------------------------------


async def test_approver_input_is_checked(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], keys: list[ed25519.Ed25519PrivateKey], count: Count
) -> None:
    async def propose(edit: appr.Edit) -> appr.Proposed:
        return await appr.propose(store, bus, edit, "local", RNG)

    await add_operator(store, "dave")
    with pytest.raises(UsageError, match="not base64"):
        await propose(appr.AddApprover("dave", "not a key!"))
    with pytest.raises(UsageError, match="is 16 bytes; an Ed25519 key is 32"):
        await propose(appr.AddApprover("dave", base64.b64encode(b"x" * 16).decode()))
    with pytest.raises(UsageError, match="is not valid"):
        await propose(appr.AddApprover("da ve", b64(keys[3])))
    with pytest.raises(UsageError, match="is not valid"):
        await propose(appr.AddApprover("Dave", b64(keys[3])))  # names are lowercase ASCII: no look-alikes
    with pytest.raises(UsageError, match=r"'d\\u0430ve' is not valid"):
        await propose(appr.AddApprover("d\u0430ve", b64(keys[3])))  # a Cyrillic a, shown escaped
    with pytest.raises(Conflict, match="already has this name or key"):
        await propose(appr.AddApprover("dave", b64(keys[0])))
    with pytest.raises(Conflict, match="already has this name or key"):
        await propose(appr.AddApprover("alice", b64(keys[3]), "dave"))
    with pytest.raises(Conflict, match="operator alice already holds approver key alice"):
        await propose(appr.AddApprover("alice2", b64(keys[3]), "alice"))
    with pytest.raises(NotFound, match="no operator named 'erin'"):
        await propose(appr.AddApprover("erin", b64(keys[3])))
    with pytest.raises(UsageError, match="between 1 and 100"):
        await propose(appr.SetThreshold(0))
    with pytest.raises(UsageError, match="between 0 and 1000"):
        await propose(appr.SetAllowance(-1))
    with pytest.raises(NotFound, match="no approver named 'dave'"):
        await propose(appr.RemoveApprover("dave"))
    current = await appr.approver_set(store)
    assert [str(r["name"]) for r in current.approvers] == ["alice", "bob", "carol"] and current.threshold == 2
    assert await count("quorum_changes") == 3  # the setup adding three approvers (k was 2 already); no more


# -- the count is a seam (bc sim --break quorum-duplicate-signer) ------------------------------------------


async def second_key_of(store: InlineSqliteStore, operator: str, key: ed25519.Ed25519PrivateKey) -> None:
    """Register `key` to `operator` as well: a second key of one person, which `bc approvers add` refuses but an
    approved change from another proposer could bring (the count's distinct-operator rule is what holds)."""
    async with store.transaction() as tx:
        await q_sql.add_approver(tx, kid(key), f"{operator}-second", raw(key), operator, await store.now_ms())


async def test_two_keys_of_one_operator_approve_a_batch_only_under_a_count_that_takes_both(
    store: InlineSqliteStore, bus: Bus, approvers: list[str], nodes: list[str], keys: list[ed25519.Ed25519PrivateKey]
) -> None:
    from bc.sim.breaks import count_duplicate_signers

    await second_key_of(store, "alice", keys[3])
    for seed, (count, state) in enumerate(((q.count_approvals, "pending"), (count_duplicate_signers, "approved"))):
        req = quorum.BatchRequest(kind="gpu.reset", node_ids=NODES, payload_json=PAYLOAD)
        batch_id = await quorum.create_batch(store, bus, SIGNER, req, REQUESTER, random.Random(seed))
        batch, leaves = await read_batch(store, batch_id)
        for key in (keys[0], keys[3]):  # alice signs with both of her keys
            expires = await store.now_ms() + 600_000
            sig = approval_sig(batch, leaves, key, expires)
            await quorum.decide(
                store, bus, batch_id, kid(key), sig, approve=True, caller="alice", expires_at_ms=expires, count=count
            )
        batch, _ = await read_batch(store, batch_id)
        assert batch["state"] == state, count
        async with store.transaction(write=False) as tx:
            progress = await quorum.approval_progress(tx, batch_id, await store.now_ms(), count=count)
        assert progress == ((1, 2) if state == "pending" else None)
