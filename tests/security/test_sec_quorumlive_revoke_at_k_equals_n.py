"""Attack: revoke (or remove) one approver of a k = n quorum, locking it for good.

A revoked operator's approvals are refused, but its key stays in the set and counts toward n: with k = n no
batch could pass, and no quorum change either (a change needs min(k, n) of the current approvers, the dead
key among them), not even the one that would drop the dead key. So the revocation is refused while it would
leave fewer live approvers than k, and so is a removal, unless the same change lowers k; that change is
approved by the approvers there, and then the revocation goes through and the quorum still works.
"""

from __future__ import annotations

import pytest

from bc.errors import Conflict
from tests.integration.conftest import InprocLab, lab, store_url  # noqa: F401  (the fixtures)
from tests.integration.operators_lab import approvers, settle


async def test_revoking_an_approver_with_k_equal_n_is_refused_unless_a_change_lowers_k_first(
    lab: InprocLab,  # noqa: F811
) -> None:
    keys = await approvers(lab, n=3, k=3)

    async def settings() -> tuple[int, int, list[str]]:
        s = await lab.admin.list_approvers()
        return s.threshold, s.version, [a.key_id for a in s.approvers]

    before = await settings()

    with pytest.raises(
        Conflict,
        match=r"operator approver2 holds approver key approver2: revoking them would leave 2 live approver\(s\)"
        r" for a threshold of 3, and no batch or quorum change could pass again; first remove the key in a"
        r" change that lowers k \(bc approvers remove approver2 --threshold 2\), then try again",
    ):
        await lab.admin.revoke_operator("approver2", reason="left the team")
    assert not {o.name: o for o in await lab.admin.list_operators()}["approver2"].revoked

    # Removing the key without lowering k would leave two approvers for k = 3: refused, nothing pending.
    with pytest.raises(Conflict, match=r"would leave 2 live approver\(s\) for a threshold of 3.*--threshold 2"):
        await lab.admin.remove_approver("approver2")
    assert await lab.admin.list_quorum_changes(state="pending") == []
    assert await settings() == before

    # The same change lowers k: approved by the current approvers, as every change is.
    after = await settle(lab, await lab.admin.remove_approver("approver2", threshold=2), keys)
    assert (after.threshold, [a.name for a in after.approvers]) == (2, ["approver0", "approver1"])
    assert (await lab.admin.revoke_operator("approver2", reason="left the team")).revoked

    # The quorum is live: the two left pass the next change (and could pass a batch, k = 2).
    with pytest.raises(Conflict, match=r"revoking them would leave 1 live approver\(s\) for a threshold of 2"):
        await lab.admin.revoke_operator("approver1", reason="also leaving")
    done = await settle(lab, await lab.admin.set_unbatched_allowance(1), keys[:2])
    assert (done.unbatched_destructive_per_hour, done.threshold) == (1, 2)
