"""The connectivity state table: every state reachable, every transition's effect, and random event sequences
that keep a node on one gateway at a time with a `since` that moves only with its state."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.protocol import connectivity as cx

GATEWAYS = ("gw-a", "gw-b", "gw-c")
NOW = 5_000


def test_every_state_is_reachable_from_a_new_node_and_every_transition_fires_from_one() -> None:
    reached, frontier = {cx.INITIAL}, [cx.INITIAL]
    fired: set[str] = set()
    while frontier:
        state = frontier.pop()
        for event in cx.EVENTS:
            nxt = cx.next_state(state, event)
            if nxt is None:
                continue
            fired.add(event)
            if nxt not in reached:
                reached.add(nxt)
                frontier.append(nxt)
    assert reached == set(cx.STATES)
    assert fired == set(cx.EVENTS) == set(cx.TABLE)


@pytest.mark.parametrize(
    ("event", "moves", "target", "route"),
    [
        (cx.HELLO, {"new", "disconnected", "unreachable"}, "connected", cx.Route.OPEN),
        (cx.CLOSE, {"connected"}, "disconnected", cx.Route.CLOSE),
        (cx.GIVE_UP, {"disconnected"}, "unreachable", cx.Route.KEEP),
        (cx.DELETE, {"new", "connected", "disconnected", "unreachable"}, "deleted", cx.Route.DROP),
        (cx.REVIVE, {"deleted"}, "new", cx.Route.KEEP),
    ],
)
def test_the_table(event: str, moves: set[str], target: str, route: cx.Route) -> None:
    t = cx.transition(event)
    assert (cx.moves_from(event), t.target, t.route) == (moves, target, route)
    for state in cx.STATES:
        assert cx.next_state(state, event) == (target if state in moves else None), state


def routed(state: str) -> cx.Connectivity:
    """A node in `state` as the store would hold it: an open session on gw-a exactly while connected."""
    since = None if state == cx.INITIAL else 1_000
    reason = {cx.DISCONNECTED: cx.GATEWAY_LOST, cx.DELETED: "deleted"}.get(state, "")
    if state == cx.DELETED:
        return cx.Connectivity(state, since, reason)
    return cx.Connectivity(state, since, reason, "gw-a", 3, session_open=state == cx.CONNECTED)


@pytest.mark.parametrize("event", cx.EVENTS)
@pytest.mark.parametrize("state", cx.STATES)
def test_what_each_transition_records(state: str, event: str) -> None:
    before = routed(state)
    after = cx.apply(before, event, NOW, gateway_id="gw-b", epoch=3, reason=cx.SILENT)
    t = cx.transition(event)
    if state not in t.sources:
        assert after == before  # not a source: nothing at all changes
        return
    if state == t.target:  # already there: the state, since and reason stay; only the routing moves
        assert (after.state, after.since_ms, after.reason) == (before.state, before.since_ms, before.reason)
    else:
        expected_reason = {cx.CLOSE: cx.SILENT, cx.DELETE: "deleted"}.get(event, "")
        assert (after.state, after.since_ms, after.reason) == (t.target, NOW, expected_reason)
    route = (after.gateway_id, after.epoch, after.session_open)
    assert (
        route
        == {
            cx.Route.OPEN: ("gw-b", before.epoch + 1, True),
            cx.Route.CLOSE: (before.gateway_id, before.epoch, False),
            cx.Route.DROP: ("", 0, False),
            cx.Route.KEEP: (before.gateway_id, before.epoch, before.session_open),
        }[t.route]
    )


def test_a_close_of_a_superseded_or_closed_session_changes_nothing() -> None:
    node = cx.apply(cx.Connectivity(), cx.HELLO, 1, gateway_id="gw-a")
    newer = cx.apply(node, cx.HELLO, 2, gateway_id="gw-b")
    assert cx.apply(newer, cx.CLOSE, 3, epoch=node.epoch, reason=cx.SESSION_CLOSED) == newer
    closed = cx.apply(newer, cx.CLOSE, 4, epoch=newer.epoch, reason=cx.SESSION_CLOSED)
    assert (closed.state, closed.since_ms, closed.session_open) == (cx.DISCONNECTED, 4, False)
    assert cx.apply(closed, cx.CLOSE, 5, epoch=newer.epoch, reason=cx.SILENT) == closed


def test_a_gateway_loss_gets_the_longer_grace_before_liveness_gives_up() -> None:
    assert cx.gives_up_at(1_000, cx.SESSION_CLOSED, 40_000, 120_000) == 41_000
    assert cx.gives_up_at(1_000, cx.SILENT, 40_000, 120_000) == 41_000
    assert cx.gives_up_at(1_000, cx.GATEWAY_LOST, 40_000, 120_000) == 161_000


def test_an_unknown_event_or_state_is_a_bug_not_a_silent_no() -> None:
    with pytest.raises(ValueError, match="unknown connectivity event"):
        cx.next_state(cx.NEW, "reboot")
    with pytest.raises(ValueError, match="unknown connectivity state"):
        cx.next_state("lost", cx.HELLO)


@dataclass(frozen=True)
class Step:
    event: str
    gateway_id: str = ""
    stale: int = 0  # a close of the session this many Hellos older than the current one (0: the current)
    reason: str = ""
    after_ms: int = 0


AFTER = st.integers(0, 50_000)
STEPS = st.one_of(
    st.builds(Step, st.just(cx.HELLO), gateway_id=st.sampled_from(GATEWAYS), after_ms=AFTER),
    st.builds(
        Step, st.just(cx.CLOSE), stale=st.integers(0, 2), reason=st.sampled_from(cx.CLOSE_REASONS), after_ms=AFTER
    ),
    st.builds(Step, st.sampled_from((cx.GIVE_UP, cx.DELETE, cx.REVIVE)), after_ms=AFTER),
)


@given(st.lists(STEPS, max_size=40))
def test_random_event_sequences_keep_the_invariants(steps: list[Step]) -> None:
    node, now_ms, last_hello = cx.Connectivity(), 0, ""
    for step in steps:
        now_ms += step.after_ms
        before = node
        node = cx.apply(
            node, step.event, now_ms, gateway_id=step.gateway_id, epoch=node.epoch - step.stale, reason=step.reason
        )
        if step.event == cx.HELLO and before.state != cx.DELETED:
            last_hello = step.gateway_id
        if step.event == cx.DELETE and before.state != cx.DELETED:
            last_hello = ""
        assert node.state in cx.STATES
        # One gateway at a time: the node is connected exactly while its one session is open, on the gateway of
        # the last Hello; a superseded session's close changes nothing.
        assert (node.state == cx.CONNECTED) == node.session_open
        if node.session_open:
            assert node.gateway_id == last_hello
        if step.event == cx.CLOSE and step.stale:
            assert node == before
        # `since` moves exactly when the state does, and then to now.
        if node.state == before.state:
            assert (node.since_ms, node.reason) == (before.since_ms, before.reason)
        else:
            assert node.since_ms == now_ms
            assert cx.next_state(before.state, step.event) == node.state
        # What the reason says fits the state.
        if node.state == cx.DISCONNECTED:
            assert node.reason in cx.CLOSE_REASONS
        else:
            assert node.reason == ("deleted" if node.state == cx.DELETED else "")
        assert node.epoch >= (before.epoch if step.event != cx.DELETE else 0)
