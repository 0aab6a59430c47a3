"""The destructive-batch quorum's signatures, as pure functions shared by the server and the agent.

An approver key is an Ed25519 key held by a person (`bc approve keygen`). Its
id is "sha256:" + the hex SHA-256 of the raw 32-byte public key. What an
approver signs is bound to the batch, its scope (the Merkle root over its
leaves, `bc.pki.merkle`), who asked for it and an expiry:

    approve: b"bc.v1/batch-approval\\n" + batch_id + "\\n" + hex(root) + "\\n" + leaf_count + "\\n"
             + requested_by + "\\n" + expires_at_ms
    reject:  b"bc.v1/batch-rejection\\n" + batch_id + "\\n" + hex(root) + "\\n" + reason

`count_approvals` is the one rule both ends apply: distinct keys of the
approver set, not the requester's own, unexpired, with a valid signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.protocol.pb import common_pb2


def approval_message(batch_id: str, root: bytes, leaf_count: int, requested_by: str, expires_at_ms: int) -> bytes:
    return f"bc.v1/batch-approval\n{batch_id}\n{root.hex()}\n{leaf_count}\n{requested_by}\n{expires_at_ms}".encode()


def rejection_message(batch_id: str, root: bytes, reason: str) -> bytes:
    return f"bc.v1/batch-rejection\n{batch_id}\n{root.hex()}\n{reason}".encode()


def key_id(public_key: bytes) -> str:
    return "sha256:" + hashlib.sha256(public_key).hexdigest()


def parse_public_key(text: str) -> bytes:
    """A raw Ed25519 public key from its base64 (what `bc approve keygen` prints); ValueError otherwise."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the public key is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"the public key is {len(raw)} bytes; an Ed25519 key is 32")
    ed25519.Ed25519PublicKey.from_public_bytes(raw)
    return raw


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Tally:
    counted: list[str]  # key ids whose approval counts
    refused: list[tuple[str, str]]  # (key id, why) for the others


def count_approvals(
    approval: common_pb2.BatchApproval,
    approvers: list[common_pb2.ApproverKey],
    now_ms: int,
) -> Tally:
    by_id = {a.key_id: a for a in approvers}
    counted: list[str] = []
    refused: list[tuple[str, str]] = []
    for sig in approval.signatures:
        key = by_id.get(sig.key_id)
        if key is None:
            refused.append((sig.key_id, "not an approver key"))
        elif sig.key_id in counted:
            refused.append((sig.key_id, "signed twice"))
        elif key.name == approval.requested_by:
            refused.append((sig.key_id, "the requester's own key"))
        elif sig.expires_at_ms <= now_ms:
            refused.append((sig.key_id, "expired"))
        elif not verify(
            bytes(key.public_key),
            approval_message(
                approval.batch_id, approval.scope_root, approval.leaf_count, approval.requested_by, sig.expires_at_ms
            ),
            sig.signature,
        ):
            refused.append((sig.key_id, "bad signature"))
        else:
            counted.append(sig.key_id)
    return Tally(counted, refused)
