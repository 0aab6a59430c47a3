"""The journal's pure rules, row by row against the reference tables.

Reference: delivery "Duplicates and crash recovery" (Resolve, Recover, Sweep),
"The journal" (bounds), failure-modes "Daemon crash or node reboot".
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.journal_rules import (
    KEEP_S,
    MAX_BYTES,
    MAX_EVENTS,
    METRIC,
    RESULT,
    TRANSITION,
    Acceptance,
    BoundsPlan,
    CommandConflict,
    CommandEntry,
    CommandState,
    EventRow,
    Resolution,
    Settlement,
    UnknownCommand,
    accept_entry,
    clamp_bounds,
    done_entry,
    is_full,
    plan_bounds,
    recover,
    rejected_entry,
    resolve,
    running_entry,
    sweep,
    unacked,
)

INC, BOOT = "inc-now", "boot-now"
OLD_INC, OLD_BOOT = "inc-old", "boot-old"
DAY = 86400.0


def entry(
    state: CommandState,
    *,
    cid: str = "c1",
    inc: str = OLD_INC,
    boot: str = BOOT,
    retry_safe: bool = False,
    self_terminating: bool = False,
    at: float = 1000.0,
    result: bytes | None = None,
    acked: bool = False,
) -> CommandEntry:
    return CommandEntry(
        command_id=cid,
        kind="k",
        state=state,
        incarnation_id=inc,
        boot_id=boot,
        retry_safe=retry_safe,
        self_terminating=self_terminating,
        updated_at=at,
        result=result if result is not None or state != "done" else b"result-" + cid.encode(),
        acked=acked,
    )


# -- resolve ------------------------------------------------------------------

RESOLVE_ROWS = [
    # the reference's table, one row each
    pytest.param(None, Resolution.EXECUTE, id="none-execute"),
    pytest.param(entry("done"), Resolution.RESEND, id="done-resend"),
    pytest.param(entry("accepted", inc=INC), Resolution.REATTACH, id="accepted-this-process-reattach"),
    pytest.param(entry("running", inc=INC), Resolution.REATTACH, id="running-this-process-reattach"),
    pytest.param(
        entry("running", boot=OLD_BOOT, self_terminating=True), Resolution.REBOOTED, id="self-term-earlier-boot"
    ),
    pytest.param(entry("accepted", retry_safe=True), Resolution.REEXECUTE, id="earlier-process-retry-safe-accepted"),
    pytest.param(entry("running", retry_safe=True), Resolution.REEXECUTE, id="earlier-process-retry-safe-running"),
    pytest.param(entry("accepted"), Resolution.INTERRUPTED, id="earlier-process-not-retry-safe-accepted"),
    pytest.param(entry("running"), Resolution.INTERRUPTED, id="earlier-process-not-retry-safe-running"),
    # the notes under the tables
    pytest.param(
        entry("running", self_terminating=True, retry_safe=True),
        Resolution.REEXECUTE,
        id="self-term-same-boot-earlier-process-retry-safe",
    ),
    pytest.param(
        entry("running", self_terminating=True),
        Resolution.INTERRUPTED,
        id="self-term-same-boot-earlier-process-not-retry-safe",
    ),
    pytest.param(
        entry("accepted", boot=OLD_BOOT, self_terminating=True),
        Resolution.INTERRUPTED,
        id="self-term-accepted-earlier-boot-never-started",
    ),
    pytest.param(
        entry("accepted", boot=OLD_BOOT, self_terminating=True, retry_safe=True),
        Resolution.REEXECUTE,
        id="self-term-accepted-earlier-boot-retry-safe",
    ),
    pytest.param(
        entry("running", boot=OLD_BOOT, self_terminating=True, retry_safe=True),
        Resolution.REBOOTED,
        id="self-term-earlier-boot-retry-safe-still-rebooted",
    ),
    pytest.param(entry("running", boot=OLD_BOOT), Resolution.INTERRUPTED, id="not-self-term-earlier-boot"),
    pytest.param(entry("done", inc=INC), Resolution.RESEND, id="done-this-process-resend"),
    pytest.param(
        entry("done", boot=OLD_BOOT, self_terminating=True), Resolution.RESEND, id="done-self-term-earlier-boot"
    ),
    pytest.param(
        entry("running", inc=INC, self_terminating=True), Resolution.REATTACH, id="self-term-this-process-reattach"
    ),
]


@pytest.mark.parametrize(("found", "expected"), RESOLVE_ROWS)
def test_resolve_follows_the_reference_table(found: CommandEntry | None, expected: Resolution) -> None:
    assert resolve(found, INC, BOOT) is expected


entries = st.builds(
    CommandEntry,
    command_id=st.sampled_from(["a", "b", "c"]),
    kind=st.just("k"),
    state=st.sampled_from(["accepted", "running", "done"]),
    incarnation_id=st.sampled_from([INC, OLD_INC]),
    boot_id=st.sampled_from([BOOT, OLD_BOOT]),
    retry_safe=st.booleans(),
    self_terminating=st.booleans(),
    updated_at=st.floats(0, 30 * DAY),
    result=st.none() | st.binary(max_size=4),
    acked=st.booleans(),
)


@given(entries)
def test_resolve_never_runs_a_done_command_again(e: CommandEntry) -> None:
    r = resolve(e, INC, BOOT)
    if e.state == "done":
        assert r is Resolution.RESEND
    elif e.incarnation_id == INC:
        assert r is Resolution.REATTACH
    else:
        assert r is not Resolution.EXECUTE
        if r is Resolution.REEXECUTE:
            assert e.retry_safe
        if r is Resolution.REBOOTED:
            assert e.state == "running" and e.self_terminating and e.boot_id != BOOT


# -- recover ------------------------------------------------------------------

RECOVER_ROWS = [
    # failure-modes "Daemon crash or node reboot": what is left, and the outcome
    pytest.param(entry("done"), [], id="done-replayed-not-settled"),
    pytest.param(entry("accepted", retry_safe=True), [], id="accepted-retry-safe-waits"),
    pytest.param(entry("running", retry_safe=True), [], id="running-retry-safe-waits"),
    pytest.param(entry("accepted"), [Settlement("c1", "interrupted", BOOT)], id="accepted-not-retry-safe"),
    pytest.param(entry("running"), [Settlement("c1", "interrupted", BOOT)], id="running-not-retry-safe"),
    pytest.param(
        entry("running", self_terminating=True),
        [Settlement("c1", "interrupted", BOOT)],
        id="self-term-same-boot-not-retry-safe",
    ),
    pytest.param(entry("running", self_terminating=True, retry_safe=True), [], id="self-term-same-boot-retry-safe"),
    pytest.param(
        entry("running", boot=OLD_BOOT, self_terminating=True),
        [Settlement("c1", "rebooted", OLD_BOOT)],
        id="self-term-earlier-boot",
    ),
    pytest.param(
        entry("running", boot=OLD_BOOT, self_terminating=True, retry_safe=True),
        [Settlement("c1", "rebooted", OLD_BOOT)],
        id="self-term-earlier-boot-retry-safe",
    ),
    pytest.param(
        entry("accepted", boot=OLD_BOOT), [Settlement("c1", "interrupted", OLD_BOOT)], id="earlier-boot-accepted"
    ),
    pytest.param(entry("accepted", inc=INC), [], id="this-process-accepted-untouched"),
    pytest.param(entry("running", inc=INC), [], id="this-process-running-untouched"),
]


@pytest.mark.parametrize(("left", "expected"), RECOVER_ROWS)
def test_recover_settles_what_needs_no_server_input(left: CommandEntry, expected: list[Settlement]) -> None:
    assert recover([left], INC, BOOT) == expected


def test_recover_settles_oldest_first() -> None:
    left = [
        entry("running", cid="late", at=30.0),
        entry("accepted", cid="early", at=10.0),
        entry("running", cid="reboot", at=20.0, boot=OLD_BOOT, self_terminating=True),
        entry("running", cid="safe", at=5.0, retry_safe=True),
    ]
    assert recover(left, INC, BOOT) == [
        Settlement("early", "interrupted", BOOT),
        Settlement("reboot", "rebooted", OLD_BOOT),
        Settlement("late", "interrupted", BOOT),
    ]


@given(st.lists(entries))
def test_recover_settles_exactly_the_rebooted_and_interrupted(left: list[CommandEntry]) -> None:
    settled = {s.command_id: s.outcome for s in recover(left, INC, BOOT)}
    for e in left:
        r = resolve(e, INC, BOOT)
        if r in (Resolution.REBOOTED, Resolution.INTERRUPTED):
            assert e.command_id in settled
    for cid in settled:
        assert any(
            resolve(e, INC, BOOT) in (Resolution.REBOOTED, Resolution.INTERRUPTED) for e in left if e.command_id == cid
        )


# -- sweep --------------------------------------------------------------------

NOW = 100 * DAY

SWEEP_ROWS = [
    pytest.param(entry("done", at=NOW - 8 * DAY), True, id="done-older-than-7-days"),
    pytest.param(entry("done", at=NOW - 6 * DAY), False, id="done-younger"),
    pytest.param(entry("done", at=NOW - 7 * DAY), False, id="done-exactly-7-days-kept"),
    pytest.param(entry("done", inc=INC, at=NOW - 8 * DAY), True, id="done-of-this-process-by-age"),
    pytest.param(entry("accepted", at=NOW - 8 * DAY), True, id="earlier-process-accepted-old"),
    pytest.param(entry("running", at=NOW - 8 * DAY, retry_safe=True), True, id="earlier-process-running-old"),
    pytest.param(entry("accepted", at=NOW - 6 * DAY), False, id="earlier-process-accepted-young"),
    pytest.param(entry("accepted", inc=INC, at=NOW - 30 * DAY), False, id="this-process-accepted-never"),
    pytest.param(entry("running", inc=INC, at=NOW - 30 * DAY), False, id="this-process-running-never"),
]


@pytest.mark.parametrize(("e", "swept"), SWEEP_ROWS)
def test_sweep_follows_the_reference(e: CommandEntry, swept: bool) -> None:
    assert sweep([e], NOW, INC) == ([e.command_id] if swept else [])


def test_sweep_takes_its_window_as_a_parameter() -> None:
    e = entry("done", at=NOW - 2.0)
    assert sweep([e], NOW, INC, keep_s=1.0) == ["c1"]
    assert sweep([e], NOW, INC, keep_s=2.0) == []
    assert KEEP_S == 7 * DAY


# -- transitions --------------------------------------------------------------


def test_accept_creates_an_accepted_entry_of_this_process() -> None:
    e = accept_entry(None, Acceptance("c1", "gpu.reset", False, False, INC, BOOT, b"", 5.0))
    assert e == CommandEntry("c1", "gpu.reset", "accepted", INC, BOOT, False, False, 5.0, None, False)


def test_accept_takes_over_an_earlier_process_entry_for_a_reexecution() -> None:
    old = entry("running", retry_safe=True, boot=OLD_BOOT)
    e = accept_entry(old, Acceptance("c1", "k", True, False, INC, BOOT, b"", 9.0))
    assert (e.state, e.incarnation_id, e.boot_id, e.updated_at) == ("accepted", INC, BOOT, 9.0)


@pytest.mark.parametrize(
    "existing", [entry("done"), entry("done", inc=INC), entry("accepted", inc=INC), entry("running", inc=INC)]
)
def test_accept_refuses_a_done_entry_and_a_duplicate_in_flight(existing: CommandEntry) -> None:
    with pytest.raises(CommandConflict):
        accept_entry(existing, Acceptance("c1", "k", True, False, INC, BOOT, b"", 9.0))


def test_running_records_the_boot_of_the_accepting_process() -> None:
    e = running_entry(entry("accepted", inc=INC, boot=BOOT), INC, BOOT, 7.0)
    assert (e.state, e.boot_id, e.updated_at) == ("running", BOOT, 7.0)


def test_running_needs_an_entry_of_this_process_that_is_not_done() -> None:
    with pytest.raises(UnknownCommand):
        running_entry(None, INC, BOOT, 1.0)
    with pytest.raises(CommandConflict):
        running_entry(entry("accepted"), INC, BOOT, 1.0)
    with pytest.raises(CommandConflict):
        running_entry(entry("done", inc=INC), INC, BOOT, 1.0)


def test_the_first_terminal_result_stands() -> None:
    e = done_entry(entry("running", inc=INC), b"first", 3.0)
    assert e is not None
    assert (e.state, e.result, e.acked, e.updated_at) == ("done", b"first", False, 3.0)
    assert done_entry(e, b"second", 4.0) is None


def test_a_rejection_is_a_done_entry() -> None:
    e = rejected_entry("c9", "gpu.reset", b"rejected", INC, BOOT, 2.0)
    assert (e.state, e.result, e.acked, e.incarnation_id) == ("done", b"rejected", False, INC)
    assert resolve(e, INC, BOOT) is Resolution.RESEND


def test_unacked_lists_done_unacked_results_oldest_first() -> None:
    rows = [
        entry("done", cid="b", at=2.0, result=b"B"),
        entry("done", cid="a", at=1.0, result=b"A"),
        entry("done", cid="acked", at=0.5, acked=True),
        entry("running", cid="r", at=0.1),
        entry("done", cid="empty", at=3.0, result=b""),
    ]
    assert unacked(rows) == [("a", b"A"), ("b", b"B"), ("empty", b"")]


# -- event bounds -------------------------------------------------------------


def ev(seq: int, cls: int, size: int = 10) -> EventRow:
    return EventRow(seq, cls, size)


BOUNDS_ROWS = [
    pytest.param([], [ev(0, RESULT)], 3, 100, BoundsPlan([], True), id="empty-journal-admits"),
    pytest.param(
        [ev(1, METRIC), ev(2, RESULT)], [ev(0, METRIC)], 3, 100, BoundsPlan([], True), id="room-left-drops-nothing"
    ),
    pytest.param(
        [ev(1, METRIC), ev(2, RESULT), ev(3, METRIC)],
        [ev(0, RESULT)],
        3,
        1000,
        BoundsPlan([1], True),
        id="count-full-drops-oldest-metric",
    ),
    pytest.param(
        [ev(1, TRANSITION), ev(2, METRIC), ev(3, METRIC), ev(4, METRIC)],
        [ev(0, RESULT), ev(0, RESULT)],
        4,
        1000,
        BoundsPlan([2, 3], True),
        id="count-full-drops-as-many-as-needed-oldest-first",
    ),
    pytest.param(
        [ev(1, METRIC, 40), ev(2, METRIC, 40), ev(3, RESULT, 10)],
        [ev(0, TRANSITION, 45)],
        100,
        100,
        BoundsPlan([1], True),
        id="bytes-full-drops-oldest-metric",
    ),
    pytest.param(
        [ev(1, METRIC, 10), ev(2, METRIC, 10), ev(3, RESULT, 60)],
        [ev(0, RESULT, 35)],
        100,
        100,
        BoundsPlan([1, 2], True),
        id="bytes-full-drops-until-it-fits",
    ),
    pytest.param(
        [ev(1, METRIC), ev(2, METRIC)], [ev(0, METRIC), ev(0, METRIC)], 2, 1000, BoundsPlan([1, 2], True), id="metric"
    ),
    pytest.param(
        [ev(1, RESULT), ev(2, TRANSITION)],
        [ev(0, RESULT)],
        2,
        1000,
        BoundsPlan([], False),
        id="results-and-transitions-never-dropped",
    ),
    pytest.param(
        [ev(1, METRIC), ev(2, RESULT), ev(3, TRANSITION)],
        [ev(0, RESULT), ev(0, RESULT)],
        3,
        1000,
        BoundsPlan([], False),
        id="not-enough-metrics-drops-nothing",
    ),
    pytest.param(
        [ev(1, METRIC, 10), ev(2, RESULT, 90)],
        [ev(0, METRIC, 20)],
        100,
        100,
        BoundsPlan([], False),
        id="bytes-not-enough-drops-nothing",
    ),
    pytest.param([], [ev(0, RESULT, 101)], 100, 100, BoundsPlan([], False), id="an-event-larger-than-the-bound"),
    pytest.param([], [ev(0, METRIC)] * 3, 2, 1000, BoundsPlan([], False), id="a-batch-larger-than-the-bound"),
    pytest.param(
        [ev(5, METRIC), ev(2, METRIC), ev(9, RESULT)],
        [ev(0, RESULT)],
        3,
        1000,
        BoundsPlan([2], True),
        id="oldest-by-seq-not-by-position",
    ),
    pytest.param(
        [ev(1, 0), ev(2, METRIC)], [ev(0, RESULT)], 2, 1000, BoundsPlan([2], True), id="unclassified-is-never-dropped"
    ),
]


@pytest.mark.parametrize(("events", "incoming", "max_events", "max_bytes", "plan"), BOUNDS_ROWS)
def test_plan_bounds(
    events: list[EventRow], incoming: list[EventRow], max_events: int, max_bytes: int, plan: BoundsPlan
) -> None:
    assert plan_bounds(events, incoming, max_events, max_bytes) == plan


classes = st.sampled_from([METRIC, TRANSITION, RESULT])
journaled = st.lists(
    st.builds(EventRow, st.integers(1, 10**6), classes, st.integers(0, 50)), unique_by=lambda e: e.seq, max_size=30
)
arriving = st.lists(st.builds(EventRow, st.just(0), classes, st.integers(0, 50)), max_size=5)


@given(journaled, arriving, st.integers(1, 30), st.integers(1, 800))
def test_plan_bounds_drops_only_old_metrics_and_always_lands_within_bounds(
    events: list[EventRow], incoming: list[EventRow], max_events: int, max_bytes: int
) -> None:
    plan = plan_bounds(events, incoming, max_events, max_bytes)
    by_seq = {e.seq: e for e in events}
    assert all(by_seq[s].event_class == METRIC for s in plan.drop)
    if not plan.admit:
        assert plan.drop == []
        return
    kept = [e for e in events if e.seq not in set(plan.drop)] + incoming
    assert len(kept) <= max_events
    assert sum(e.size for e in kept) <= max_bytes
    # oldest first: every kept metric is newer than every dropped one
    if plan.drop:
        assert all(e.seq > max(plan.drop) for e in events if e.event_class == METRIC and e.seq not in plan.drop)
        # and minimal: without the newest dropped metric it would not fit
        last = by_seq[plan.drop[-1]]
        assert len(kept) + 1 > max_events or sum(e.size for e in kept) + last.size > max_bytes


def test_is_full_counts_only_what_cannot_be_dropped() -> None:
    assert not is_full([ev(1, METRIC), ev(2, METRIC)], 2, 1000)
    assert not is_full([ev(1, METRIC), ev(2, RESULT)], 2, 1000)
    assert is_full([ev(1, TRANSITION), ev(2, RESULT)], 2, 1000)
    assert is_full([ev(1, RESULT, 100)], 10, 100)
    assert not is_full([ev(1, RESULT, 99), ev(2, METRIC, 500)], 10, 100)
    assert not is_full([], 1, 1)


def test_the_bounds_may_be_lowered_never_raised() -> None:
    assert (MAX_EVENTS, MAX_BYTES) == (10_000, 64 * 1024 * 1024)
    assert clamp_bounds(None, None) == (MAX_EVENTS, MAX_BYTES)
    assert clamp_bounds(500, 1024) == (500, 1024)
    assert clamp_bounds(MAX_EVENTS + 1, MAX_BYTES * 2) == (MAX_EVENTS, MAX_BYTES)
    assert clamp_bounds(None, 4096) == (MAX_EVENTS, 4096)
    with pytest.raises(ValueError, match="events"):
        clamp_bounds(0, None)
    with pytest.raises(ValueError, match="bytes"):
        clamp_bounds(None, -1)


@given(journaled, st.integers(1, 30), st.integers(1, 800))
def test_full_means_even_a_one_byte_result_would_be_refused(
    events: list[EventRow], max_events: int, max_bytes: int
) -> None:
    one = [EventRow(0, RESULT, 1)]
    assert is_full(events, max_events, max_bytes) == (not plan_bounds(events, one, max_events, max_bytes).admit)
