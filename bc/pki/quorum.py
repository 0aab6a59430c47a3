"""The destructive-batch quorum's signatures, as pure functions shared by the server and the agent.

An approver key is an Ed25519 key held by a person (`bc approve keygen`) and
registered to one operator. Its id is "sha256:" + the hex SHA-256 of the raw
32-byte public key. What an approver signs is bound to the batch, its scope
(the Merkle root over its leaves, `bc.pki.merkle`), who asked for it and an
expiry:

    approve: b"bc.v1/batch-approval\\n" + batch_id + "\\n" + hex(root) + "\\n" + leaf_count + "\\n"
             + requested_by + "\\n" + expires_at_ms
    reject:  b"bc.v1/batch-rejection\\n" + batch_id + "\\n" + hex(root) + "\\n" + reason

`count_approvals` is the one rule both ends apply: distinct keys of the
approver set, of distinct operators, none registered to the requester (nor
named like them), unexpired, with a valid signature.

The quorum settings (approver keys, k, the unbatched allowance, and a version
that every change bumps) change the same way, as TUF rotates its root: a
change from settings S to S' counts only with `change_threshold(S)` valid
signatures of S's own approvers over

    b"bc.v1/quorum-change\\n" + change_id + "\\n" + hex(digest(S)) + "\\n" + hex(digest(S')) + "\\n" + requested_by

so no single admin can replace the quorum, and the version inside each digest
keeps an old approved change from being replayed once the settings moved on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.protocol.canonical import canonical_json
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


def is_requesters(key: common_pb2.ApproverKey, requested_by: str) -> bool:
    """A key is the requester's when it is registered to them, or (a key from before operators) named like them."""
    return key.name == requested_by or (bool(key.operator) and key.operator == requested_by)


def _tally(
    signatures: Iterable[common_pb2.ApproverSignature],
    approvers: Iterable[common_pb2.ApproverKey],
    requested_by: str,
    message_for: Callable[[common_pb2.ApproverSignature], bytes],
    now_ms: int | None,
) -> Tally:
    """The rule both kinds of approval share; `now_ms` None: signatures do not expire (quorum changes)."""
    by_id = {a.key_id: a for a in approvers}
    counted: list[str] = []
    operators: set[str] = set()
    refused: list[tuple[str, str]] = []
    for sig in signatures:
        key = by_id.get(sig.key_id)
        if key is None:
            refused.append((sig.key_id, "not an approver key"))
        elif sig.key_id in counted:
            refused.append((sig.key_id, "signed twice"))
        elif key.operator and key.operator in operators:
            refused.append((sig.key_id, f"operator {key.operator} already approved"))
        elif is_requesters(key, requested_by):
            refused.append((sig.key_id, "the requester's own key"))
        elif now_ms is not None and sig.expires_at_ms <= now_ms:
            refused.append((sig.key_id, "expired"))
        elif not verify(bytes(key.public_key), message_for(sig), sig.signature):
            refused.append((sig.key_id, "bad signature"))
        else:
            counted.append(sig.key_id)
            if key.operator:
                operators.add(key.operator)
    return Tally(counted, refused)


def count_approvals(
    approval: common_pb2.BatchApproval,
    approvers: Iterable[common_pb2.ApproverKey],
    now_ms: int | None,
) -> Tally:
    """The approvals that count; `now_ms` None: expiry is not checked (a node's first spec, agent.spec_quorum)."""

    def message_for(sig: common_pb2.ApproverSignature) -> bytes:
        return approval_message(
            approval.batch_id, approval.scope_root, approval.leaf_count, approval.requested_by, sig.expires_at_ms
        )

    return _tally(approval.signatures, approvers, approval.requested_by, message_for, now_ms)


CountApprovals = Callable[[common_pb2.BatchApproval, Iterable[common_pb2.ApproverKey], int | None], Tally]
"""`count_approvals`'s shape: the seam through which each end (`bc.control.quorum.batches`, `agent.quorum`)
takes its count, production's unless `bc sim --break` hands a broken one."""


# -- the quorum settings and their changes ---------------------------------------------------------


def settings_of(bundle: common_pb2.TrustBundle) -> common_pb2.QuorumSettings:
    """The part of a trust bundle that only an approved quorum change may move.

    With no approver keys nothing is enforced, whatever k and the allowance say, so they count as 0.
    """
    s = common_pb2.QuorumSettings(version=bundle.quorum_version)
    if bundle.approver_keys:
        s.approver_keys.extend(bundle.approver_keys)
        s.quorum_k, s.unbatched_destructive_per_hour = bundle.quorum_k, bundle.unbatched_destructive_per_hour
    return s


def settings_digest(s: common_pb2.QuorumSettings) -> bytes:
    """SHA-256 over canonical JSON: independent of protobuf encoding and of the order approvers are listed in."""
    approvers = sorted(
        (
            {
                "key_id": a.key_id,
                "public_key": base64.b64encode(a.public_key).decode(),
                "name": a.name,
                "operator": a.operator,
            }
            for a in s.approver_keys
        ),
        key=lambda a: a["key_id"],
    )
    doc = {
        "version": s.version,
        "quorum_k": s.quorum_k,
        "unbatched_destructive_per_hour": s.unbatched_destructive_per_hour,
        "approvers": approvers,
    }
    return hashlib.sha256(b"bc.v1/quorum-settings\n" + canonical_json(doc).encode()).digest()


def change_threshold(s: common_pb2.QuorumSettings) -> int:
    """Approvals a change of `s` needs: k of its approvers, or all of them while there are fewer than k.

    With no approvers, none (bootstrap: the signing root alone). Never more than
    there are approvers, so the set can always be changed by its own members.
    """
    n = len(s.approver_keys)
    return min(max(1, s.quorum_k), n) if n else 0


def change_message(change_id: str, from_digest: bytes, to_digest: bytes, requested_by: str) -> bytes:
    return f"bc.v1/quorum-change\n{change_id}\n{from_digest.hex()}\n{to_digest.hex()}\n{requested_by}".encode()


def root_change_message(from_digest: bytes, to_digest: bytes) -> bytes:
    """What the command-signing root signs for a quorum change (`QuorumChange.root_signature`): the step from
    one settings digest to the next. Each digest carries the version, so the signature is never good twice."""
    return f"bc.v1/quorum-change-root\n{from_digest.hex()}\n{to_digest.hex()}".encode()


def root_signed(change: common_pb2.QuorumChange, root_public_keys: list[bytes]) -> bool:
    """Whether one of these roots (raw Ed25519 public keys) signed this change's step itself."""
    if not change.root_signature:
        return False
    msg = root_change_message(change.from_digest, settings_digest(change.settings))
    return any(verify(k, msg, change.root_signature) for k in root_public_keys)


def change_rejection_message(change_id: str, to_digest: bytes, reason: str) -> bytes:
    return f"bc.v1/quorum-change-rejection\n{change_id}\n{to_digest.hex()}\n{reason}".encode()


def count_change_approvals(change: common_pb2.QuorumChange, held: common_pb2.QuorumSettings) -> Tally:
    """The approvals of `change` that count under the settings it moves from (`held`)."""
    if change.from_digest != settings_digest(held):
        return Tally([], [(s.key_id, "signed a change from other settings") for s in change.signatures])
    msg = change_message(change.change_id, change.from_digest, settings_digest(change.settings), change.requested_by)
    return _tally(change.signatures, held.approver_keys, change.requested_by, lambda _sig: msg, None)


def _shown(name: str) -> str:
    """A name as people should read it: a key added before names were ASCII-only shows any look-alike escaped."""
    return name if name.isascii() and name.isprintable() else ascii(name)


def describe_change(frm: common_pb2.QuorumSettings, to: common_pb2.QuorumSettings) -> str:
    """What a change does, in a sentence, from the two settings alone (so a signer can recompute it)."""
    old = {a.key_id: a for a in frm.approver_keys}
    new = {a.key_id: a for a in to.approver_keys}
    parts = []
    for kid in sorted(new.keys() - old.keys()):
        a = new[kid]
        holder = f"operator {_shown(a.operator)}" if a.operator else "no operator"
        parts.append(f"add approver {_shown(a.name)} (key {kid[:19]}…, {holder})")
    parts += [f"remove approver {_shown(old[kid].name)}" for kid in sorted(old.keys() - new.keys())]
    for kid in sorted(old.keys() & new.keys()):
        if old[kid] != new[kid]:
            parts.append(f"re-register key {kid[:19]}… as {_shown(new[kid].name)} of {_shown(new[kid].operator)}")
    if frm.quorum_k != to.quorum_k:
        parts.append(f"set k from {frm.quorum_k} to {to.quorum_k}")
    if frm.unbatched_destructive_per_hour != to.unbatched_destructive_per_hour:
        parts.append(
            f"set the unbatched destructive allowance from {frm.unbatched_destructive_per_hour}"
            f" to {to.unbatched_destructive_per_hour} an hour"
        )
    what = "; ".join(parts) or "change nothing but the version"
    return f"{what} (quorum settings version {frm.version} to {to.version})"
