"""Keeping the quorum live: the rules that refuse an approver change or a revocation that would lock it.

A k-of-n quorum is only as good as the approvals that can still come. An
approver is **live** when the operator its key is registered to exists, is not
revoked, and has a role that may approve (operator or admin: a viewer's
`bc approve sign` is refused by the role table, so a viewer's key is a seat
nobody can fill). A key registered to no operator (added before operators
existed) is live: its decisions come under any certificate but the requester's.

A batch needs k live approvers; a quorum change needs `change_threshold(S)` =
min(k, n) of S's own approvers, counting the dead ones in n. So revoking the
operator of one approver with k = n locks both forever: no batch passes, and
no change (not even the one that would drop the dead key) can gather its
approvals. The rules, checked by the server before anything is stored:

* **add**: the key's operator must be able to approve (operator or admin);
* **remove**: the settings left must hold at least k' live approvers (k' the
  threshold they carry), unless they hold none at all (the quorum is off): the
  same change may lower k (`bc approvers remove NAME --threshold K`), and it is
  approved, as every change is, by the current approvers;
* **any other change** (k, the allowance, an added key) must leave at least
  `change_threshold(S')` live approvers, so the next change can still pass;
* **revoke an operator** who holds a live approver key: refused when the live
  approvers left would be fewer than k (remove the key first, lowering k).

Pure: the callers read the approver keys, k and the operators, and pass them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bc.pki import quorum as q
from bc.protocol.pb import common_pb2

APPROVING_ROLES = frozenset({"operator", "admin"})
"""Roles whose `bc approve sign` the role table takes (bc/api/admin_roles.py: ApproveBatch needs operator)."""


@dataclass(frozen=True)
class Holder:
    """What decides whether an operator can approve: its role and whether it was revoked."""

    role: str
    revoked: bool


def can_approve(holder: Holder | None) -> bool:
    return holder is not None and not holder.revoked and holder.role in APPROVING_ROLES


def is_live(key: common_pb2.ApproverKey, holders: Mapping[str, Holder]) -> bool:
    """Whether this key's approvals can still come: a key of no operator always can (the old rule by name)."""
    return not key.operator or can_approve(holders.get(key.operator))


def live_approvers(keys: Sequence[common_pb2.ApproverKey], holders: Mapping[str, Holder]) -> int:
    """Distinct people whose approvals can still come (an operator holds one key; a key of none counts alone)."""
    return len({a.operator or f"key:{a.key_id}" for a in keys if is_live(a, holders)})


def refuse_approver_holder(operator: str, holder: Holder | None) -> str | None:
    """Why `operator` cannot hold an approver key (None: it can); missing and revoked are the caller's."""
    if holder is not None and not holder.revoked and holder.role not in APPROVING_ROLES:
        return (
            f"operator {operator} has the {holder.role} role, which cannot approve: an approver key must belong to"
            f" an operator or an admin (add one with bc operators add NAME --role operator)"
        )
    return None


def refuse_change(
    frm: common_pb2.QuorumSettings, to: common_pb2.QuorumSettings, holders: Mapping[str, Holder]
) -> str | None:
    """Why the change frm → to would leave the quorum unable to pass what it asks (None: it stays live).

    `to` carries k as `quorum_k` (the effective settings: no approvers, nothing enforced, nothing to lock).
    """
    if not to.approver_keys:
        return None  # the quorum is off: the signing root alone guards the next change
    live = live_approvers(to.approver_keys, holders)
    k = to.quorum_k
    removed = {a.key_id for a in frm.approver_keys} - {a.key_id for a in to.approver_keys}
    if removed:
        if live >= k:
            return None
        names = ", ".join(sorted(a.name for a in frm.approver_keys if a.key_id in removed))
        lower = (
            f"lower k in the same change (bc approvers remove {names} --threshold {live})"
            if live
            else "no live approver would be left to approve anything: remove the others or add live ones first"
        )
        return (
            f"removing approver {names} would leave {live} live approver(s) for a threshold of {k},"
            f" so no batch could pass: {lower}"
        )
    need = q.change_threshold(to)
    if live >= need:
        return None
    return (
        f"this change would leave {live} live approver(s) where the next change needs {need}:"
        " the quorum could never change again (revoked operators and viewers cannot approve)"
    )


def refuse_revocation(
    name: str,
    keys: Sequence[common_pb2.ApproverKey],
    k: int,
    holders: Mapping[str, Holder],
    action: str = "revoking them",
) -> str | None:
    """Why revoking operator `name` (or making them a viewer: `action`) would lock the quorum (None: it may go)."""
    held = [a for a in keys if a.operator == name and is_live(a, holders)]
    if not held:
        return None
    after = dict(holders)
    current = holders.get(name)
    after[name] = Holder(current.role if current is not None else "viewer", revoked=True)
    live = live_approvers(keys, after)
    if live >= k:
        return None
    key_name = held[0].name
    how = (
        f"bc approvers remove {key_name} --threshold {live}"
        if live
        else f"bc approvers remove {key_name}, which turns the quorum off"
        if len(keys) == 1
        else f"bc approvers remove {key_name}"
    )
    return (
        f"operator {name} holds approver key {key_name}: {action} would leave {live} live approver(s) for a"
        f" threshold of {k}, and no batch or quorum change could pass again; first remove the key in a change"
        f" that lowers k ({how}), then try again"
    )
