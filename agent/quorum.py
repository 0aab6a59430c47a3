"""The destructive-batch quorum on the node (reference: "The destructive-batch quorum").

Checked after the signature and before BUSY, only once the trust bundle
holds approver keys, and only for the kinds the kinds table marks
destructive (never a flag of the body):

* with a `batch_id`: the command's `batch_approval` must carry at least
  `quorum_k` valid signatures of distinct approver keys of the bundle, of
  distinct operators, none registered to (or named like) the requester,
  unexpired in server time, over the batch's scope root, and its
  `batch_proof` must prove *this* command's leaf — computed here from the
  body's own node, kind and payload — under that root. Each leaf runs at most
  once, ever: the first command to claim it in the journal keeps it.
* without one but with a `preapproval` (a health policy version, docs/health.md): the signed version must
  hold k valid signatures of the bundle's approvers over its exact text, and pre-approve this kind for a
  pool whose every label is among this node's own labels (the ones its signed spec carries), unexpired in
  server time (`bc.pki.preapproval.check`); otherwise `BATCH_UNAPPROVED` with the reason. A gateway can
  only strip it (the node then refuses the command), and a control plane cannot sign one.
* without either: refused `UNBATCHED_LIMIT` beyond `unbatched_destructive_per_hour`
  (default 0), counted over a rolling hour of this host's own clock in a file
  in the data dir, so a restart does not reset it.

Refusals are "BATCH_UNAPPROVED: why" / "UNBATCHED_LIMIT: why" for the
dispatcher, which journals them like every terminal rejection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from google.protobuf.message import DecodeError

from agent.trust import AgentTrust
from bc.pki import merkle, preapproval
from bc.pki import quorum as q
from bc.protocol import kinds
from bc.protocol.pb import common_pb2, session_pb2
from bc.runtime.files import atomic_write
from bc.seams.clock import Clock

log = logging.getLogger("agent")

UNBATCHED_FILE = "unbatched-destructive.json"
WINDOW_S = 3600.0

ClaimLeaf = Callable[[str, int, str, float], Awaitable[str]]


def check_batch(
    cmd: session_pb2.Command,
    body: session_pb2.CommandBody,
    bundle: common_pb2.TrustBundle,
    server_now_ms: int,
    count: q.CountApprovals = q.count_approvals,
) -> tuple[str | None, common_pb2.BatchProof | None, bytes]:
    """Pure: (why it is refused or None, the proof, the leaf's key: scope root + leaf hash). `count` is the
    quorum rule (`bc.pki.quorum.count_approvals`, the control plane's too); a seam for `bc sim --break`."""
    approval = common_pb2.BatchApproval()
    proof = common_pb2.BatchProof()
    try:
        approval.ParseFromString(cmd.batch_approval)
        proof.ParseFromString(cmd.batch_proof)
    except DecodeError:
        return "the batch approval or proof does not decode", None, b""
    if not cmd.batch_approval or approval.batch_id != body.batch_id:
        return f"no approval for batch {body.batch_id}", None, b""
    root = bytes(approval.scope_root)
    try:
        digest = merkle.payload_digest(body.payload.type_url, body.payload.value)
        leaf = merkle.leaf_bytes(body.node_id, body.kind, digest)
    except ValueError as e:
        return f"the command cannot be a batch leaf: {e}", None, b""
    if proof.tree_size != approval.leaf_count or not merkle.verify_proof(
        leaf, proof.leaf_index, proof.tree_size, proof.path, root
    ):
        return "the proof does not put this command (node, kind, payload) in the approved scope", None, b""
    tally = count(approval, list(bundle.approver_keys), server_now_ms)
    need = max(1, bundle.quorum_k)
    if len(tally.counted) < need:
        refused = "; ".join(f"{k[:19]}…: {why}" for k, why in tally.refused)
        detail = f" ({refused})" if refused else ""
        return f"{len(tally.counted)} of {need} approvals hold{detail}", None, b""
    return None, proof, root + merkle.leaf_hash(leaf)


class UnbatchedAllowance:
    """Destructive commands run without a batch in the last hour of this host's clock, kept on disk."""

    def __init__(self, data_dir: Path, clock: Clock) -> None:
        self.path = data_dir / UNBATCHED_FILE
        self.clock = clock

    def _load(self) -> list[float]:
        try:
            doc = json.loads(self.path.read_text())
            return [float(t) for t in doc.get("ran_at", [])]
        except (OSError, ValueError, TypeError, AttributeError):
            return []

    def try_take(self, limit: int, command_id: str) -> bool:
        now = self.clock.now()
        recent = [t for t in self._load() if now - WINDOW_S < t <= now]
        if len(recent) >= limit:
            return False
        recent.append(now)
        atomic_write(self.path, (json.dumps({"ran_at": recent, "last_command": command_id}) + "\n").encode(), 0o600)
        return True


class QuorumCheck:
    def __init__(
        self,
        trust: AgentTrust,
        claim_leaf: ClaimLeaf,
        allowance: UnbatchedAllowance,
        server_now_ms: Callable[[], int],
        clock: Clock,
        count: q.CountApprovals = q.count_approvals,
        labels: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        """`labels`: this node's labels as its signed spec carries them (a pre-approval's pool is matched
        against them)."""
        self.trust, self.claim_leaf, self.allowance = trust, claim_leaf, allowance
        self.server_now_ms, self.clock = server_now_ms, clock
        self.count, self.labels = count, labels

    async def __call__(self, cmd: session_pb2.Command, body: session_pb2.CommandBody) -> str | None:
        bundle = self.trust.bundle
        if not bundle.approver_keys or body.kind not in kinds.DESTRUCTIVE:
            return None
        if not body.batch_id and cmd.preapproval:
            why = preapproval.check(cmd.preapproval, body.kind, self.labels(), bundle, self.server_now_ms(), self.count)
            if why is not None:
                return f"BATCH_UNAPPROVED: {why}"
            log.info("event=quorum.preapproved command=%s kind=%s", body.id, body.kind)
            return None
        if not body.batch_id:
            limit = max(0, bundle.unbatched_destructive_per_hour)
            if await asyncio.to_thread(self.allowance.try_take, limit, body.id):
                return None
            return f"UNBATCHED_LIMIT: {body.kind} is destructive and needs an approved batch (allowance {limit}/hour)"
        why, proof, leaf_key = check_batch(cmd, body, bundle, self.server_now_ms(), self.count)
        if why is not None or proof is None:
            return f"BATCH_UNAPPROVED: {why}"
        # Claimed by batch and the leaf's content under its root, not by its index: one leaf, one run,
        # whatever path; another approved batch with the same scope is another leaf.
        holder = await self.claim_leaf(f"{body.batch_id}:{leaf_key.hex()}", 0, body.id, self.clock.now())
        if holder != body.id:
            return f"BATCH_UNAPPROVED: this leaf of batch {body.batch_id} already ran as command {holder}"
        return None
