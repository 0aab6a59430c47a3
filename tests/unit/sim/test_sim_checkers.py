"""The simulator's invariant checkers on hand-made fact sets: each passes a good set and names the
counterexample of each kind of bad one."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from bc.control.capacity import invariants
from bc.control.capacity.invariants import Release
from bc.control.capacity.usage_windows import Span, UsageWindow
from bc.sim.checkers import (
    DoubleExecution,
    FalseUnreachable,
    NotConverged,
    RunAfterJournalLoss,
    WentBack,
    check_all,
    check_i2,
    check_i3,
    check_i4,
    check_spec_order,
)
from bc.sim.facts import (
    AgentRestart,
    Bound,
    FactLog,
    JournalLoss,
    Outage,
    Outcome,
    QuietSnapshot,
    SideEffect,
    SpecApplied,
    SpecDelivered,
    StatusReported,
    connectivity_from_events,
)
from tests.unit.capacity.fleet import H, atoms, booking, node, req

T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z
S = 1000


def start(t_s: float, cid: str = "c1", kind: str = "gpu.reset", node_id: str = "n1", boot: str = "b1") -> SideEffect:
    return SideEffect(T0 + int(t_s * S), node_id, cid, kind, boot)


def restart(t_s: float, node_id: str = "n1", boot_changed: bool = False) -> AgentRestart:
    return AgentRestart(T0 + int(t_s * S), node_id, boot_changed)


# ---- I2 ----


def test_i2_passes_one_start_each_and_a_retry_safe_rerun_after_a_crash() -> None:
    starts = [start(0, "c1"), start(1, "c2", "logs.collect"), start(30, "c2", "logs.collect")]
    assert check_i2(starts, [restart(10)], [], []) is None


def test_i2_names_a_non_retry_safe_command_started_twice_even_across_a_crash() -> None:
    found = check_i2([start(0), start(60)], [restart(10)], [], [])
    assert isinstance(found, DoubleExecution)
    assert found.sentence == (
        "I2: gpu.reset c1 started on n1 at 2027-01-15T08:00:00Z and again on n1 at 2027-01-15T08:01:00Z "
        "(not retry-safe)"
    )


def test_i2_a_self_terminating_command_runs_once_though_its_kind_is_retry_safe() -> None:
    found = check_i2([start(0, kind="node.reboot"), start(90, kind="node.reboot", boot="b2")], [restart(30)], [], [])
    assert isinstance(found, DoubleExecution)
    assert found.why == "self-terminating"


def test_i2_a_retry_safe_command_reruns_only_after_a_crash_of_its_node() -> None:
    twice = [start(0, kind="logs.collect"), start(20, kind="logs.collect")]
    found = check_i2(twice, [restart(10, node_id="n2")], [], [])  # another node's crash interrupts nothing
    assert isinstance(found, DoubleExecution)
    assert found.sentence.endswith("(retry-safe, but no crash between)")
    assert check_i2(twice, [restart(10)], [], []) is None
    assert check_i2(twice, [], [JournalLoss(T0 + 10 * S, "n1", "j1", "j2")], []) is None


def test_i2_a_non_retry_safe_command_in_flight_in_a_lost_journal_never_runs_again() -> None:
    loss = JournalLoss(T0 + 10 * S, "n1", "j-old", "j-new", in_flight=("c1",))
    found = check_i2([start(0)], [], [loss], [Outcome("c1", "n1", "gpu.reset", "failed", "journal-lost")])
    assert found is None
    found = check_i2([start(0)], [], [loss], [Outcome("c1", "n1", "gpu.reset", "succeeded", "")])
    assert isinstance(found, RunAfterJournalLoss)
    assert found.sentence == (
        "I2: lost n1's journal j-old at 2027-01-15T08:00:10Z with gpu.reset c1 in flight, and it ended succeeded"
    )
    # Accepted but not started when the journal went: it must not start in the new one.
    found = check_i2([start(40)], [], [loss], [Outcome("c1", "n1", "gpu.reset", "failed", "journal-lost")])
    assert isinstance(found, RunAfterJournalLoss)
    assert found.sentence.endswith("in flight, and it started again at 2027-01-15T08:00:40Z")
    # A retry-safe one is replayed and may run again.
    safe = JournalLoss(T0 + 10 * S, "n1", "j-old", "j-new", in_flight=("c2",))
    runs = [start(0, "c2", "logs.collect"), start(40, "c2", "logs.collect")]
    assert check_i2(runs, [], [safe], [Outcome("c2", "n1", "logs.collect", "succeeded", "")]) is None


KINDS_UNDER_TEST = ["gpu.reset", "logs.collect", "node.reboot", "instance.snapshot", "diag.nvml"]


@given(
    kind=st.sampled_from(KINDS_UNDER_TEST),
    events=st.lists(
        st.tuples(st.sampled_from(["start", "restart", "other-node-restart"]), st.integers(0, 5)), max_size=12
    ),
)
def test_i2_over_random_starts_and_restarts(kind: str, events: list[tuple[str, int]]) -> None:
    """Time moves on by each step's gap (0-5 s, so starts and restarts share instants). A once-only kind
    fails from its second start, whatever restarts; a retry-safe one fails exactly when two consecutive starts
    have no restart of its own node after the first and at or before the second. The order the facts are
    listed in does not matter."""
    t, starts, restarts = 0, [], []
    for what, gap in events:
        t += gap
        if what == "start":
            starts.append(start(t, kind=kind))
        else:
            restarts.append(restart(t, node_id="n1" if what == "restart" else "n2"))
    if kind in ("gpu.reset", "node.reboot", "instance.snapshot"):
        expect_fail = len(starts) >= 2
    else:
        own = [r.t_ms for r in restarts if r.node_id == "n1"]
        expect_fail = any(not any(a.t_ms < r <= b.t_ms for r in own) for a, b in itertools.pairwise(starts))
    found = check_i2(starts, restarts, [], [])
    assert (found is not None) == expect_fail
    if found is not None:
        assert isinstance(found, DoubleExecution) and found.second.command_id == "c1"
    assert check_i2(list(reversed(starts)), list(reversed(restarts)), [], []) == found


# ---- I3 ----


def delivered(t_s: float, gen: int, node_id: str = "n1") -> SpecDelivered:
    return SpecDelivered(T0 + int(t_s * S), node_id, gen)


def reported(t_s: float, gen: int, node_id: str = "n1") -> StatusReported:
    return StatusReported(T0 + int(t_s * S), node_id, gen)


END = T0 + 3600 * S


def test_i3_passes_a_spec_observed_within_the_bound_by_that_or_a_newer_generation() -> None:
    assert check_i3([delivered(0, 3)], [reported(59, 3)], [], [], END) is None
    assert check_i3([delivered(0, 3), delivered(5, 4)], [reported(30, 4)], [], [], END) is None


def test_i3_names_a_spec_not_reported_in_time() -> None:
    found = check_i3([delivered(0, 3)], [reported(30, 2), reported(61, 3)], [], [], END)
    assert isinstance(found, NotConverged)
    assert found.sentence == (
        "I3: n1 received spec generation 3 at 2027-01-15T08:00:00Z and stayed reachable, but did not report it "
        "observed within 60 s (the last report said observed 2 at 2027-01-15T08:00:30Z)"
    )
    assert found.at_ms == T0 + 60 * S
    # A report before the delivery that did not say it yet does not count, nor another node's.
    found = check_i3([delivered(100, 3)], [reported(50, 2), reported(120, 3, "n2")], [], [], END)
    assert isinstance(found, NotConverged) and found.latest is None
    assert found.sentence.endswith("(no status report)")


def test_i3_does_not_ask_a_node_that_was_not_reachable_or_restarted_or_past_the_run() -> None:
    d = [delivered(0, 3)]
    assert check_i3(d, [], [Outage(T0 + 20 * S, T0 + 200 * S, "n1", "partition")], [], END) is None
    assert check_i3(d, [], [Outage(T0 + 20 * S, None, None, "control-plane-restart")], [], END) is None
    assert check_i3(d, [], [], [restart(30)], END) is None
    assert check_i3(d, [], [], [], T0 + 59 * S) is None
    # An outage elsewhere, or before the delivery, excuses nothing.
    assert check_i3(d, [], [Outage(T0 + 20 * S, None, "n2", "partition")], [], END) is not None
    assert check_i3(d, [], [Outage(T0 - 50 * S, T0 - S, "n1", "partition")], [], END) is not None


@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["deliver", "report"]),
            st.sampled_from(["n1", "n2"]),
            st.integers(0, 40_000),  # ms since the step before: ties, and gaps past the bound
            st.integers(0, 4),  # the generation delivered, or observed
        ),
        max_size=40,
    ),
)
def test_i3_on_the_reports_factlog_keeps_agrees_with_every_report(steps: list[tuple[str, str, int, int]]) -> None:
    """FactLog drops status reports that repeat the last one kept; I3 reaches the same verdict on the same
    delivery as it would on every report the gateway heard."""
    facts = FactLog()
    every: list[StatusReported] = []
    t = T0
    for seq, (what, node_id, gap, gen) in enumerate(steps, start=1):
        t += gap
        if what == "deliver":
            facts.spec_delivered(t, node_id, gen)
        else:
            facts.status_reported(t, node_id, gen)
            every.append(StatusReported(t, node_id, gen, seq))  # the taps' order, as FactLog numbers them
    end = t + 120_000
    kept = check_i3(facts.deliveries, facts.reports, [], [], end, bound_ms=30_000)
    full = check_i3(facts.deliveries, every, [], [], end, bound_ms=30_000)
    assert (kept is None) == (full is None)
    if kept is not None and full is not None:
        assert kept.delivery == full.delivery
    assert len(facts.reports) <= len(every)


def test_repeated_status_reports_are_kept_once_and_again_after_a_delivery() -> None:
    facts = FactLog()
    for t_s in (0, 10, 20):
        facts.status_reported(T0 + t_s * S, "n1", 3)
    facts.spec_delivered(T0 + 25 * S, "n1", 4)
    facts.status_reported(T0 + 30 * S, "n1", 3)  # the first after the delivery: kept
    facts.status_reported(T0 + 40 * S, "n1", 3)
    facts.status_reported(T0 + 50 * S, "n1", 4)
    assert [(r.t_ms - T0) // S for r in facts.reports] == [0, 30, 50]


def test_i3_a_spec_sent_again_after_its_report_asks_nothing_new() -> None:
    """A duplicate or re-sent spec of a generation the same agent already reported observed: agents do not
    repeat a status that says nothing new, and I3 does not wait for one."""
    facts = FactLog()
    facts.spec_delivered(T0, "n1", 1)
    facts.status_reported(T0, "n1", 1)  # the same virtual instant, after it in the taps' order
    facts.spec_delivered(T0 + 5 * S, "n1", 1)  # a duplicate frame
    assert check_i3(facts.deliveries, facts.reports, [], [], T0 + 600 * S) is None


def test_i3_a_restart_between_the_report_and_the_re_delivery_needs_a_new_report() -> None:
    facts = FactLog()
    facts.spec_delivered(T0, "n1", 1)
    facts.status_reported(T0 + 1 * S, "n1", 1)
    facts.agent_restart(T0 + 3 * S, "n1", boot_changed=False)
    facts.spec_delivered(T0 + 5 * S, "n1", 1)  # the new agent lost its journal and hears the spec again
    found = check_i3(facts.deliveries, facts.reports, [], facts.restarts, T0 + 600 * S)
    # the restart is before the delivery, not inside its window, so only a new report could answer it
    assert found is not None and found.delivery.t_ms == T0 + 5 * S
    facts.status_reported(T0 + 6 * S, "n1", 1)  # the new agent's first report is kept even though it repeats
    assert check_i3(facts.deliveries, facts.reports, [], facts.restarts, T0 + 600 * S) is None


def test_i3_a_report_in_the_delivery_instant_but_before_it_answers_nothing() -> None:
    facts = FactLog()
    facts.status_reported(T0, "n1", 0)
    facts.spec_delivered(T0, "n1", 1)
    found = check_i3(facts.deliveries, facts.reports, [], [], T0 + 600 * S)
    assert found is not None and found.latest is None


# ---- I3: never backwards ----


def applied(t_s: float, generation: int, journal_id: str = "j1", node_id: str = "n1", seq: int = 0) -> SpecApplied:
    return SpecApplied(T0 + int(t_s * S), node_id, journal_id, generation, seq)


def test_i3_passes_generations_that_only_go_up_or_repeat_under_each_journal() -> None:
    assert check_spec_order([applied(0, 1), applied(10, 3), applied(20, 3), applied(30, 7)]) is None
    assert check_spec_order([]) is None


def test_i3_names_a_node_that_applied_an_older_generation_after_a_newer_one() -> None:
    found = check_spec_order([applied(0, 2), applied(10, 5), applied(20, 5), applied(30, 4), applied(40, 1)])
    assert isinstance(found, WentBack)
    assert (found.newer.generation, found.older.generation, found.at_ms) == (5, 4, T0 + 30 * S)
    assert found.newer.t_ms == T0 + 10 * S  # the first time it held 5
    assert found.sentence == (
        "I3: n1 applied spec generation 4 at 2027-01-15T08:00:30Z, after it had applied generation 5 at "
        "2027-01-15T08:00:10Z (journal j1): a node never goes back"
    )


def test_i3_a_fresh_journal_starts_over_and_nodes_are_judged_apart() -> None:
    # a journal loss: j2 holds nothing, and the control plane sends it what is newest (or, late, older)
    assert check_spec_order([applied(0, 5), applied(10, 2, "j2"), applied(20, 6, "j2")]) is None
    assert check_spec_order([applied(0, 5), applied(10, 2, node_id="n2")]) is None
    # back to the old journal's id is the same journal: it must not go below what it held
    assert check_spec_order([applied(0, 5), applied(10, 2, "j2"), applied(20, 4)]) is not None


def test_i3_reads_the_taps_order_within_one_instant() -> None:
    assert check_spec_order([applied(0, 3, seq=2), applied(0, 4, seq=1)]) is not None  # 4, then 3
    assert check_spec_order([applied(0, 3, seq=1), applied(0, 4, seq=2)]) is None


def test_check_all_reports_the_earlier_of_i3s_two_halves() -> None:
    facts = good_run()
    facts.spec_delivered(T0 + 100 * S, "n1", 3)  # never reported observed: missed at T0 + 160 s
    facts.spec_applied(T0 + 100 * S, "n1", "j1", 3)
    facts.spec_applied(T0 + 130 * S, "n1", "j1", 2)  # went back first
    i3 = check_all(facts)[2]
    assert (i3.id, i3.ok, i3.at_ms) == ("I3", False, T0 + 130 * S)
    assert i3.counterexample is not None and i3.counterexample.endswith("a node never goes back")
    facts.applied.pop()
    assert check_all(facts)[2].at_ms == T0 + 160 * S


# ---- I4 ----


def log_with(frames_s: list[float], node_id: str = "n1", gap_ms: int = 20_000) -> FactLog:
    facts = FactLog(heard_gap_ms=gap_ms)
    for f in frames_s:
        facts.heard(T0 + int(f * S), node_id)
    return facts


def test_i4_passes_a_node_marked_unreachable_long_after_its_last_frame() -> None:
    facts = log_with([0, 10, 20, 30])
    facts.connectivity_changed(T0 + 60 * S, "n1", "disconnected")
    facts.connectivity_changed(T0 + 100 * S, "n1", "unreachable")
    assert check_i4(facts) is None


def test_i4_names_a_node_marked_unreachable_soon_after_a_frame() -> None:
    facts = log_with([0, 10, 20, 30, 90, 95])
    facts.connectivity_changed(T0 + 100 * S, "n1", "unreachable")
    found = check_i4(facts)
    assert isinstance(found, FalseUnreachable)
    assert found.sentence == (
        "I4: n1 was marked unreachable at 2027-01-15T08:01:40Z, 5 s after a gateway last heard from it "
        "(the bound is 20 s)"
    )
    # Marked while the frames kept coming: the span of them is the evidence.
    facts = log_with([0, 10, 20, 30, 40])
    facts.connectivity_changed(T0 + 25 * S, "n1", "unreachable")
    found = check_i4(facts)
    assert isinstance(found, FalseUnreachable)
    assert found.sentence == (
        "I4: n1 was marked unreachable at 2027-01-15T08:00:25Z while a gateway was hearing from it (frames from "
        "2027-01-15T08:00:00Z to 2027-01-15T08:00:40Z, each less than 20 s after the one before; the bound is 20 s)"
    )
    # Exactly the bound after the last frame is not within it.
    facts = log_with([0, 20])
    facts.connectivity_changed(T0 + 40 * S, "n1", "unreachable")
    assert check_i4(facts) is None
    facts.connectivity_changed(T0 + 39 * S, "n1", "unreachable")
    assert check_i4(facts) is not None
    facts = log_with([0])
    facts.connectivity_changed(T0 + 19 * S, "n1", "lost")
    assert isinstance(check_i4(facts), FalseUnreachable)
    # A frame at the mark's own instant had not been handled yet; another node's frames are not this one's.
    facts = log_with([0, 100], node_id="n2")
    facts.heard(T0, "n1")
    facts.connectivity_changed(T0 + 100 * S, "n1", "unreachable")
    facts.connectivity_changed(T0 + 100 * S, "n2", "unreachable")
    assert check_i4(facts) is None


def test_i4_counts_a_late_frame_from_when_it_was_sent() -> None:
    """A frame a stall held back is news of the node when it left, known from when it arrived: a gateway
    waking from a 50 s stall reads frames its node sent just before it lost power (`--chaos storm`)."""
    facts = log_with([0, 10])
    facts.heard(T0 + 60 * S, "n1", sent_ms=T0 + 12 * S)  # sent at 12 s, read at 60 s
    facts.connectivity_changed(T0 + 70 * S, "n1", "unreachable")
    assert check_i4(facts) is None  # 58 s after it was sent
    # Sent within the bound before the mark, and read before it: the control plane could know.
    facts = log_with([0, 10])
    facts.heard(T0 + 60 * S, "n1", sent_ms=T0 + 55 * S)
    facts.connectivity_changed(T0 + 70 * S, "n1", "unreachable")
    found = check_i4(facts)
    assert isinstance(found, FalseUnreachable)
    assert found.sentence == (
        "I4: n1 was marked unreachable at 2027-01-15T08:01:10Z, 15 s after it sent a frame a gateway received late, "
        "at 2027-01-15T08:01:00Z (the bound is 20 s)"
    )
    # Read only after the mark: it was not known then.
    facts = log_with([0, 10])
    facts.heard(T0 + 80 * S, "n1", sent_ms=T0 + 65 * S)
    facts.connectivity_changed(T0 + 70 * S, "n1", "unreachable")
    assert check_i4(facts) is None
    # A frame less than a second late counts at its delivery, as before.
    facts = log_with([])
    facts.heard(T0 + 60 * S, "n1", sent_ms=T0 + 59_500)
    assert [(h.first_ms, h.last_ms) for h in facts.heard_spans("n1")] == [(T0 + 60 * S, T0 + 60 * S)]


@given(
    frames=st.lists(
        st.tuples(st.integers(0, 200_000), st.sampled_from([0, 200, 999, 1_000, 5_000, 60_000])), max_size=30
    ),
    marks=st.lists(st.integers(0, 220_000), min_size=1, max_size=5),
    bound=st.sampled_from([20_000, 25_000]),
)
def test_i4_with_late_frames_agrees_with_every_frame_kept(
    frames: list[tuple[int, int]], marks: list[int], bound: int
) -> None:
    """Each frame (delivered, delay): known from its delivery, news of its delivery when less than a second
    late, else of when it was sent. I4 on what FactLog keeps equals I4 on every frame."""
    facts = FactLog()
    for delivered, delay in frames:
        facts.heard(delivered, "n1", sent_ms=delivered - delay)
    for m in marks:
        facts.connectivity_changed(m, "n1", "unreachable")
    news = [(d, d if delay < facts.late_ms else d - delay) for d, delay in frames]
    brute = any(any(d < m and m - t < bound for d, t in news) for m in marks)
    assert (check_i4(facts, bound_ms=bound) is not None) == brute


def test_i4_bound_below_the_logs_gap_is_refused() -> None:
    facts = log_with([0], gap_ms=30_000)
    try:
        check_i4(facts)
    except ValueError as e:
        assert "below the log's heard gap" in str(e)
    else:
        raise AssertionError("a bound below the gap must be refused")


@given(
    frames=st.lists(st.integers(0, 200_000), max_size=30),
    marks=st.lists(st.integers(0, 220_000), min_size=1, max_size=5),
    gap=st.sampled_from([1, 5_000, 20_000]),
    bound=st.sampled_from([20_000, 25_000]),
)
def test_i4_on_spans_agrees_with_every_frame_kept(frames: list[int], marks: list[int], gap: int, bound: int) -> None:
    """The spans FactLog keeps answer I4 exactly as the list of every frame would, in whatever order the
    frames were appended."""
    facts = FactLog(heard_gap_ms=gap)
    for f in frames:
        facts.heard(f, "n1")
    for m in marks:
        facts.connectivity_changed(m, "n1", "unreachable")
    brute = any(any(h < m and m - h < bound for h in frames) for m in marks)
    assert (check_i4(facts, bound_ms=bound) is not None) == brute
    spans = facts.heard_spans("n1")
    assert all(a.last_ms + gap <= b.first_ms for a, b in itertools.pairwise(spans))
    assert sorted({f for f in frames}) == sorted(
        {f for f in frames if any(s.first_ms <= f <= s.last_ms for s in spans)}
    )


def test_connectivity_facts_come_from_the_events_log() -> None:
    events = [
        (1, "node.connectivity", "n1", '{"state": "connected", "epoch": 1}', T0),
        (2, "command.created", "c1", "{}", T0 + 1),
        (3, "node.connectivity", "n1", '{"state": "unreachable", "reason": "NodeUnreachable"}', T0 + 2),
    ]
    got = connectivity_from_events(events)
    assert [(c.t_ms, c.state, c.reason) for c in got] == [
        (T0, "connected", ""),
        (T0 + 2, "unreachable", "NodeUnreachable"),
    ]


# ---- check_all, and I1, I5, I7, I8 through the capacity checkers ----


def good_run() -> FactLog:
    facts = FactLog()
    facts.nodes = [node("n1", 2)]
    facts.bookings = [booking("r1", "n1", [0], T0, T0 + H), booking("r2", "n1", [0], T0 + H, None)]
    facts.bound = [Bound("n1", "r1", atoms("n1", 0), T0 + S, T0 + H)]
    facts.side_effect(T0, "n1", "c1", "gpu.reset", "b1")
    facts.spec_delivered(T0, "n1", 2)
    facts.status_reported(T0 + 5 * S, "n1", 2)
    facts.heard(T0 + 5 * S, "n1")
    facts.releases = [Release("r1", "n1", T0 + H, "window-ended")]
    facts.spans = [Span("r1", "n1", "t", "gpu", 1, T0, T0 + H, T0)]
    facts.windows = [UsageWindow("r1", "n1", "t", "gpu", 1, T0, T0 + H)]
    facts.quiet = QuietSnapshot((node("n1", 2),), tuple(facts.bookings), (), T0 + 2 * H)
    facts.finish(T0 + 2 * H)
    return facts


def test_check_all_passes_a_good_run_with_one_result_per_checker() -> None:
    results = check_all(good_run())
    assert [(r.id, r.ok, r.counterexample, r.at_ms) for r in results] == [
        (i, True, None, None) for i in ("I1", "I2", "I3", "I4", "I5", "I8", "Q1")
    ]
    assert [r.id for r in check_all(good_run(), i7=True)] == ["I1", "I2", "I3", "I4", "I5", "I7", "I8", "Q1"]


def test_check_all_reports_each_capacity_violation_with_the_capacity_checkers_own_sentence() -> None:
    facts = good_run()
    facts.bookings.append(booking("r3", "n1", [0], T0 + 30 * 60_000, T0 + H))
    i1 = check_all(facts)[0]
    want = invariants.check_no_overlap(facts.bookings)
    assert want is not None and not i1.ok and i1.counterexample == want.sentence and i1.at_ms == want.at_ms

    facts = good_run()
    facts.bound.append(Bound("n1", "r2", atoms("n1", 1), T0 + 2 * H, None))  # r2 booked gpu0, bound gpu1
    i1 = check_all(facts)[0]
    assert i1.counterexample == ("I1: n1 bound n1-gpu1 for r2 at 2027-01-15T10:00:00Z, which r2 did not book there")

    facts = good_run()
    facts.bound.append(Bound("n1", "r2", atoms("n1", 0), T0 + 30 * 60_000, None))  # bound while r1 holds it
    assert check_all(facts)[0].counterexample == (
        "I1: r1 and r2 both book n1-gpu0 / n1-gpu0 on n1 at 2027-01-15T08:30:00Z"
    )

    facts = good_run()
    facts.connectivity_changed(T0 + 10 * 60_000, "n1", "unreachable")
    facts.releases.append(Release("r2", "n1", T0 + 11 * 60_000, "node-unreachable"))
    i5 = check_all(facts)[4]
    assert (i5.id, i5.ok, i5.at_ms) == ("I5", False, T0 + 11 * 60_000)
    assert i5.counterexample == (
        "I5: r2 was released at 2027-01-15T08:11:00Z for 'node-unreachable' while n1 was away since "
        "2027-01-15T08:10:00Z"
    )

    facts = good_run()
    facts.windows.append(UsageWindow("r1", "n1", "t", "gpu", 1, T0, T0 + H))
    i8 = next(r for r in check_all(facts) if r.id == "I8")
    assert (i8.id, i8.ok) == ("I8", False)
    assert i8.counterexample == "I8: usage window ('r1', 1800000000000) of r1 is counted twice"

    facts = good_run()
    facts.quiet = QuietSnapshot((node("n1", 2),), tuple(facts.bookings), ((req("r9", 1), None),), T0 + 2 * H)
    i7 = check_all(facts, i7=True)[5]
    assert (i7.id, i7.ok) == ("I7", False)
    assert i7.counterexample == "I7: r9 is pending but fits on n1 (n1-gpu1) from 2027-01-15T10:00:00Z"


def test_check_all_reports_i2_i3_i4_at_the_simulated_time_of_the_violation() -> None:
    facts = good_run()
    facts.side_effect(T0 + 50 * S, "n1", "c1", "gpu.reset", "b1")
    facts.spec_delivered(T0 + 100 * S, "n1", 3)
    facts.heard(T0 + 200 * S, "n1")
    facts.connectivity_changed(T0 + 210 * S, "n1", "unreachable")
    by_id = {r.id: r for r in check_all(facts)}
    assert (by_id["I2"].ok, by_id["I2"].at_ms) == (False, T0 + 50 * S)
    assert (by_id["I3"].ok, by_id["I3"].at_ms) == (False, T0 + 160 * S)
    assert (by_id["I4"].ok, by_id["I4"].at_ms) == (False, T0 + 210 * S)
    assert by_id["I2"].counterexample is not None and by_id["I2"].counterexample.startswith("I2: gpu.reset c1")


def test_outages_begun_and_ended_become_spans_and_the_open_ones_stay_open_at_the_end() -> None:
    facts = FactLog()
    facts.outage_began(T0, "n1", "partition")
    facts.outage_began(T0 + S, None, "control-plane")
    facts.outage_ended(T0 + 10 * S, "n1", "partition")
    facts.outage_ended(T0 + 10 * S, "n2", "partition")  # never began: nothing
    facts.finish(T0 + 20 * S)
    assert facts.outages == [
        Outage(T0, T0 + 10 * S, "n1", "partition"),
        Outage(T0 + S, None, None, "control-plane"),
    ]
