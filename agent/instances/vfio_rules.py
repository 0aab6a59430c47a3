"""Who may hold a VFIO group's device node `/dev/vfio/<group>`. Pure: the owners and running uids come in.

A confined VMM (agent.instances.confine) opens its GPUs' groups as its own
user, so at its start the group's node is handed to that uid (0600), and at
its stop, its delete, or once it is found gone, given back to root. The
decision is taken from the node's own owner and the uids that run processes
now, never from a record the node wrote (the helper's rule, delivery.md's
`ch.vfio`): a record can lie, the kernel's view of the file cannot.

* A group may be **taken** by VMM `uid` when its node is root's, already
  `uid`'s (a restart), or a VMM user's that runs no process any more (left
  by a VMM that died). A running VMM's group, a node owned by anyone else,
  or a group with no node is refused.
* A group is **given back** when its node is a VMM user's that runs no
  process (and, when `uid` is named, that user is `uid`): never a running
  VMM's, never anyone else's.
"""

from __future__ import annotations

from collections.abc import Collection

from agent.instances.confine import is_vmm_uid

ROOT = 0


def take_refusal(group: str, owner: int | None, uid: int, running: Collection[int]) -> str | None:
    """Why VMM `uid` may not take `group` (one sentence), or None when it may."""
    if not is_vmm_uid(uid):
        return f"uid {uid} is not a VMM user"
    if owner is None:
        return f"VFIO group {group} has no device node"
    if owner in (ROOT, uid):
        return None
    if is_vmm_uid(owner):
        if owner in running:
            return f"VFIO group {group} is held by the running VMM user {owner}"
        return None  # its VMM is gone: the group is free
    return f"VFIO group {group}'s node is owned by uid {owner}, neither root nor a VMM user"


def gives_back(owner: int | None, uid: int | None, running: Collection[int]) -> bool:
    """Whether a group's node owned by `owner` goes back to root now (`uid`: only that VMM user's)."""
    if owner is None or owner == ROOT or not is_vmm_uid(owner) or owner in running:
        return False
    return uid is None or owner == uid
