"""The node's own check of root-equivalent spec changes (docs/quorum.md, "Root-equivalent spec changes").

A worker key signs every DesiredState, so a control plane whose worker key
was stolen could sign a spec that adds its own SSH CA, a `toor` principal, a
`kernel.core_pattern` pipe or a new daemon release: root on the node. Once
this node's trust bundle holds approver keys, a spec whose change from the
spec it holds is root-equivalent (`bc.protocol.root_equiv`, from the node's
viewpoint: a principal counts when its user is uid 0 here) is taken only
when, for every such section, the body carries a `SectionApproval` whose
batch approval holds k valid signatures of the bundle's approvers (the same
rule as destructive commands, `bc.pki.quorum.count_approvals`, unexpired at
server time) and whose proof puts this node's leaf — rebuilt here from the
body's node id and the section's own content, never taken from the proof —
under the signed root; a root principal added by an approved `bc ssh grant
--principal root` is covered instead by that `ssh.grant` batch's approval
(its leaf rebuilt from the principal and the key fingerprint the approvers
signed for). Otherwise the whole spec is refused (the node keeps
the one it holds and reports `spec.rejected` with the reason), as a spec
with a bad signature is.

The first spec a node takes (nothing held: just joined, or its held spec was
lost) is checked too, against the node's baseline: an empty spec whose
access section holds only the SSH CA keys the join answer named (signed by
the CA key with the answer, so no gateway and no worker key chose them). So a
control plane with a stolen worker key cannot give a freshly joined node its
own CA, a root principal or a core-pattern pipe either. At the baseline the
approvals' expiry is not checked (`count_approvals` without a time): a node
joining, or re-fetching its spec, long after a change was approved must still
take what the quorum approved for this very node and content, and nothing
else passes. Pure but for `is_root_user`, passed in.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Sequence

from google.protobuf.message import DecodeError, Message

from bc.pki import merkle
from bc.pki import quorum as q
from bc.pki import ssh as ssh_pki
from bc.protocol import root_equiv
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2

REFUSED = "ROOT_EQUIVALENT"


def is_root_user(name: str, getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam) -> bool:
    """Whether a local user name is root here: uid 0 by getpwnam (`toor`…), or `root` in any spelling."""
    if name.lower() == "root":
        return True
    try:
        return getpwnam(name).pw_uid == 0
    except (KeyError, ValueError):
        return False


def baseline(ssh_ca_keys: Sequence[str]) -> spec_pb2.NodeSpec:
    """What a node holds before its first spec, for the check: nothing but the join answer's SSH CA keys."""
    spec = spec_pb2.NodeSpec()
    spec.access.ssh_ca_keys.extend(ssh_ca_keys)
    return spec


def _verified(
    a: session_pb2.SectionApproval, leaf: bytes, bundle: common_pb2.TrustBundle, server_now_ms: int | None
) -> str | None:
    """None when `a` holds k valid signatures of the bundle's approvers over a root its proof puts `leaf` under."""
    approval, proof = common_pb2.BatchApproval(), common_pb2.BatchProof()
    try:
        approval.ParseFromString(a.batch_approval)
        proof.ParseFromString(a.batch_proof)
    except DecodeError:
        return "its approval or proof does not decode"
    if proof.tree_size != approval.leaf_count or not merkle.verify_proof(
        leaf, proof.leaf_index, proof.tree_size, proof.path, bytes(approval.scope_root)
    ):
        return f"batch {approval.batch_id or '?'}'s proof does not put this content in its approved scope"
    tally = q.count_approvals(approval, list(bundle.approver_keys), server_now_ms)
    need = max(1, bundle.quorum_k)
    if len(tally.counted) < need:
        return f"batch {approval.batch_id} holds {len(tally.counted)} of the {need} approvals it needs"
    return None


def approval_problem(
    section: str,
    content: Message,
    node_id: str,
    approvals: list[session_pb2.SectionApproval],
    bundle: common_pb2.TrustBundle,
    server_now_ms: int | None,
) -> str | None:
    """None when one of `approvals` is the quorum's for exactly this section's content on this node."""
    found = [a for a in approvals if a.section == section and not a.grant_principal]
    if not found:
        return "the spec carries no quorum approval for it"
    leaf = merkle.leaf_bytes(node_id, root_equiv.SPEC_BATCH_KIND, root_equiv.section_digest(section, content))
    why = ""
    for a in found:
        why = _verified(a, leaf, bundle, server_now_ms) or ""
        if not why:
            return None
    return why


def granted(
    principal: str,
    node_id: str,
    approvals: list[session_pb2.SectionApproval],
    bundle: common_pb2.TrustBundle,
    now: int | None,
) -> bool:
    """Whether an approved `ssh.grant` batch (`bc ssh grant --principal root`) covers adding `principal`."""
    for a in approvals:
        if a.section != "access" or not a.grant_principal or f"{a.grant_principal}@{node_id}" != principal:
            continue
        try:
            digest = ssh_pki.grant_digest(a.grant_principal, a.grant_fingerprint)
            leaf = merkle.leaf_bytes(node_id, ssh_pki.GRANT_BATCH_KIND, digest)
        except ValueError:
            continue
        if _verified(a, leaf, bundle, now) is None:
            return True
    return False


def _grant_only(
    held: spec_pb2.AccessSection,
    new: spec_pb2.AccessSection,
    view: root_equiv.Viewpoint,
    approvals: list[session_pb2.SectionApproval],
    bundle: common_pb2.TrustBundle,
    now: int | None,
) -> bool:
    """Whether the access change widens nothing but root principals, each an approved grant's."""
    rest = spec_pb2.AccessSection()
    rest.CopyFrom(new)
    del rest.principals[:]
    rest.principals.extend(held.principals)
    if root_equiv.changes("access", held, rest, view):
        return False
    added = [p for p in new.principals if p not in set(held.principals)]
    roots = [p for p in added if root_equiv.changes("access", held, _with(held, p), view)]
    return all(granted(p, view.node_id, approvals, bundle, now) for p in roots)


def _with(held: spec_pb2.AccessSection, principal: str) -> spec_pb2.AccessSection:
    one = spec_pb2.AccessSection()
    one.CopyFrom(held)
    one.principals.append(principal)
    return one


def check_spec(
    body: session_pb2.DesiredStateBody,
    new_spec: spec_pb2.NodeSpec,
    held_spec: spec_pb2.NodeSpec | None,
    bundle: common_pb2.TrustBundle,
    server_now_ms: int,
    root_user: Callable[[str], bool] = is_root_user,
    baseline_ca_keys: Sequence[str] = (),
) -> str | None:
    """None when `new_spec` may replace `held_spec` (None: the first spec, checked against `baseline` of the
    join answer's SSH CA keys, approvals unexpired or not); else "ROOT_EQUIVALENT: why" (the spec is refused)."""
    if not bundle.approver_keys:
        return None
    now: int | None = server_now_ms
    if held_spec is None:
        held_spec, now = baseline(baseline_ca_keys), None
    view = root_equiv.Viewpoint(node_id=body.node_id, at_node=True, is_root_user=root_user)
    approvals = list(body.section_approvals)
    for section, reasons in root_equiv.spec_changes(held_spec, new_spec, view).items():
        new = getattr(new_spec, section)
        why = approval_problem(section, new, body.node_id, approvals, bundle, now)
        if (
            why is not None
            and section == "access"
            and _grant_only(held_spec.access, new_spec.access, view, approvals, bundle, now)
        ):
            continue  # nothing but root principals, each an approved grant's
        if why is not None:
            first = " (the first spec this node takes)" if now is None else ""
            return f"{REFUSED}: the {section} change{first} {reasons[0]}, and {why}"
    return None
