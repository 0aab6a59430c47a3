"""A gateway's reconnect-storm limits (bc.gateway.admission): the handshake bucket and the Hello cap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bc.errors import Overloaded
from bc.gateway.admission import HANDSHAKES_PER_S, MAX_PENDING_HELLOS, Admission, StatusBudget
from bc.wire.status import error_to_status


def test_a_storm_gets_the_burst_then_the_rate() -> None:
    a = Admission(refilled_at=0.0)
    admitted = sum(a.handshake(0.0) for _ in range(1000))
    assert admitted == int(HANDSHAKES_PER_S) and a.refused == 1000 - admitted
    assert sum(a.handshake(0.5) for _ in range(1000)) == int(HANDSHAKES_PER_S / 2)  # half a second's tokens


def test_at_most_64_hellos_at_once() -> None:
    a = Admission(refilled_at=0.0)
    assert all(a.hello_started() for _ in range(MAX_PENDING_HELLOS))
    assert not a.hello_started()
    a.hello_done()
    assert a.hello_started()


def test_a_refusal_is_resource_exhausted_on_the_wire() -> None:
    code, _ = error_to_status(Overloaded("busy"))
    assert code.name == "RESOURCE_EXHAUSTED"


@given(st.lists(st.floats(0, 2), max_size=200))
def test_never_more_than_the_burst_plus_the_rate_over_any_run(gaps: list[float]) -> None:
    a = Admission(refilled_at=0.0)
    now, admitted = 0.0, 0
    for g in gaps:
        now += g
        admitted += a.handshake(now)
    assert admitted <= HANDSHAKES_PER_S + now * HANDSHAKES_PER_S + 1e-6


def test_status_writes_beyond_the_budget_wait_their_turn_in_order() -> None:
    b = StatusBudget(refilled_at=0.0, rate=10.0, burst=10.0, tokens=10.0)
    waits = [b.turn(0.0) for _ in range(15)]
    assert waits[:10] == [0.0] * 10
    assert all(abs(w - 0.1 * (i + 1)) < 1e-9 for i, w in enumerate(waits[10:]))
    assert b.turn(2.0) == 0.0  # the budget refilled meanwhile


@given(st.lists(st.floats(0, 0.5), max_size=100))
def test_no_more_writes_start_than_the_budget_allows(gaps: list[float]) -> None:
    b = StatusBudget(refilled_at=0.0, rate=10.0, burst=10.0, tokens=10.0)
    now, starts = 0.0, []
    for g in gaps:
        now += g
        starts.append(now + b.turn(now))
    for t in starts:  # in any window of one second, at most burst + rate writes start
        assert sum(1 for u in starts if t <= u < t + 1.0) <= 20
