"""A health policy's pre-approvals (bc.pki.preapproval): the pure rules both ends apply.

The node runs a pre-approved destructive command only when the signed policy version it carries holds k
approvals of its own bundle's keys over that exact text, pre-approves that kind, for a pool whose every label
is among the node's own, and has not expired; every other case is refused with its reason.
"""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import UsageError
from bc.pki import preapproval as pre
from bc.pki import quorum as q
from bc.protocol.pb import common_pb2

KEYS = [ed25519.Ed25519PrivateKey.generate() for _ in range(3)]
NOW = 1_800_000_000_000
LATER = NOW + 86_400_000
VERSION = 7


def raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def bundle(k: int = 2) -> common_pb2.TrustBundle:
    b = common_pb2.TrustBundle(quorum_k=k)
    for i, key in enumerate(KEYS):
        b.approver_keys.add(key_id=q.key_id(raw(key)), public_key=raw(key), name=f"a{i}", operator=f"op{i}")
    return b


def policy_text(entries: list[dict[str, object]]) -> str:
    return json.dumps({"enabled": True, "preapprove": entries}, sort_keys=True, separators=(",", ":"))


ENTRY = {"kind": "gpu.reset", "pool": {"pool": "a"}, "expires_at_ms": LATER}


def signed(
    text: str,
    signers: list[int],
    *,
    version: int = VERSION,
    signed_version: int | None = None,
    signed_text: str | None = None,
    expires: int = LATER,
    requested_by: str = "admin",
) -> bytes:
    """The HealthPreapproval a command carries: `signers` signed the root of (signed_version, signed_text)."""
    root = pre.scope_root(
        version if signed_version is None else signed_version, text if signed_text is None else signed_text
    )
    a = common_pb2.BatchApproval(batch_id="b-1", scope_root=root, requested_by=requested_by, leaf_count=1)
    for i in signers:
        msg = q.approval_message("b-1", root, 1, requested_by, expires)
        a.signatures.add(key_id=q.key_id(raw(KEYS[i])), expires_at_ms=expires, signature=KEYS[i].sign(msg))
    h = common_pb2.HealthPreapproval(policy_version=version, policy_json=text, batch_approval=a.SerializeToString())
    return h.SerializeToString()


def check(blob: bytes, kind: str = "gpu.reset", labels: dict[str, str] | None = None, now: int = NOW) -> str | None:
    return pre.check(blob, kind, {"pool": "a", "rack": "r1"} if labels is None else labels, bundle(), now)


# -- the node's check, case by case ------------------------------------------------------------------------


def test_k_signatures_over_the_version_pre_approve_its_kind_in_its_pool() -> None:
    assert check(signed(policy_text([ENTRY]), [0, 1])) is None


def test_one_signature_of_two_pre_approves_nothing() -> None:
    why = check(signed(policy_text([ENTRY]), [0]))
    assert why == f"health policy v{VERSION} holds 1 of the 2 approvals it needs"


def test_another_kind_another_pool_or_an_expired_entry_is_refused_with_the_reason() -> None:
    blob = signed(policy_text([ENTRY]), [0, 1])
    assert "it pre-approves gpu.reset, not node.reboot" in str(check(blob, kind="node.reboot"))
    assert "the node is not in pool pool=a" in str(check(blob, labels={"pool": "b"}))
    assert "the node is not in pool pool=a" in str(check(blob, labels={}))
    assert "expired" in str(check(blob, now=LATER))


def test_signatures_over_another_version_or_text_count_for_nothing() -> None:
    text = policy_text([ENTRY])
    wider = policy_text([{**ENTRY, "pool": {"rack": "r1"}}])
    for blob in (
        signed(text, [0, 1], signed_version=VERSION - 1),  # an old version's signatures on a new version's text
        signed(wider, [0, 1], signed_text=text),  # a control plane widens the pool it shows the node
    ):
        assert check(blob) == f"the signatures carried are not over health policy v{VERSION} as carried"


def test_the_requesters_key_and_expired_signatures_do_not_count() -> None:
    assert "1 of the 2" in str(check(signed(policy_text([ENTRY]), [0, 1], requested_by="op1")))
    assert "0 of the 2" in str(check(signed(policy_text([ENTRY]), [0, 1], expires=NOW)))


def test_garbage_and_an_unsigned_version_are_refused() -> None:
    assert check(b"\xff\xff") == "the pre-approval does not decode"
    empty = common_pb2.HealthPreapproval(policy_version=3, policy_json=policy_text([ENTRY])).SerializeToString()
    assert check(empty) == "the pre-approval names no signed policy version"


def test_unreadable_pre_approvals_in_a_signed_text_pre_approve_nothing() -> None:
    text = json.dumps({"preapprove": [{"kind": "disk.wipe", "pool": {"pool": "a"}, "expires_at_ms": LATER}]})
    assert "cannot be read" in str(check(signed(text, [0, 1])))


# -- the entries' format -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({}, "preapprove must be a list"),
        ([{"kind": "disk.wipe", "pool": {"a": "b"}, "expires_at_ms": 1}], "kind must be one of gpu.reset, node.reboot"),
        ([{"kind": "gpu.reset", "pool": {}, "expires_at_ms": 1}], "pool must be a non-empty object"),
        ([{"kind": "gpu.reset", "pool": {"a": 1}, "expires_at_ms": 1}], "must be a string"),
        ([{"kind": "gpu.reset", "pool": {"bad key!": "x"}, "expires_at_ms": 1}], "bad label key"),
        ([{"kind": "gpu.reset", "pool": {"bc.dev/cap.x": "1"}, "expires_at_ms": 1}], "is the system's"),
        ([{"kind": "gpu.reset", "pool": {"a": "b"}, "expires_at_ms": True}], "expires_at_ms must be a time"),
        ([{"kind": "gpu.reset", "pool": {"a": "b"}, "expires_at_ms": 1, "flag": 1}], "unknown key 'flag'"),
        ([ENTRY] * (pre.MAX_ENTRIES + 1), f"at most {pre.MAX_ENTRIES}"),
    ],
)
def test_a_bad_entry_is_refused_in_one_sentence(value: object, said: str) -> None:
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(".", r"\.")):
        pre.entries(value)


def test_lifetimes_are_checked_when_the_version_is_set() -> None:
    found = pre.entries([ENTRY])
    pre.check_lifetimes(found, NOW)
    with pytest.raises(UsageError, match="has already expired"):
        pre.check_lifetimes(found, LATER)
    with pytest.raises(UsageError, match="more than 90 days"):
        pre.check_lifetimes(found, LATER - pre.MAX_LIFETIME_MS - 1)


def test_the_summary_an_approver_reads_comes_from_the_signed_payload() -> None:
    payload = json.dumps({"version": 3, "policy_json": policy_text([ENTRY])})
    assert pre.summary(payload) == "health policy v3 pre-approves gpu.reset in pool pool=a until 2027-01-16T08:00:00Z"


# -- properties ------------------------------------------------------------------------------------------------

names = st.sampled_from(["pool", "rack", "zone", "team"])
values = st.sampled_from(["a", "b", "c"])
labelsets = st.dictionaries(names, values, max_size=4)
pools = st.dictionaries(names, values, min_size=1, max_size=3)
entries_st = st.lists(
    st.fixed_dictionaries(
        {
            "kind": st.sampled_from(pre.KINDS),
            "pool": pools,
            "expires_at_ms": st.integers(NOW - 10, NOW + 10),
        }
    ),
    max_size=4,
)


@given(pool=pools, labels=labelsets)
def test_a_pool_matches_exactly_when_each_of_its_labels_is_on_the_node(
    pool: dict[str, str], labels: dict[str, str]
) -> None:
    assert pre.selector_matches(pool.items(), labels) == (pool.items() <= labels.items())
    assert not pre.selector_matches((), labels)


@given(entries=entries_st, labels=labelsets, kind=st.sampled_from(pre.KINDS), now=st.integers(NOW - 12, NOW + 12))
def test_the_node_runs_a_command_exactly_when_some_signed_entry_covers_it(
    entries: list[dict[str, object]], labels: dict[str, str], kind: str, now: int
) -> None:
    covered = any(
        e["kind"] == kind
        and dict(e["pool"]).items() <= labels.items()  # type: ignore[call-overload]
        and int(e["expires_at_ms"]) > now  # type: ignore[call-overload]
        for e in entries
    )
    text = policy_text(entries)
    assert (check(signed(text, [1, 2]), kind, labels, now) is None) == covered
    assert check(signed(text, [2]), kind, labels, now) is not None  # one of two never covers anything


@given(entries=entries_st.filter(bool), data=st.data())
def test_any_byte_changed_in_the_signed_text_refuses_it(entries: list[dict[str, object]], data: st.DataObject) -> None:
    text = policy_text(entries)
    i = data.draw(st.integers(0, len(text) - 1))
    changed = text[:i] + ("X" if text[i] != "X" else "Y") + text[i + 1 :]
    assert check(signed(changed, [0, 1], signed_text=text)) is not None
