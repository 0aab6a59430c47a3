"""The condition rules (agent.health.rules), the condition book's ages, and the XID table: pure, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.health import rules, xid
from agent.health.conditions import ConditionBook
from agent.health.readings import GpuReading, HostReading
from agent.health.rules import Verdict

G = "GPU-00000000-0000-0000-0000-000000000001"


@pytest.mark.parametrize(
    ("reading", "xids", "reason"),
    [
        (GpuReading(G, lost=True), [], "FallenOffBus"),
        (GpuReading(G, ecc_volatile_uncorrected=3), [], "EccUncorrectable"),
        (GpuReading(G, remap_failed=True), [], "RowRemapFailed"),
        (GpuReading(G, remap_pending=True), [], "RowRemapPending"),
        (GpuReading(G), [79], "Xid79"),
        (GpuReading(G, throttle=("hw-slowdown",)), [], "Throttled"),
    ],
)
def test_each_fault_makes_the_gpu_unhealthy_with_its_reason(reading: GpuReading, xids: list[int], reason: str) -> None:
    v = rules.gpu_verdict(reading, xids)
    assert (v.type, v.status, v.reason) == (f"GpuHealthy/{G}", "False", reason)
    assert v.message


def test_a_clean_gpu_is_healthy_and_unread_counters_condemn_nothing() -> None:
    assert rules.gpu_verdict(GpuReading(G), []) == Verdict(f"GpuHealthy/{G}", "True", "Healthy")
    assert rules.gpu_verdict(GpuReading(G, ecc_volatile_uncorrected=None), []).status == "True"


def test_the_reason_is_the_worst_problem_and_the_message_lists_them_all() -> None:
    v = rules.gpu_verdict(GpuReading(G, ecc_volatile_uncorrected=1, throttle=("hw-thermal",)), [94])
    assert v.reason == "EccUncorrectable"
    assert "XID 94: contained ECC error" in v.message and "throttled: hw-thermal" in v.message


def test_reads_healthy_after_a_reset_ignores_xids_and_throttling_but_not_memory_faults() -> None:
    assert rules.reads_healthy(GpuReading(G, throttle=("hw-slowdown",)))
    for bad in (
        GpuReading(G, lost=True),
        GpuReading(G, ecc_volatile_uncorrected=1),
        GpuReading(G, remap_pending=True),
        GpuReading(G, remap_failed=True),
    ):
        assert not rules.reads_healthy(bad), bad


def test_application_xids_are_not_critical_and_unknown_ones_are() -> None:
    assert not xid.is_critical(13) and not xid.is_critical(43)
    assert xid.is_critical(79) and xid.is_critical(48) and xid.is_critical(9999)


@pytest.mark.parametrize(
    ("offset_ms", "status", "reason"),
    [(None, "Unknown", "NoServerTime"), (0, "False", "InSync"), (1000, "False", "InSync"), (1001, "True", "Skewed")],
)
def test_clock_skew_beyond_a_second(offset_ms: int | None, status: str, reason: str) -> None:
    v = rules.clock_skew_verdict(offset_ms)
    assert (v.status, v.reason) == (status, reason)
    assert (rules.clock_skew_verdict(-5000).status, "ahead of" in rules.clock_skew_verdict(-5000).message) == (
        "True",
        True,
    )


def test_host_memory_and_disk() -> None:
    gib = 1 << 30
    assert rules.host_verdict(HostReading(100 * gib, 50 * gib, 100 * gib, 50 * gib)).status == "False"
    assert rules.host_verdict(HostReading(100 * gib, 1 * gib, 100 * gib, 50 * gib)).reason == "MemoryLow"
    assert rules.host_verdict(HostReading(100 * gib, 50 * gib, 100 * gib, 1 << 20)).reason == "DiskLow"
    assert rules.host_verdict(HostReading()).status == "False", "unknown counters say nothing"


def test_node_ready_falls_with_a_full_journal_an_exhausted_host_or_a_broken_pass() -> None:
    fine = [rules.journal_full_verdict(False), rules.host_verdict(HostReading())]
    assert rules.node_ready_verdict(fine, "").status == "True"
    assert rules.node_ready_verdict([rules.journal_full_verdict(True)], "").reason == "JournalFull"
    broken = rules.node_ready_verdict(fine, "OSError: disk")
    assert (broken.status, broken.reason) == ("False", "ConvergeError") and "OSError: disk" in broken.message


def test_gpu_of_reads_the_type_back() -> None:
    assert rules.gpu_of(rules.gpu_type(G)) == G
    assert rules.gpu_of("NodeReady") is None


verdicts = st.builds(
    Verdict,
    type=st.sampled_from(["A", "B", "C"]),
    status=st.sampled_from(["True", "False"]),
    reason=st.sampled_from(["r1", "r2"]),
    message=st.sampled_from(["", "m"]),
)


@given(st.lists(st.lists(verdicts, max_size=4, unique_by=lambda v: v.type), min_size=1, max_size=8))
def test_a_conditions_age_restarts_exactly_when_its_status_or_reason_changes(passes: list[list[Verdict]]) -> None:
    book = ConditionBook()
    held: dict[str, tuple[Verdict, float]] = {}
    for t, vs in enumerate(passes):
        changes = book.update(vs, float(t))
        expected = set()
        for v in vs:
            prev = held.get(v.type)
            if prev is None or (prev[0].status, prev[0].reason) != (v.status, v.reason):
                expected.add(v.type)
                held[v.type] = (v, float(t))
            else:
                held[v.type] = (v, prev[1])
        gone = set(held) - {v.type for v in vs}
        for g in gone:
            del held[g]
        assert {c.type for c in changes} == expected | gone
        report = {c.type: c for c in book.report(float(t) + 0.5)}
        assert set(report) == set(held)
        for k, (v, since) in held.items():
            assert report[k].age_ms == round((t + 0.5 - since) * 1000)
            assert (report[k].status, report[k].message) == (v.status, v.message)
