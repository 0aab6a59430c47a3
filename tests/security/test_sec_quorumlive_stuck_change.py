"""Attack: leave a quorum change pending, so that no other change can be asked for during its 24 hours.

The proposer may withdraw a pending change (nobody else may: a refusal, exit 6), and a newer change
supersedes a pending one (both move from the same settings, only one could ever apply): either way a
second change is not blocked, and what was withdrawn or superseded can no longer be approved.
"""

from __future__ import annotations

import pytest

from bc.errors import Conflict, Unauthenticated
from bc.pki import quorum as q
from tests.integration.conftest import InprocLab, lab, store_url  # noqa: F401  (the fixtures)
from tests.integration.operators_lab import Approver, add_operator, approvers, as_operator, sign_change


async def try_approve(server: InprocLab, change_id: str, a: Approver) -> None:
    c = await server.admin.get_quorum_change(change_id)
    msg = q.change_message(c.id, q.settings_digest(c.from_settings), q.settings_digest(c.to_settings), c.requested_by)
    sig = a.key.sign(msg)
    await as_operator(a.config, lambda cl: cl.decide_quorum_change(change_id, a.key_id, sig, approve=True))


async def test_a_pending_change_is_withdrawn_by_its_proposer_or_superseded_and_blocks_nothing(
    lab: InprocLab,  # noqa: F811
) -> None:
    keys = await approvers(lab, n=3, k=2)
    bob = await add_operator(lab, "bob", role="admin")

    first = (await lab.admin.set_approver_threshold(3)).change
    assert first.state == "pending"
    with pytest.raises(Unauthenticated, match=f"quorum change {first.id} was asked for by local: only they may"):
        await as_operator(bob, lambda c: c.withdraw_quorum_change(first.id))
    withdrawn = await lab.admin.withdraw_quorum_change(first.id)
    assert withdrawn.state == "withdrawn"
    with pytest.raises(Conflict, match=f"quorum change {first.id} is already withdrawn"):
        await try_approve(lab, first.id, keys[0])

    # Not blocked: a second change is pending at once, and a newer one (another admin's) supersedes it.
    second = (await lab.admin.set_unbatched_allowance(1)).change
    assert second.state == "pending"
    third = (await as_operator(bob, lambda c: c.set_approver_threshold(3))).change
    assert third.state == "pending"
    assert (await lab.admin.get_quorum_change(second.id)).state == "superseded"
    with pytest.raises(Conflict, match=f"quorum change {second.id} is already superseded"):
        await try_approve(lab, second.id, keys[0])

    assert (await sign_change(lab, third.id, keys)).state == "applied"
    s = await lab.admin.list_approvers()
    assert (s.threshold, s.unbatched_destructive_per_hour) == (3, 0)
    events = [e for e in await lab.admin.list_events(type_prefix="quorum.change-") if e.subject == second.id]
    assert [e.type for e in events][-1] == "quorum.change-superseded"
