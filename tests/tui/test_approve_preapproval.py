"""Approving a health policy's pre-approval from the TUI (tui/approvals.py), as `bc approve sign` does: what the
approver reads is the payload's own summary, the root is recomputed from the text shown, and the signature
lasts as long as the pre-approvals (the batch's expiry), not the hour a command batch's does."""

from __future__ import annotations

import json

import pytest

from bc.errors import UsageError
from bc.pki import preapproval as pre
from bc.protocol.pb import admin_pb2
from tui.approvals import leaves_summary, prepare

NOW = 1_800_000_000_000
UNTIL = NOW + 7 * 86_400_000
TEXT = json.dumps(
    {"preapprove": [{"kind": "node.reboot", "pool": {"rack": "r1"}, "expires_at_ms": UNTIL}]},
    sort_keys=True,
    separators=(",", ":"),
)


def batch(text: str = TEXT, root_text: str = TEXT) -> admin_pb2.BatchInfo:
    b = admin_pb2.BatchInfo(
        id="b-1",
        kind=pre.BATCH_KIND,
        state="pending",
        payload_json=json.dumps({"version": 4, "policy_json": text}),
        scope_root=pre.scope_root(4, root_text).hex(),
        not_after_ms=UNTIL,
        requested_by="admin",
    )
    b.leaves.add(
        index=0, node_id=pre.LEAF_SUBJECT, kind=pre.BATCH_KIND, payload_digest=pre.policy_digest(4, text).hex()
    )
    return b


def test_the_approver_reads_what_the_version_pre_approves_and_signs_until_it_expires() -> None:
    b = batch()
    assert leaves_summary(b) == "health policy v4 pre-approves node.reboot in pool rack=r1 until 2027-01-22T08:00:00Z"
    a = prepare(b, NOW)
    assert a.root == pre.scope_root(4, TEXT) and a.expires_at_ms == UNTIL


def test_a_server_whose_root_is_not_over_the_text_it_shows_is_refused_before_signing() -> None:
    wider = TEXT.replace("r1", "r2")
    with pytest.raises(UsageError, match="does not match its leaves"):
        prepare(batch(text=wider, root_text=TEXT), NOW)
