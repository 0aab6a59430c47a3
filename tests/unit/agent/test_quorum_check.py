"""The node's quorum check (agent/quorum.py): real approver keys, a real Merkle tree, the real journal, the loop clock.

A destructive command with a `batch_id` runs only with k valid signatures of
distinct approver keys of the node's bundle (never the requester's, unexpired
in server time) over a scope whose audit path puts *this* command's leaf under
the signed root, for a tree of the signed size; each leaf runs once, ever. A
destructive command without a batch is counted against an hourly allowance
kept on disk. Nothing is checked for other kinds, or before the bundle holds
approver keys.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import any_pb2

from agent.journal import Journal
from agent.quorum import UNBATCHED_FILE, WINDOW_S, QuorumCheck, UnbatchedAllowance, check_batch
from agent.trust import AgentTrust, decide_bundle
from bc.pki import merkle
from bc.pki import preapproval as pre
from bc.pki import quorum as q
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import PURPOSE_TRUST_BUNDLE, WorkerSigner, create_root, issue_worker
from bc.protocol.pb import common_pb2, kinds_pb2, session_pb2
from bc.seams.clock import LoopClock
from bc.testing import advance, virtual_clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

NOW = 1_800_000_000.0
NODES = ("n1", "n2", "n3")
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Approver:
    name: str
    key: ed25519.Ed25519PrivateKey

    @property
    def public(self) -> bytes:
        return self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def key_id(self) -> str:
        return q.key_id(self.public)

    def bundle_key(self) -> common_pb2.ApproverKey:
        return common_pb2.ApproverKey(key_id=self.key_id, public_key=self.public, name=self.name)


def new_approver(name: str) -> Approver:
    return Approver(name, ed25519.Ed25519PrivateKey.generate())


A0, A1, A2 = new_approver("alice"), new_approver("bob"), new_approver("carol")
STRANGER = new_approver("mallory")  # a real key that no bundle holds


def reset_payload(*uuids: str) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(kinds_pb2.GpuResetRequest(gpu_uuids=list(uuids)), deterministic=True)
    return out


def bundle(*approvers: Approver, k: int = 2, per_hour: int = 0) -> common_pb2.TrustBundle:
    b = common_pb2.TrustBundle(ca_pem=b"ca", unbatched_destructive_per_hour=per_hour)
    if approvers:
        b.approver_keys.extend(a.bundle_key() for a in approvers)
        b.quorum_k = k
    return b


@dataclass
class Batch:
    """A batch as the server builds it: one leaf per node, the Merkle tree over them, signed by approvers."""

    batch_id: str
    nodes: Sequence[str]
    payload: any_pb2.Any
    kind: str = "gpu.reset"
    requested_by: str = "ops"

    def __post_init__(self) -> None:
        digest = merkle.payload_digest(self.payload.type_url, self.payload.value)
        self.tree = merkle.MerkleTree([merkle.leaf_bytes(n, self.kind, digest) for n in self.nodes])

    def approval(
        self, *signers: Approver, expires_at_ms: int, leaf_count: int | None = None, root: bytes | None = None
    ) -> common_pb2.BatchApproval:
        count = len(self.tree) if leaf_count is None else leaf_count
        scope = self.tree.root if root is None else root
        a = common_pb2.BatchApproval(
            batch_id=self.batch_id, scope_root=scope, requested_by=self.requested_by, leaf_count=count
        )
        for s in signers:
            msg = q.approval_message(self.batch_id, scope, count, self.requested_by, expires_at_ms)
            a.signatures.add(key_id=s.key_id, expires_at_ms=expires_at_ms, signature=s.key.sign(msg))
        return a

    def proof(self, index: int) -> common_pb2.BatchProof:
        return common_pb2.BatchProof(leaf_index=index, tree_size=len(self.tree), path=self.tree.proof(index))

    def body(self, node_id: str, command_id: str, payload: any_pb2.Any | None = None) -> session_pb2.CommandBody:
        return session_pb2.CommandBody(
            id=command_id,
            node_id=node_id,
            kind=self.kind,
            payload=self.payload if payload is None else payload,
            not_after_ms=int(NOW * 1000) + HOUR_MS,
            batch_id=self.batch_id,
        )


def command(
    body: session_pb2.CommandBody,
    approval: common_pb2.BatchApproval | bytes | None,
    proof: common_pb2.BatchProof | bytes | None,
) -> session_pb2.Command:
    cmd = session_pb2.Command(envelope=common_pb2.Envelope(purpose="command", body=body.SerializeToString()))
    if approval is not None:
        cmd.batch_approval = approval if isinstance(approval, bytes) else approval.SerializeToString()
    if proof is not None:
        cmd.batch_proof = proof if isinstance(proof, bytes) else proof.SerializeToString()
    return cmd


def unbatched(node_id: str, command_id: str, kind: str = "gpu.reset") -> session_pb2.CommandBody:
    payload = reset_payload("GPU-1") if kind == "gpu.reset" else any_pb2.Any()
    return session_pb2.CommandBody(
        id=command_id, node_id=node_id, kind=kind, payload=payload, not_after_ms=int(NOW * 1000) + HOUR_MS
    )


class Node:
    """The quorum check as `agent.app` wires it: the held bundle, the journal's leaf ledger, the allowance file."""

    def __init__(self, data_dir: Path, journal: Journal, clock: LoopClock, b: common_pb2.TrustBundle) -> None:
        self.data_dir, self.journal, self.clock = data_dir, journal, clock
        self.trust = AgentTrust(b)
        self.labels: dict[str, str] = {"pool": "a"}  # as the node's signed spec body carries them
        self.check = self.new_check()

    def new_check(self) -> QuorumCheck:
        """A fresh check over the same data dir and journal: what a restarted agent builds."""
        return QuorumCheck(
            self.trust,
            self.journal.claim_batch_leaf,
            UnbatchedAllowance(self.data_dir, self.clock),
            self.server_now_ms,
            self.clock,
            labels=lambda: self.labels,
        )

    def server_now_ms(self) -> int:
        return int(self.clock.now() * 1000)

    async def __call__(self, cmd: session_pb2.Command) -> str | None:
        body = session_pb2.CommandBody.FromString(cmd.envelope.body)
        return await self.check(cmd, body)


@pytest.fixture
def clock() -> LoopClock:
    return virtual_clock(NOW)


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[Journal]:
    j = await Journal.open(tmp_path / "node" / "journal.db", "n1")
    try:
        yield j
    finally:
        await j.close()


@pytest.fixture
def node(tmp_path: Path, journal: Journal, clock: LoopClock) -> Node:
    return Node(tmp_path / "node", journal, clock, bundle(A0, A1, A2, k=2))


@pytest.fixture
def batch() -> Batch:
    return Batch("b-1", NODES, reset_payload("GPU-aaaa", "GPU-bbbb"))


def in_an_hour() -> int:
    return int(NOW * 1000) + HOUR_MS


def refused(why: str | None, *fragments: str) -> None:
    assert why is not None, "the command was admitted"
    assert why.startswith("BATCH_UNAPPROVED: "), why
    for f in fragments:
        assert f in why, why


# -- the approvals -----------------------------------------------------------------------------------


async def test_k_distinct_approvals_admit_every_leaf(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    for i, n in enumerate(NODES):
        assert await node(command(batch.body(n, f"c-{n}"), approval, batch.proof(i))) is None


async def test_all_three_approvals_admit_as_well(node: Node, batch: Batch) -> None:
    approval = batch.approval(A2, A0, A1, expires_at_ms=in_an_hour())
    assert await node(command(batch.body("n2", "c1"), approval, batch.proof(1))) is None


async def test_k_minus_one_approvals_are_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(A1, expires_at_ms=in_an_hour())
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "1 of 2 approvals hold")


async def test_no_signature_at_all_is_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(expires_at_ms=in_an_hour())
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "0 of 2 approvals hold")


async def test_a_duplicate_signer_counts_once(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, A0, expires_at_ms=in_an_hour())
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "1 of 2", "signed twice")


async def test_the_same_key_with_two_expiries_still_counts_once(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, expires_at_ms=in_an_hour())
    approval.MergeFrom(batch.approval(A0, expires_at_ms=in_an_hour() + 1))
    assert len(approval.signatures) == 2
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "1 of 2", "signed twice")


async def test_the_requesters_own_key_does_not_count(node: Node) -> None:
    b = Batch("b-own", NODES, reset_payload("GPU-1"), requested_by=A0.name)
    own = b.approval(A0, A1, expires_at_ms=in_an_hour())
    refused(await node(command(b.body("n1", "c1"), own, b.proof(0))), "1 of 2", "the requester's own key")
    others = b.approval(A1, A2, expires_at_ms=in_an_hour())
    assert await node(command(b.body("n1", "c2"), others, b.proof(0))) is None


async def test_an_expired_signature_is_refused(node: Node, batch: Batch) -> None:
    now_ms = node.server_now_ms()
    approval = batch.approval(A0, expires_at_ms=in_an_hour())
    approval.MergeFrom(batch.approval(A1, expires_at_ms=now_ms))  # expires exactly now: no longer counts
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "1 of 2", "expired")


async def test_an_approval_expires_in_server_time(node: Node, batch: Batch, clock: LoopClock) -> None:
    soon = node.server_now_ms() + 1_000
    approval = batch.approval(A0, A1, expires_at_ms=soon)
    await advance(1.0)  # the node's view of server time reaches the expiry before the command arrives
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "0 of 2", "expired")


async def test_a_signature_by_an_unknown_key_is_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, STRANGER, expires_at_ms=in_an_hour())
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "1 of 2", "not an approver key")


async def test_a_strangers_signature_under_an_approvers_key_id_is_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, STRANGER, expires_at_ms=in_an_hour())
    approval.signatures[1].key_id = A1.key_id  # claims to be bob, signed by mallory
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "1 of 2", "bad signature")


async def test_signatures_over_another_batch_id_do_not_hold(node: Node, batch: Batch) -> None:
    """The batch id is in the signed message: relabelling another batch's approval breaks every signature."""
    other = Batch("b-other", NODES, batch.payload)
    approval = other.approval(A0, A1, expires_at_ms=in_an_hour())
    approval.batch_id = batch.batch_id
    refused(await node(command(batch.body("n1", "c1"), approval, batch.proof(0))), "0 of 2", "bad signature")


async def test_an_approval_for_another_batch_is_refused(node: Node, batch: Batch) -> None:
    """Two batches with the same scope have the same root; the approval must still name this batch."""
    other = Batch("b-other", NODES, batch.payload)
    assert other.tree.root == batch.tree.root
    approval = other.approval(A0, A1, expires_at_ms=in_an_hour())
    refused(await node(command(batch.body("n1", "c1"), approval, other.proof(0))), "no approval for batch b-1")


async def test_a_missing_or_undecodable_approval_is_refused(node: Node, batch: Batch) -> None:
    refused(await node(command(batch.body("n1", "c1"), None, batch.proof(0))), "no approval for batch b-1")
    refused(await node(command(batch.body("n1", "c2"), b"\xff\xff\xff", batch.proof(0))), "does not decode")


# -- the scope: proofs and tree sizes ------------------------------------------------------------------


async def test_a_proof_for_another_leaf_is_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    refused(
        await node(command(batch.body("n1", "c1"), approval, batch.proof(1))),
        "the proof does not put this command (node, kind, payload) in the approved scope",
    )


async def test_the_right_path_under_another_index_is_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    proof = batch.proof(0)
    proof.leaf_index = 1
    refused(await node(command(batch.body("n1", "c1"), approval, proof)), "approved scope")


async def test_a_node_outside_the_scope_is_refused(node: Node, batch: Batch) -> None:
    """n4 is in no leaf: no proof from the batch puts it under the root."""
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    for i in range(len(NODES)):
        refused(await node(command(batch.body("n4", f"c{i}"), approval, batch.proof(i))), "approved scope")


async def test_a_changed_payload_with_the_original_proof_is_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    body = batch.body("n1", "c1", payload=reset_payload("GPU-zzzz"))
    refused(await node(command(body, approval, batch.proof(0))), "approved scope")


async def test_a_proof_from_another_batch_is_refused(node: Node, batch: Batch) -> None:
    other = Batch("b-2", ("n1", "n5", "n6"), batch.payload)  # n1 at index 0 in both, other neighbours
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    refused(await node(command(batch.body("n1", "c1"), approval, other.proof(0))), "approved scope")


async def test_a_tree_size_other_than_the_signed_leaf_count_is_refused(node: Node) -> None:
    """The audit path of a one-leaf tree is empty and checks for any claimed size: the signed count decides."""
    b = Batch("b-1", ("n1",), reset_payload("GPU-1"))
    signed_for_two = b.approval(A0, A1, expires_at_ms=in_an_hour(), leaf_count=2)
    proof = b.proof(0)
    assert merkle.verify_proof(
        merkle.leaf_bytes("n1", "gpu.reset", merkle.payload_digest(b.payload.type_url, b.payload.value)),
        0,
        1,
        list(proof.path),
        b.tree.root,
    )
    refused(await node(command(b.body("n1", "c1"), signed_for_two, proof)), "approved scope")
    # And the other way round: the proof claims a size the approvers did not sign.
    honest = b.approval(A0, A1, expires_at_ms=in_an_hour())
    proof.tree_size = 2
    refused(await node(command(b.body("n1", "c2"), honest, proof)), "approved scope")
    proof.tree_size = 1
    assert await node(command(b.body("n1", "c3"), honest, proof)) is None


async def test_a_batch_body_without_a_proof_is_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    refused(await node(command(batch.body("n1", "c1"), approval, None)), "approved scope")


# -- each leaf once ----------------------------------------------------------------------------------


async def test_a_second_command_id_for_the_same_leaf_is_refused(node: Node, batch: Batch) -> None:
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    first = command(batch.body("n1", "c-first"), approval, batch.proof(0))
    assert await node(first) is None
    again = command(batch.body("n1", "c-second"), approval, batch.proof(0))
    refused(await node(again), "this leaf of batch b-1 already ran as command c-first")
    # The same command id passes again (a redelivery; the dispatcher answers it from the journal).
    assert await node(first) is None
    # Other leaves of the batch are untouched by the claim.
    assert await node(command(batch.body("n2", "c-n2"), approval, batch.proof(1))) is None


async def test_the_leaf_ledger_survives_a_restart(tmp_path: Path, clock: LoopClock, batch: Batch) -> None:
    path = tmp_path / "node" / "journal.db"
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    j = await Journal.open(path, "n1")
    try:
        assert (
            await Node(tmp_path / "node", j, clock, bundle(A0, A1, A2))(
                command(batch.body("n1", "c1"), approval, batch.proof(0))
            )
            is None
        )
    finally:
        await j.close()
    j = await Journal.open(path, "n1")
    try:
        restarted = Node(tmp_path / "node", j, clock, bundle(A0, A1, A2))
        refused(await restarted(command(batch.body("n1", "c2"), approval, batch.proof(0))), "already ran as command c1")
        assert await restarted(command(batch.body("n1", "c1"), approval, batch.proof(0))) is None
    finally:
        await j.close()


async def test_a_new_batch_with_the_same_scope_as_one_that_ran_is_admitted(node: Node, batch: Batch) -> None:
    """Each leaf of *a batch* runs once; a second batch, approved again by k people, is not the first one's leaf.

    Bug: the agent claims a leaf by `scope_root + leaf_hash`, and the root is a pure
    function of the leaves (node, kind, payload). Any later batch with the same
    nodes, kind and payload (a second `node.reboot` of the same node, a second
    reset of the same GPUs) has the same root, so its properly approved commands
    are refused "already ran as command …" forever. The claim must include the
    batch id (whose approvals are signed for that batch alone).
    """
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    assert await node(command(batch.body("n1", "c-monday"), approval, batch.proof(0))) is None

    friday = Batch("b-friday", NODES, batch.payload)  # the same reset, a week later, approved again
    assert friday.tree.root == batch.tree.root
    approval2 = friday.approval(A1, A2, expires_at_ms=in_an_hour())
    assert await node(command(friday.body("n1", "c-friday"), approval2, friday.proof(0))) is None


# -- what is never checked ---------------------------------------------------------------------------


async def test_non_destructive_kinds_are_never_checked(node: Node, tmp_path: Path) -> None:
    for kind in ("inventory.refresh", "diag.nvml", "diag.dcgm", "logs.collect"):
        body = unbatched("n1", f"c-{kind}", kind=kind)
        assert await node(command(body, None, None)) is None
        body.batch_id = "b-junk"  # a batch id and garbage around it change nothing for these kinds
        assert await node(command(body, b"\xff\xff", b"\xff")) is None
    assert not (tmp_path / "node" / UNBATCHED_FILE).exists()


async def test_without_approvers_in_the_bundle_nothing_is_checked(
    tmp_path: Path, journal: Journal, clock: LoopClock, batch: Batch
) -> None:
    bare = Node(tmp_path / "node", journal, clock, bundle())  # k in the bundle alone means nothing
    bare.trust.bundle.quorum_k = 2
    for i in range(3):
        assert await bare(command(unbatched("n1", f"u{i}"), None, None)) is None
        assert await bare(command(unbatched("n1", f"r{i}", kind="node.reboot"), None, None)) is None
    assert await bare(command(batch.body("n1", "b1"), None, None)) is None
    assert not (tmp_path / "node" / UNBATCHED_FILE).exists()


# -- unbatched destructive commands --------------------------------------------------------------------


async def test_unbatched_destructive_commands_are_refused_with_allowance_0(node: Node) -> None:
    for kind in ("gpu.reset", "node.reboot"):
        for i in range(2):
            why = await node(command(unbatched("n1", f"{kind}-{i}", kind=kind), None, None))
            assert why == f"UNBATCHED_LIMIT: {kind} is destructive and needs an approved batch (allowance 0/hour)"


async def test_the_allowance_is_counted_over_a_rolling_hour_and_kept_on_disk(
    tmp_path: Path, journal: Journal, clock: LoopClock
) -> None:
    node = Node(tmp_path / "node", journal, clock, bundle(A0, A1, A2, per_hour=2))
    start = clock.now()

    async def lone(cid: str, check: QuorumCheck | None = None) -> str | None:
        body = unbatched("n1", cid)
        return await (check or node.check)(command(body, None, None), body)

    assert await lone("u1") is None
    await advance(10)
    assert await lone("u2") is None
    await advance(10)
    assert await lone("u3") == (
        "UNBATCHED_LIMIT: gpu.reset is destructive and needs an approved batch (allowance 2/hour)"
    )
    # A restarted agent (a new allowance over the same data dir) still counts the two.
    assert await lone("u3", node.new_check()) is not None
    await advance(WINDOW_S - 21)  # 1 s before u1 leaves the window
    assert await lone("u4") is not None
    await advance(1)  # an hour after u1: u1 no longer counts
    assert clock.now() == start + WINDOW_S
    assert await lone("u5") is None
    assert await lone("u6", node.new_check()) is not None  # u2 and u5 fill the hour again
    await advance(10)  # an hour after u2
    assert await lone("u7", node.new_check()) is None
    # The refusals took nothing: only the admitted ones in the window are on disk, 0600.
    path = tmp_path / "node" / UNBATCHED_FILE
    assert json.loads(path.read_text())["ran_at"] == [start + WINDOW_S, start + WINDOW_S + 10]
    assert path.stat().st_mode & 0o777 == 0o600


async def test_an_unreadable_allowance_file_counts_as_empty_rather_than_crashing(
    tmp_path: Path, journal: Journal, clock: LoopClock
) -> None:
    (tmp_path / "node").mkdir(parents=True, exist_ok=True)
    (tmp_path / "node" / UNBATCHED_FILE).write_text("{not json")
    node = Node(tmp_path / "node", journal, clock, bundle(A0, A1, A2, per_hour=1))
    body = unbatched("n1", "u1")
    assert await node.check(command(body, None, None), body) is None
    body2 = unbatched("n1", "u2")
    assert await node.check(command(body2, None, None), body2) is not None


# -- check_batch, pure -----------------------------------------------------------------------------------


def test_check_batch_returns_the_proof_and_the_leaf_key(batch: Batch) -> None:
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    body = batch.body("n3", "c1")
    why, proof, key = check_batch(command(body, approval, batch.proof(2)), body, bundle(A0, A1, A2), int(NOW * 1000))
    assert why is None and proof == batch.proof(2)
    digest = merkle.payload_digest(batch.payload.type_url, batch.payload.value)
    assert key == batch.tree.root + merkle.leaf_hash(merkle.leaf_bytes("n3", "gpu.reset", digest))


def test_check_batch_uses_k_from_the_bundle(batch: Batch) -> None:
    approval = batch.approval(A0, A1, expires_at_ms=in_an_hour())
    body = batch.body("n1", "c1")
    cmd = command(body, approval, batch.proof(0))
    why, _, _ = check_batch(cmd, body, bundle(A0, A1, A2, k=3), int(NOW * 1000))
    assert why is not None and why.startswith("2 of 3 approvals hold")
    assert check_batch(cmd, body, bundle(A0, A1, A2, k=1), int(NOW * 1000))[0] is None


# -- who may change the approver set --------------------------------------------------------------------


def test_a_worker_signed_bundle_cannot_drop_the_approver_keys() -> None:
    """The quorum exists because a worker key can be stolen (docs/quorum.md: "it does not stop a compromised
    control plane, which holds a worker key ... The quorum closes that").

    Bug (design): the approver keys and k travel in the trust bundle, and a node adopts
    any bundle signed by a worker of a held root (agent/trust.py `decide_bundle`). So
    the stolen worker key alone can sign a bundle without approvers (or with its own
    approver keys, or k = 1) and every node adopts it; from then on the node checks no
    quorum at all. Changing the approver set of a node that holds one must take more
    than the worker key (the held approvers' signatures, or the offline root).
    """
    clock = virtual_clock(NOW)
    ca_pem = CertificateAuthority.create(clock, RNG, SECRETS).ca_pem
    root_key, root = create_root(clock, RNG, SECRETS)
    worker = WorkerSigner(*issue_worker(root_key, root, clock, RNG, SECRETS))
    root_pem = root.public_bytes(serialization.Encoding.PEM)
    held = bundle(A0, A1, A2, k=2)
    held.ca_pem = ca_pem
    held.command_signing_roots.append(root_pem)
    stripped = common_pb2.TrustBundle(ca_pem=ca_pem, command_signing_roots=[root_pem])
    env = worker.envelope(PURPOSE_TRUST_BUNDLE, stripped.SerializeToString(deterministic=True))
    d = decide_bundle(held, env, stripped, ca_pem, NOW)
    dropped = d.bundle is not None and len(d.bundle.approver_keys) == 0
    assert not dropped, f"a bundle signed by the worker key alone removed every approver key ({d.reason})"


# -- a health policy's pre-approval (bc.pki.preapproval) ---------------------------------------------------


def preapproved(
    command_id: str,
    *signers: Approver,
    kind: str = "gpu.reset",
    pool: str = "a",
    version: int = 3,
    shown_text: str | None = None,
) -> session_pb2.Command:
    """An unbatched destructive command carrying a policy version that `signers` signed (`shown_text`: what a
    control plane relays instead of the text they signed)."""
    entry = {"kind": "gpu.reset", "pool": {"pool": pool}, "expires_at_ms": in_an_hour()}
    text = json.dumps({"preapprove": [entry]}, sort_keys=True)
    root = pre.scope_root(version, text)
    a = common_pb2.BatchApproval(batch_id="b-pre", scope_root=root, requested_by="admin", leaf_count=1)
    for s in signers:
        msg = q.approval_message("b-pre", root, 1, "admin", in_an_hour())
        a.signatures.add(key_id=s.key_id, expires_at_ms=in_an_hour(), signature=s.key.sign(msg))
    cmd = command(unbatched("n1", command_id, kind), None, None)
    relayed = text if shown_text is None else shown_text
    cmd.preapproval = common_pb2.HealthPreapproval(
        policy_version=version, policy_json=relayed, batch_approval=a.SerializeToString()
    ).SerializeToString()
    return cmd


async def test_a_signed_pre_approval_admits_its_kind_in_the_nodes_pool_without_the_allowance(node: Node) -> None:
    assert await node(preapproved("c1", A0, A1)) is None
    assert await node(preapproved("c2", A1, A2)) is None  # a standing approval: not one leaf, one run
    assert not (node.data_dir / UNBATCHED_FILE).exists()  # the hourly allowance was not touched


async def test_a_pre_approval_the_node_cannot_verify_is_refused_with_the_reason(node: Node) -> None:
    refused(await node(preapproved("c1", A0)), "holds 1 of the 2 approvals")
    refused(await node(preapproved("c2", A0, STRANGER)), "holds 1 of the 2", "not an approver key")
    refused(await node(preapproved("c3", A0, A1, kind="node.reboot")), "pre-approves gpu.reset, not node.reboot")
    refused(await node(preapproved("c4", A0, A1, pool="b")), "the node is not in pool pool=b")
    wider = json.dumps({"preapprove": [{"kind": "gpu.reset", "pool": {"pool": "a"}, "expires_at_ms": 1 << 60}]})
    refused(await node(preapproved("c5", A0, A1, shown_text=wider)), "not over health policy v3 as carried")
    node.labels = {"pool": "b"}  # relabelled (a later signed spec): no longer in the pool
    refused(await node(preapproved("c6", A0, A1)), "the node is not in pool pool=a")


async def test_a_pre_approval_expires_in_server_time(node: Node, clock: LoopClock) -> None:
    cmd = preapproved("c1", A0, A1)
    await advance(HOUR_MS / 1000)
    refused(await node(cmd), "0 of the 2", "expired")
