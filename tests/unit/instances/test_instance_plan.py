"""agent.instances.plan and agent.instances.admission: one instance's state machine and host admission."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.instances import plan as p
from agent.instances.admission import Admission, HostMemory, commitment_mib, parse_meminfo
from bc.protocol.instance_rules import DESIRED_STATES

OBSERVED = (p.ABSENT, "RUNNING", "PAUSED", "STOPPED")


@given(st.sampled_from(OBSERVED), st.sampled_from(DESIRED_STATES))
def test_every_plan_is_legal_and_ends_in_the_desired_state(observed: str, desired: str) -> None:
    state = observed
    for step in p.plan(desired, observed):
        state = p.apply(state, step)  # raises on an illegal step
    assert state == p.final_state(desired)


@given(st.sampled_from(OBSERVED), st.sampled_from(DESIRED_STATES))
def test_a_plan_is_idempotent_and_a_resume_is_never_a_start(observed: str, desired: str) -> None:
    todo = p.plan(desired, observed)
    assert p.plan(desired, p.final_state(desired) if desired != "DELETED" else p.ABSENT) == ()
    if observed == "PAUSED":
        assert not set(todo) & p.STARTS
    if set(todo) & p.STARTS:
        assert observed in (p.ABSENT, "STOPPED") and todo[0] == p.DEFINE


def test_a_state_outside_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="can't plan from 'CRASHED' to 'RUNNING'"):
        p.plan("RUNNING", "CRASHED")
    with pytest.raises(ValueError, match="can't start a domain in state RUNNING"):
        p.apply("RUNNING", p.START)


def test_the_overhead_is_a_32nd_plus_256_mib() -> None:
    assert commitment_mib(1024) == 1024 + 32 + 256
    assert commitment_mib(100) == 100 + 4 + 256  # rounded up


def test_admission_counts_live_domains_holds_and_earlier_starts() -> None:
    host = HostMemory(total_mib=8192, hugetlb_mib=2048)  # budget 8192 - 2048 - 1024 = 5120
    ledger = Admission.for_pass(host, [1024], [512 * 1024 * 1024])  # 1312 + 512 committed
    assert ledger.left_mib == 5120 - 1312 - 512
    assert ledger.admit("a", 2048) is None  # 2368 needed, 3296 left
    assert ledger.admit("b", 1024) == "ResourcesExhausted: 1312 MiB needed, 928 MiB left"
    assert ledger.admitted == ["a"]
    ledger.release(1024)
    assert ledger.admit("b", 1024) is None


@given(
    st.integers(0, 1 << 20),
    st.integers(0, 1 << 18),
    st.lists(st.integers(16, 1 << 16), max_size=6),
    st.lists(st.integers(0, 1 << 36), max_size=4),
    st.lists(st.integers(16, 1 << 16), max_size=8),
)
def test_admitted_starts_never_overcommit_the_budget(
    total: int, huge: int, live: list[int], holds: list[int], starts: list[int]
) -> None:
    host = HostMemory(total, huge)
    ledger = Admission.for_pass(host, live, holds)
    before = ledger.committed_mib
    admitted = 0
    for i, m in enumerate(starts):
        refusal = ledger.admit(f"i{i}", m)
        if refusal is None:
            admitted += commitment_mib(m)
            assert ledger.committed_mib <= host.budget_mib
        else:
            assert refusal.startswith(f"ResourcesExhausted: {commitment_mib(m)} MiB needed, ")
            assert commitment_mib(m) > host.budget_mib - ledger.committed_mib
    assert ledger.committed_mib == before + admitted


def test_meminfo_gives_total_and_the_huge_page_pool() -> None:
    text = "MemTotal:       16384000 kB\nMemFree:  100 kB\nHugetlb:         2097152 kB\n"
    assert parse_meminfo(text) == HostMemory(16000, 2048)
    with pytest.raises(ValueError, match="no MemTotal"):
        parse_meminfo("MemFree: 1 kB\n")
