"""What a quorum batch covers, recomputed by the signer from the batch's leaves and payload.

`bc approve sign` and the TUI's approvals screen both recompute the scope root here before they sign: a server
that lies about the scope gets a signature over a root it did not claim, which counts for nothing. The leaf
digest is recomputed from the payload too (`bc.protocol.payloads` parses it as the control plane did when it
stored the batch), never taken from what the server says. Pure: no store, no wire, no terminal.
"""

from __future__ import annotations

import json

from bc.errors import UsageError
from bc.pki import merkle, preapproval
from bc.pki import ssh as ssh_pki
from bc.protocol import canonical, root_equiv
from bc.protocol.payloads import payload_for, payload_from_json
from bc.protocol.pb import admin_pb2

BULK_BATCH_KIND = "metal.bulk"
"""A provisioning job's batch (docs/metal.md): leaves of several kinds, nodes and payloads, one per destructive
step of each machine; its payload lists them (`{"leaves": [{"node_id", "kind", "payload_json"}, …]}`)."""


def bulk_leaves(batch_id: str, payload_json: str) -> list[tuple[str, str, bytes]]:
    """A `metal.bulk` batch's leaves `(node, kind, payload digest)`, each digest recomputed from its payload."""
    try:
        entries = json.loads(payload_json or "{}")["leaves"]
        out = []
        for e in entries:
            node, kind, text = e["node_id"], e["kind"], e["payload_json"]
            if not all(isinstance(x, str) for x in (node, kind, text)):
                raise TypeError
            payload = payload_for(kind, payload_from_json(kind, text))
            out.append((node, kind, merkle.payload_digest(payload.type_url, payload.value)))
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"batch {batch_id}'s metal.bulk payload does not list its leaves") from None
    return out


def recompute_root(b: admin_pb2.BatchInfo) -> bytes:
    """The scope root from the leaves and the payload, never from what the server says the root is."""
    if not b.leaves:
        raise UsageError(f"batch {b.id} has no leaves")
    if b.kind == BULK_BATCH_KIND:
        return _bulk_root(b)
    digest = leaf_digest(b)
    for leaf in b.leaves:
        if leaf.payload_digest != digest.hex() or leaf.kind != b.kind:
            raise UsageError(f"leaf {leaf.index} of batch {b.id} does not match the batch's kind and payload")
    root = merkle.merkle_root([merkle.leaf_bytes(leaf.node_id, leaf.kind, digest) for leaf in b.leaves])
    if root.hex() != b.scope_root:
        raise UsageError(f"the server's scope root for batch {b.id} does not match its leaves: refusing to sign")
    return root


def _bulk_root(b: admin_pb2.BatchInfo) -> bytes:
    """Each leaf as the payload lists it (node, kind, the digest of its own payload), in order."""
    entries = bulk_leaves(b.id, b.payload_json)
    if len(entries) != len(b.leaves):
        raise UsageError(f"batch {b.id} lists {len(entries)} leaves in its payload and {len(b.leaves)} in its scope")
    for leaf, (node, kind, digest) in zip(b.leaves, entries, strict=True):
        if (leaf.node_id, leaf.kind, leaf.payload_digest) != (node, kind, digest.hex()):
            raise UsageError(f"leaf {leaf.index} of batch {b.id} does not match its payload")
    root = merkle.merkle_root([merkle.leaf_bytes(node, kind, digest) for node, kind, digest in entries])
    if root.hex() != b.scope_root:
        raise UsageError(f"the server's scope root for batch {b.id} does not match its leaves: refusing to sign")
    return root


def leaf_digest(b: admin_pb2.BatchInfo) -> bytes:
    """What every leaf of the batch must carry: the payload's digest, or for an `ssh.grant` batch the digest
    of the principal and the user key's fingerprint (bc.pki.ssh.grant_digest), read from the payload here."""
    if b.kind == ssh_pki.GRANT_BATCH_KIND:
        try:
            doc = json.loads(b.payload_json or "{}")
        except ValueError:
            doc = None
        principal, fingerprint = (doc.get("principal"), doc.get("fingerprint")) if isinstance(doc, dict) else (0, 0)
        if not isinstance(principal, str) or not isinstance(fingerprint, str):
            raise UsageError(f"batch {b.id}'s ssh.grant payload does not name a principal and a key fingerprint")
        return ssh_pki.grant_digest(principal, fingerprint)
    if b.kind == root_equiv.SPEC_BATCH_KIND:
        return spec_change_digest(b)
    if b.kind == preapproval.BATCH_KIND:  # a health policy version: its digest from the version and text shown
        version, text = preapproval.payload_of(b.payload_json)
        preapproval.entries_of_policy(text)  # a text whose pre-approvals cannot be read is not signed
        return preapproval.policy_digest(version, text)
    payload = payload_for(b.kind, payload_from_json(b.kind, b.payload_json or "{}"))
    return merkle.payload_digest(payload.type_url, payload.value)


def spec_change_digest(b: admin_pb2.BatchInfo) -> bytes:
    """A `spec.set` batch's leaf digest, from the section JSON in its payload (bc.protocol.root_equiv), so what
    is signed is the section shown, whatever the server says its digest is."""
    try:
        doc = json.loads(b.payload_json or "{}")
        section, text = doc["section"], doc["section_json"]
        if not isinstance(section, str) or not isinstance(text, str):
            raise TypeError
        return root_equiv.section_digest(section, canonical.section_from_json(section, text))
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"batch {b.id}'s spec.set payload does not name a section and its JSON") from None
