"""Attack: make a viewer an approver, so that a seat of the quorum is one nobody can ever fill.

A viewer's `bc approve sign` is refused by the role table (approving needs the operator role), so a viewer's
key counts toward n and never toward k: with k = n no batch could pass again. Adding it is refused with one
sentence and exit 2, before anything is stored or a quorum change is pending.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.errors import UsageError
from tests.integration.conftest import InprocLab, lab, store_url  # noqa: F401  (the fixtures)
from tests.integration.operators_lab import add_operator, approvers, b64
from tests.security.quorumlive_helpers import bc_cli, use_lab_config

REFUSAL = (
    "operator vic has the viewer role, which cannot approve: an approver key must belong to an operator or an admin"
)


async def test_a_viewer_made_approver_is_refused_with_no_approvers_and_with_a_quorum(
    lab: InprocLab,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    await add_operator(lab, "vic", role="viewer")
    key = b64(ed25519.Ed25519PrivateKey.generate())

    # Bootstrap (no approvers: a change would apply at once): refused, nothing stored.
    with pytest.raises(UsageError, match=REFUSAL):
        await lab.admin.add_approver("vic", key)
    assert list((await lab.admin.list_approvers()).approvers) == []

    # What the operator sees: one sentence, exit 2.
    use_lab_config(lab, monkeypatch, tmp_path)
    r = await bc_cli("approvers", "add", "vic", key)
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [f"error: {REFUSAL} (add one with bc operators add NAME --role operator)"]

    # With a quorum: refused before a change is pending (nothing for the approvers to sign by mistake),
    # also when the key names vic as its holder under another approver name.
    await approvers(lab, n=2, k=2)
    with pytest.raises(UsageError, match=REFUSAL):
        await lab.admin.add_approver("vic", key)
    with pytest.raises(UsageError, match=REFUSAL):
        await lab.admin.add_approver("victor", key, operator="vic")
    assert await lab.admin.list_quorum_changes(state="pending") == []
    assert [a.name for a in (await lab.admin.list_approvers()).approvers] == ["approver0", "approver1"]
