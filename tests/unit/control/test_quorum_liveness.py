"""The rules that keep the quorum live (bc.control.quorum.liveness): pure, over approver keys and operators."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bc.control.quorum.liveness import (
    Holder,
    live_approvers,
    refuse_approver_holder,
    refuse_change,
    refuse_revocation,
)
from bc.pki import quorum as q
from bc.protocol.pb import common_pb2

OP, ADMIN, VIEWER = Holder("operator", False), Holder("admin", False), Holder("viewer", False)
GONE = Holder("operator", True)


def key(name: str, operator: str | None = None) -> common_pb2.ApproverKey:
    return common_pb2.ApproverKey(key_id=f"k-{name}", public_key=b"x" * 32, name=name, operator=operator or name)


def settings(names: list[str], k: int) -> common_pb2.QuorumSettings:
    out = common_pb2.QuorumSettings(version=1)
    if names:
        out.approver_keys.extend(key(n) for n in names)
        out.quorum_k = k
    return out


def test_a_viewer_cannot_hold_an_approver_key_an_operator_or_admin_can() -> None:
    assert refuse_approver_holder("vic", VIEWER) == (
        "operator vic has the viewer role, which cannot approve: an approver key must belong to an operator or an"
        " admin (add one with bc operators add NAME --role operator)"
    )
    assert refuse_approver_holder("olga", OP) is None and refuse_approver_holder("ada", ADMIN) is None


def test_live_approvers_leave_out_revoked_and_viewers_and_count_a_key_of_no_operator() -> None:
    keys = [key("a"), key("b"), key("c"), key("old", operator="")]
    keys[3].operator = ""
    assert live_approvers(keys, {"a": OP, "b": GONE, "c": VIEWER}) == 2  # a, and the key of no operator


def test_a_removal_must_leave_k_live_approvers_unless_the_same_change_lowers_k() -> None:
    holders = {n: OP for n in "abc"}
    frm = settings(["a", "b", "c"], 3)
    why = refuse_change(frm, settings(["a", "b"], 3), holders)
    assert why == (
        "removing approver c would leave 2 live approver(s) for a threshold of 3, so no batch could pass:"
        " lower k in the same change (bc approvers remove c --threshold 2)"
    )
    assert refuse_change(frm, settings(["a", "b"], 2), holders) is None
    assert refuse_change(frm, settings([], 3), holders) is None  # the last one: the quorum is off


def test_a_change_that_keeps_every_key_must_leave_enough_live_approvers_for_the_next_change() -> None:
    holders = {"a": OP, "b": OP, "c": GONE}
    frm = settings(["a", "b", "c"], 2)
    assert "the quorum could never change again" in (refuse_change(frm, settings(["a", "b", "c"], 3), holders) or "")
    assert refuse_change(frm, settings(["a", "b", "c"], 2), holders) is None
    # While setting up (fewer approvers than k), raising k is fine: the approvers there still pass changes.
    assert refuse_change(settings(["a", "b"], 2), settings(["a", "b"], 3), holders) is None


def test_revoking_an_approvers_operator_is_refused_while_it_would_leave_fewer_live_than_k() -> None:
    keys = [key(n) for n in "abc"]
    holders = {n: OP for n in "abc"} | {"dave": OP}
    why = refuse_revocation("c", keys, 3, holders)
    assert why is not None and "revoking them would leave 2 live approver(s) for a threshold of 3" in why
    assert "(bc approvers remove c --threshold 2)" in why
    assert refuse_revocation("c", keys, 2, holders) is None
    assert refuse_revocation("dave", keys, 3, holders) is None  # holds no key


names = st.lists(st.sampled_from("abcdef"), unique=True, max_size=6)
roles = st.sampled_from([OP, ADMIN, VIEWER, GONE])


@given(
    frm_names=names,
    to_names=names,
    k_from=st.integers(1, 7),
    k_to=st.integers(1, 7),
    who=st.dictionaries(st.sampled_from("abcdef"), roles),
)
def test_a_change_the_rules_take_never_leaves_a_quorum_that_cannot_pass_its_next_change(
    frm_names: list[str], to_names: list[str], k_from: int, k_to: int, who: dict[str, Holder]
) -> None:
    holders = {n: who.get(n, OP) for n in "abcdef"}
    frm, to = settings(frm_names, k_from), settings(to_names, k_to)
    if refuse_change(frm, to, holders) is None and to.approver_keys:
        assert live_approvers(to.approver_keys, holders) >= q.change_threshold(to)
        if set(frm_names) - set(to_names):  # a removal also leaves enough for a batch
            assert live_approvers(to.approver_keys, holders) >= k_to


@given(
    members=names.filter(bool),
    k=st.integers(1, 7),
    who=st.dictionaries(st.sampled_from("abcdef"), roles),
    data=st.data(),
)
def test_a_revocation_the_rules_take_never_leaves_fewer_live_approvers_than_k_when_there_were_enough(
    members: list[str], k: int, who: dict[str, Holder], data: st.DataObject
) -> None:
    holders = {n: who.get(n, OP) for n in "abcdef"}
    keys = [key(n) for n in members]
    name = data.draw(st.sampled_from("abcdef"))
    if refuse_revocation(name, keys, k, holders) is None and holders[name] in (OP, ADMIN) and name in members:
        after = holders | {name: Holder(holders[name].role, True)}
        assert live_approvers(keys, after) >= k
