"""agent.instances.vfio_rules: who may take a VFIO group's node, and when it goes back to root."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.instances.confine import VMM_UID_BASE, VMM_UID_SPAN, is_vmm_uid
from agent.instances.vfio_rules import ROOT, gives_back, take_refusal

A, B = VMM_UID_BASE, VMM_UID_BASE + 1
vmm_uids = st.integers(VMM_UID_BASE, VMM_UID_BASE + VMM_UID_SPAN - 1)
any_uids = st.one_of(vmm_uids, st.integers(0, 2**32 - 1))


def test_refusals_say_why_in_one_sentence() -> None:
    assert take_refusal("7", ROOT, 1000, set()) == "uid 1000 is not a VMM user"
    assert take_refusal("7", None, A, set()) == "VFIO group 7 has no device node"
    assert take_refusal("7", B, A, {B}) == f"VFIO group 7 is held by the running VMM user {B}"
    assert take_refusal("7", 1000, A, set()) == "VFIO group 7's node is owned by uid 1000, neither root nor a VMM user"


def test_root_s_own_and_a_gone_vmm_s_groups_may_be_taken() -> None:
    assert take_refusal("7", ROOT, A, {B}) is None
    assert take_refusal("7", A, A, {A}) is None  # a restart of the same VMM user
    assert take_refusal("7", B, A, {A}) is None  # B runs nothing: its VMM is gone


@given(owner=st.one_of(st.none(), any_uids), uid=any_uids, running=st.frozensets(any_uids, max_size=4))
def test_a_group_is_never_taken_from_a_running_vmm_or_by_a_non_vmm(
    owner: int | None, uid: int, running: frozenset[int]
) -> None:
    ok = take_refusal("3", owner, uid, running) is None
    if ok:
        assert is_vmm_uid(uid) and owner is not None
        assert owner in (ROOT, uid) or (is_vmm_uid(owner) and owner not in running)


@given(owner=st.one_of(st.none(), any_uids), uid=st.one_of(st.none(), vmm_uids), running=st.frozensets(any_uids))
def test_only_a_gone_vmm_s_node_goes_back(owner: int | None, uid: int | None, running: frozenset[int]) -> None:
    back = gives_back(owner, uid, running)
    if back:
        assert owner is not None and is_vmm_uid(owner) and owner not in running
        assert uid is None or owner == uid
    # what goes back can then be taken by anyone: root owns it
    if back and uid is not None:
        assert take_refusal("3", ROOT, uid, running) is None


def test_give_back_cases() -> None:
    assert gives_back(A, A, set()) and gives_back(A, None, {B})
    assert not gives_back(A, A, {A})  # its VMM still runs
    assert not gives_back(A, B, set())  # another's, when only B's are asked for
    assert not gives_back(ROOT, None, set()) and not gives_back(1000, None, set()) and not gives_back(None, A, set())
