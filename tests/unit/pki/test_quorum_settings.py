"""The quorum settings as one signed value (bc.pki.quorum): their digest, what a change needs and says, and who
counts — by key, by operator and never the requester."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given
from hypothesis import strategies as st

from bc.pki import quorum as q
from bc.protocol.pb import common_pb2

KEYS = [ed25519.Ed25519PrivateKey.generate() for _ in range(4)]


def raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def approver(i: int, name: str = "", operator: str | None = None) -> common_pb2.ApproverKey:
    name = name or f"a{i}"
    return common_pb2.ApproverKey(
        key_id=q.key_id(raw(KEYS[i])),
        public_key=raw(KEYS[i]),
        name=name,
        operator=name if operator is None else operator,
    )


def settings(
    members: list[common_pb2.ApproverKey], k: int = 2, version: int = 1, allowance: int = 0
) -> common_pb2.QuorumSettings:
    return common_pb2.QuorumSettings(
        version=version, approver_keys=members, quorum_k=k, unbatched_destructive_per_hour=allowance
    )


# -- the digest -----------------------------------------------------------------------------------------


@given(st.permutations([0, 1, 2, 3]))
def test_the_digest_does_not_depend_on_the_order_approvers_are_listed_in(order: list[int]) -> None:
    assert q.settings_digest(settings([approver(i) for i in order])) == q.settings_digest(
        settings([approver(i) for i in range(4)])
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda s: setattr(s, "version", 2),
        lambda s: setattr(s, "quorum_k", 3),
        lambda s: setattr(s, "unbatched_destructive_per_hour", 1),
        lambda s: setattr(s.approver_keys[0], "name", "mallory"),
        lambda s: setattr(s.approver_keys[0], "operator", "mallory"),
        lambda s: setattr(s.approver_keys[0], "public_key", raw(KEYS[3])),
        lambda s: s.approver_keys.add().CopyFrom(approver(3)),
        lambda s: s.approver_keys.pop(),
    ],
    ids=["version", "k", "allowance", "name", "operator", "public-key", "added", "removed"],
)
def test_every_field_is_under_the_digest(change: object) -> None:
    s = settings([approver(0), approver(1)])
    before = q.settings_digest(s)
    change(s)  # type: ignore[operator]
    assert q.settings_digest(s) != before


def test_a_bundle_without_approvers_holds_no_k_and_no_allowance() -> None:
    b = common_pb2.TrustBundle(quorum_k=5, unbatched_destructive_per_hour=9, quorum_version=4)
    assert q.settings_of(b) == common_pb2.QuorumSettings(version=4)
    b.approver_keys.append(approver(0))
    assert (q.settings_of(b).quorum_k, q.settings_of(b).unbatched_destructive_per_hour) == (5, 9)


# -- what a change needs and says --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "k", "need"),
    [(0, 2, 0), (1, 2, 1), (2, 2, 2), (3, 2, 2), (3, 3, 3), (4, 1, 1), (2, 5, 2), (3, 0, 1)],
)
def test_a_change_needs_k_of_the_current_approvers_or_all_while_there_are_fewer(n: int, k: int, need: int) -> None:
    assert q.change_threshold(settings([approver(i) for i in range(n)], k=k)) == need


def test_a_change_is_described_from_the_two_settings_alone() -> None:
    frm = settings([approver(0), approver(1)], k=2, version=3)
    to = settings([approver(0), approver(2, operator="")], k=1, version=4, allowance=2)
    text = q.describe_change(frm, to)
    assert text.startswith(f"add approver a2 (key {approver(2).key_id[:19]}…, no operator); remove approver a1;")
    assert "set k from 2 to 1" in text and "allowance from 0 to 2 an hour" in text
    assert text.endswith("(quorum settings version 3 to 4)")
    assert q.describe_change(frm, settings(list(frm.approver_keys), version=4)).startswith("change nothing but")


def test_a_look_alike_name_is_shown_escaped() -> None:
    frm = settings([approver(0)])
    to = settings([approver(0), approver(1, name="p\u0430ul")], version=2)
    assert "add approver 'p\\u0430ul'" in q.describe_change(frm, to)


# -- who counts ----------------------------------------------------------------------------------------------


def batch_approval(requested_by: str, signers: list[int], expires: int = 2_000) -> common_pb2.BatchApproval:
    a = common_pb2.BatchApproval(batch_id="b-1", scope_root=b"r" * 32, requested_by=requested_by, leaf_count=2)
    for i in signers:
        msg = q.approval_message("b-1", b"r" * 32, 2, requested_by, expires)
        a.signatures.add(key_id=q.key_id(raw(KEYS[i])), expires_at_ms=expires, signature=KEYS[i].sign(msg))
    return a


def test_a_batch_approval_by_a_key_registered_to_the_requester_does_not_count_whatever_its_name() -> None:
    keys = [approver(0, "alice"), approver(1, "m2", operator="mallory"), approver(2, "bob")]
    t = q.count_approvals(batch_approval("mallory", [0, 1, 2]), keys, 1_000)
    assert t.counted == [keys[0].key_id, keys[2].key_id]
    assert t.refused == [(keys[1].key_id, "the requester's own key")]


def test_two_keys_of_one_operator_are_one_approval() -> None:
    keys = [approver(0, "alice"), approver(1, "alice2", operator="alice"), approver(2, "bob")]
    t = q.count_approvals(batch_approval("ops", [0, 1, 2]), keys, 1_000)
    assert t.counted == [keys[0].key_id, keys[2].key_id]
    assert t.refused == [(keys[1].key_id, "operator alice already approved")]


def test_keys_from_before_operators_count_each_and_never_by_the_requesters_name() -> None:
    keys = [approver(0, "alice", operator=""), approver(1, "bob", operator=""), approver(2, "ops", operator="")]
    t = q.count_approvals(batch_approval("ops", [0, 1, 2]), keys, 1_000)
    assert t.counted == [keys[0].key_id, keys[1].key_id] and t.refused == [(keys[2].key_id, "the requester's own key")]


def test_change_approvals_count_only_from_the_settings_they_move_from() -> None:
    frm = settings([approver(0), approver(1), approver(2)])
    to = settings([approver(0), approver(1)], version=2)
    c = common_pb2.QuorumChange(change_id="q-1", requested_by="ops", from_digest=q.settings_digest(frm), settings=to)
    msg = q.change_message("q-1", c.from_digest, q.settings_digest(to), "ops")
    for i in (0, 2):
        c.signatures.add(key_id=approver(i).key_id, signature=KEYS[i].sign(msg))
    assert q.count_change_approvals(c, frm).counted == [approver(0).key_id, approver(2).key_id]
    other = settings([approver(0), approver(1), approver(2)], version=9)
    t = q.count_change_approvals(c, other)
    assert t.counted == [] and {why for _, why in t.refused} == {"signed a change from other settings"}
    c.settings.quorum_k = 1  # the settings moved after the signatures: they no longer hold
    assert {why for _, why in q.count_change_approvals(c, frm).refused} == {"bad signature"}
