"""A gateway's reconnect-storm limits (bc.gateway.admission): the handshake bucket, the Hello cap and its
queue, and the retry-after a refused stream is told."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bc.errors import Overloaded
from bc.gateway.admission import (
    HANDSHAKES_PER_S,
    HELLO_RATE_PRIOR,
    MAX_HELLO_WAIT_S,
    MAX_PENDING_HELLOS,
    RETRY_AFTER_MAX_S,
    Admission,
    StatusBudget,
    Turn,
)
from bc.wire.status import error_to_status


def test_a_storm_gets_the_burst_then_the_rate() -> None:
    a = Admission(refilled_at=0.0)
    admitted = sum(a.handshake(0.0) for _ in range(1000))
    assert admitted == int(HANDSHAKES_PER_S) and a.refused == 1000 - admitted
    assert sum(a.handshake(0.5) for _ in range(1000)) == int(HANDSHAKES_PER_S / 2)  # half a second's tokens


def test_at_most_64_hellos_at_once_then_a_queue_then_refusals() -> None:
    a = Admission(refilled_at=0.0)
    assert all(a.hello(0.0) is Turn.RUN for _ in range(MAX_PENDING_HELLOS))
    # What is done within the wait bound at the assumed rate, the running Hellos included.
    queued = int(MAX_HELLO_WAIT_S * HELLO_RATE_PRIOR) - MAX_PENDING_HELLOS
    assert all(a.hello(0.0) is Turn.WAIT for _ in range(queued))
    assert a.hello(0.0) is Turn.REFUSE
    assert (a.pending, a.waiting, a.refused) == (MAX_PENDING_HELLOS, queued, 1)
    a.hello_done(0.01)
    assert a.take_waiting() and not a.take_waiting()  # the first waiting Hello takes the one free slot
    assert (a.pending, a.waiting) == (MAX_PENDING_HELLOS, queued - 1)


def test_a_newcomer_never_jumps_the_queue() -> None:
    a = Admission(refilled_at=0.0, max_pending=1)
    assert a.hello(0.0) is Turn.RUN and a.hello(0.0) is Turn.WAIT
    a.hello_done(0.1)  # a slot is free, but someone waits for it
    assert a.hello(0.1) is Turn.WAIT
    assert a.take_waiting() and a.pending == 1 and a.waiting == 1


def test_a_hello_that_gives_up_leaves_the_queue() -> None:
    a = Admission(refilled_at=0.0, max_pending=1)
    assert [a.hello(0.0) for _ in range(3)] == [Turn.RUN, Turn.WAIT, Turn.WAIT]
    a.hello_gave_up()
    a.hello_done(1.0)
    assert a.take_waiting() and not a.take_waiting()
    a.hello_done(2.0)
    assert not a.take_waiting() and (a.pending, a.waiting) == (0, 0)
    assert a.hello(2.0) is Turn.RUN


def test_the_rate_is_measured_only_while_saturated() -> None:
    a = Admission(refilled_at=0.0, max_pending=2)
    for t in (0.0, 10.0, 20.0):  # one Hello at a time, 10 s apart: the gaps are the arrivals
        assert a.hello(t) is Turn.RUN
        a.hello_done(t + 0.001)
    assert a.hello_rate == HELLO_RATE_PRIOR
    for _ in range(4):
        a.hello(30.0)
    t = 30.0
    for _ in range(200):  # saturated: a Hello finishes every 50 ms, and one more arrives
        t += 0.05
        a.hello_done(t)
        a.take_waiting()
        a.hello(t)
    assert abs(a.hello_rate - 20.0) < 0.5
    while a.pending:  # the storm ends
        t += 0.05
        a.hello_done(t)
        a.take_waiting()
    assert a.hello_rate == HELLO_RATE_PRIOR  # the next one starts from the prior, not from this one's measure


def test_refused_streams_get_consecutive_slots_after_the_queue_drains() -> None:
    a = Admission(refilled_at=0.0, max_pending=4, max_wait_s=0.0)  # no queue: beyond 4, refused
    rng = random.Random(1)
    for _ in range(4):
        assert a.hello(0.0) is Turn.RUN
    gap = 1.0 / HELLO_RATE_PRIOR
    afters = [a.retry_after(0.0, rng) for _ in range(100) if a.hello(0.0) is Turn.REFUSE]
    assert len(afters) == 100
    for i, d in enumerate(afters):  # slot i starts once the 4 running Hellos are done, one slot per Hello
        assert (4 + i) * gap <= d <= (5 + i) * gap + 1e-9
    assert a.refused == 100


def test_a_handshake_refusal_waits_for_the_bucket() -> None:
    a = Admission(refilled_at=0.0, rate=10.0, burst=10.0, tokens=10.0)
    rng = random.Random(2)
    assert sum(a.handshake(0.0) for _ in range(10)) == 10 and not a.handshake(0.0)
    d = a.retry_after(0.0, rng)
    assert 0.1 <= d <= 0.2  # the bucket's next token, within the slot of the slower of the two rates
    assert 0.2 <= a.retry_after(0.0, rng) <= 0.3


def test_a_retry_after_is_capped_and_spread_below_the_cap() -> None:
    a = Admission(refilled_at=0.0, hello_gap_s=1.0, max_wait_s=0.0, max_pending=1000, max_run_s=1e9)
    rng = random.Random(3)
    for _ in range(1000):
        a.hello(0.0)
    afters = [a.retry_after(0.0, rng) for _ in range(200)]
    assert all(RETRY_AFTER_MAX_S / 2 <= d <= RETRY_AFTER_MAX_S for d in afters)
    assert max(afters) - min(afters) > RETRY_AFTER_MAX_S / 4


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.sampled_from(["hello", "done", "give-up", "retry"]), st.floats(0, 0.2)), max_size=300),
    st.integers(1, 8),
)
def test_the_bounds_hold_and_refusals_come_back_in_order(ops: list[tuple[str, float]], max_pending: int) -> None:
    """Whatever the order of arrivals, ends and give-ups: never more than max_pending run, the queue stays
    within its bounds, a slot is never left free while someone waits, and every retry-after lies in
    [0, cap], each refusal's slot after the one before."""
    a = Admission(refilled_at=0.0, max_pending=max_pending, max_waiting=20)
    rng = random.Random(0)
    now, horizon = 0.0, 0.0
    for op, dt in ops:
        now += dt
        if op == "hello":
            turn = a.hello(now)
            if turn is Turn.REFUSE:
                assert a.waiting == a.max_waiting or (a.pending + a.waiting + 1) * a.hello_gap_s > a.max_wait_s
        elif op == "done" and a.pending:
            a.hello_done(now)
            a.take_waiting()
        elif op == "give-up" and a.waiting:
            a.hello_gave_up()
        elif op == "retry":
            d = a.retry_after(now, rng)
            assert 0.0 <= d <= RETRY_AFTER_MAX_S
            if d < RETRY_AFTER_MAX_S / 2:
                assert now + d >= horizon - 1e-9  # never before the slot of the refusal before it ended
            horizon = a.retry_horizon  # the end of this refusal's slot: where the next one's starts
        assert 0 <= a.pending <= max_pending and 0 <= a.waiting <= a.max_waiting
        assert not (a.waiting and a.pending < max_pending)  # a free slot is handed on at once


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


def test_a_slow_gateway_runs_no_more_hellos_than_it_finishes_within_the_wait_bound() -> None:
    """The running Hellos wait on the store's write lock: at 5 a second, 64 of them would keep the last one
    13 s from its transaction, past the node's wait for its Welcome (it redials, and the commit is wasted)."""
    a = Admission(refilled_at=0.0, hello_gap_s=0.2)  # measured: 5 Hellos a second
    assert a.run_limit == int(MAX_HELLO_WAIT_S / 0.2) < MAX_PENDING_HELLOS
    turns = [a.hello(0.0) for _ in range(a.run_limit)]
    assert turns == [Turn.RUN] * a.run_limit
    assert a.hello(0.0) is Turn.REFUSE  # nothing ahead of it would be done in time: told when to come back
    assert Admission(refilled_at=0.0).run_limit == MAX_PENDING_HELLOS  # at the optimistic prior: the count bounds
