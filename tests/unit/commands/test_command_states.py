"""The command state table: forward only, steps may be skipped, terminal states never move."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.control.commands import states as cs
from bc.protocol.pb import session_pb2 as pb

ALL_UPDATES = [
    pb.COMMAND_STATE_UNSPECIFIED,
    pb.COMMAND_ACKED,
    pb.COMMAND_RUNNING,
    pb.COMMAND_SUCCEEDED,
    pb.COMMAND_FAILED,
    pb.COMMAND_REJECTED,
    pb.COMMAND_CANCELLED,
]


def test_every_reported_state_has_a_name() -> None:
    assert {cs.state_name(u) for u in ALL_UPDATES} == {
        None,
        "acked",
        "running",
        "succeeded",
        "failed",
        "rejected",
        "cancelled",
    }
    assert {"succeeded", "failed", "rejected", "cancelled", "expired"} == cs.TERMINAL
    assert {"dispatched", "acked", "running"} == cs.IN_FLIGHT


@pytest.mark.parametrize(
    ("current", "update", "expected"),
    [
        ("pending", pb.COMMAND_ACKED, "acked"),
        ("pending", pb.COMMAND_SUCCEEDED, "succeeded"),  # a lost dispatch mark does not stop a result
        ("dispatched", pb.COMMAND_ACKED, "acked"),
        ("dispatched", pb.COMMAND_RUNNING, "running"),  # a lost ACKED is skipped
        ("dispatched", pb.COMMAND_REJECTED, "rejected"),
        ("acked", pb.COMMAND_RUNNING, "running"),
        ("acked", pb.COMMAND_FAILED, "failed"),
        ("running", pb.COMMAND_SUCCEEDED, "succeeded"),
        ("running", pb.COMMAND_CANCELLED, "cancelled"),
        ("running", pb.COMMAND_ACKED, None),  # ACKED after RUNNING is stale
        ("running", pb.COMMAND_RUNNING, None),  # a repeat
        ("acked", pb.COMMAND_ACKED, None),
        ("succeeded", pb.COMMAND_FAILED, None),
        ("failed", pb.COMMAND_SUCCEEDED, None),  # the first outcome stands
        ("expired", pb.COMMAND_RUNNING, None),
        ("cancelled", pb.COMMAND_SUCCEEDED, None),
        ("dispatched", pb.COMMAND_STATE_UNSPECIFIED, None),
    ],
)
def test_table(current: str, update: int, expected: str | None) -> None:
    assert cs.next_state(current, update) == expected


def test_an_unknown_current_state_is_a_bug_not_a_silent_no() -> None:
    with pytest.raises(ValueError, match="unknown command state"):
        cs.next_state("paused", pb.COMMAND_RUNNING)


@given(
    start=st.sampled_from(cs.STATES),
    updates=st.lists(st.sampled_from(ALL_UPDATES), max_size=20),
)
def test_no_sequence_of_updates_moves_backwards_or_out_of_a_terminal_state(start: str, updates: list[int]) -> None:
    state = start
    for u in updates:
        before = state
        nxt = cs.next_state(state, u)
        if nxt is None:
            continue
        assert before not in cs.TERMINAL, f"{before} moved to {nxt}"
        assert cs.rank(nxt) > cs.rank(before), f"{before} -> {nxt} is not forward"
        assert nxt == cs.state_name(u)
        state = nxt
    if start in cs.TERMINAL:
        assert state == start


@given(updates=st.lists(st.sampled_from(ALL_UPDATES), max_size=20))
def test_the_first_terminal_report_is_the_outcome(updates: list[int]) -> None:
    state = "dispatched"
    for u in updates:
        state = cs.next_state(state, u) or state
    terminal_reports = [cs.state_name(u) for u in updates if cs.state_name(u) in cs.TERMINAL]
    if terminal_reports:
        assert state == terminal_reports[0]
    else:
        assert state in cs.IN_FLIGHT
