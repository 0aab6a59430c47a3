"""Approving a batch from the TUI, as `bc approve sign` does it, as functions apart from the screen.

The root is recomputed from the leaves here (`bc.pki.batch_scope.recompute_root`, the very
function `bc approve sign` uses): a server that lies about the scope gets refused before
anything is signed. The key file is read for each signature and dropped after it
(`load_approver_key` refuses a file others can read); nothing keeps it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bc.client.approver_key import load_approver_key, public_raw
from bc.client.fmt import format_time_ms
from bc.errors import UsageError
from bc.pki import preapproval
from bc.pki import quorum as q
from bc.pki.batch_scope import recompute_root
from bc.protocol.pb import admin_pb2

APPROVAL_TTL_MS = 3600 * 1000


def leaves_summary(b: admin_pb2.BatchInfo) -> str:
    """Nodes × kind, and the payload digest(s): what the leaves add up to, in one line; for a health policy's
    pre-approval, what it pre-approves, read from the payload the signature covers."""
    if b.kind == preapproval.BATCH_KIND:
        try:
            return preapproval.summary(b.payload_json)
        except UsageError as e:
            return f"{b.kind}: {e.message}"
    kinds = Counter(leaf.kind for leaf in b.leaves)
    digests = sorted({leaf.payload_digest[:16] for leaf in b.leaves})
    what = ", ".join(f"{n} node(s) × {k}" for k, n in sorted(kinds.items())) or "no leaves"
    return f"{what}; payload digest {', '.join(d + '…' for d in digests) or '-'}"


@dataclass(frozen=True)
class Approval:
    """What one signature covers, shown before it is made."""

    batch: admin_pb2.BatchInfo
    root: bytes
    expires_at_ms: int

    def describe(self) -> list[str]:
        """The lines shown before signing (the screen escapes them: the batch's fields are the requester's)."""
        b = self.batch
        nodes = ", ".join(leaf.node_id for leaf in b.leaves[:8]) + (" …" if len(b.leaves) > 8 else "")
        return [
            f"batch          {b.id}",
            f"what           {leaves_summary(b)}",
            f"nodes          {nodes}",
            f"payload        {b.payload_json or '{}'}",
            f"requested by   {b.requested_by} ({b.reason or 'no reason given'})",
            f"scope root     {self.root.hex()}  (recomputed here from the {len(b.leaves)} leaves)",
            f"leaf count     {len(b.leaves)}",
            f"expires        {format_time_ms(self.expires_at_ms)}",
            f"approvals      {b.approvals} of {b.threshold} so far",
        ]


def prepare(b: admin_pb2.BatchInfo, server_now_ms: int) -> Approval:
    """Check the batch can be signed and recompute its root; UsageError says why not."""
    if b.state != "pending":
        raise UsageError(f"batch {b.id} is {b.state}; there is nothing to sign")
    root = recompute_root(b)
    if b.kind == preapproval.BATCH_KIND:  # a standing approval: as long as the pre-approvals it signs
        return Approval(b, root, b.not_after_ms)
    return Approval(b, root, min(server_now_ms + APPROVAL_TTL_MS, b.not_after_ms or server_now_ms + APPROVAL_TTL_MS))


def sign_approval(a: Approval, key_file: Path) -> tuple[str, bytes]:
    """(key id, signature) over exactly what `describe` showed; the key is read now and not kept."""
    key = load_approver_key(key_file)
    b = a.batch
    sig = key.sign(q.approval_message(b.id, a.root, len(b.leaves), b.requested_by, a.expires_at_ms))
    return q.key_id(public_raw(key)), sig


def sign_rejection(b: admin_pb2.BatchInfo, key_file: Path, reason: str) -> tuple[str, bytes]:
    if not reason.strip():
        raise UsageError("a rejection needs a reason")
    key = load_approver_key(key_file)
    sig = key.sign(q.rejection_message(b.id, bytes.fromhex(b.scope_root), reason))
    return q.key_id(public_raw(key)), sig
