"""Fuzzing the agent's session core with any frames a gateway could send.

Whatever the frames (well-formed or hostile, in any order, Welcome or not
first), the core only ever raises `ProtocolError` (the adapter closes the
session on it), answers with effects of its own types, never sends a frame
over `max_frame_bytes`, never lowers its applied generation or its server
time mark, never accepts a spec for another node or one that is not newer,
and a session that has gone quiet is always closed by `tick`.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent.session_core import (
    MISSED_HEARTBEATS,
    WELCOME_TIMEOUT_S,
    AcceptSpec,
    AgentSessionCore,
    Close,
    Effect,
    Send,
    State,
)
from bc.errors import ProtocolError
from bc.protocol.limits import LIMITS
from bc.protocol.pb import session_pb2
from tests.strategies import messages

NODE = "n1"

gateway_frames = messages(session_pb2.GatewayMessage.DESCRIPTOR, depth=4, hostile=False)


@st.composite
def desired_states(draw: st.DrawFn) -> session_pb2.GatewayMessage:
    """A DesiredState whose envelope body decodes: the frames that reach the spec rules."""
    body = draw(messages(session_pb2.DesiredStateBody.DESCRIPTOR, depth=4, hostile=False))
    if draw(st.booleans()):
        body.node_id = NODE
    msg = session_pb2.GatewayMessage()
    msg.desired_state.envelope.body = body.SerializeToString()
    return msg


@st.composite
def welcomes(draw: st.DrawFn) -> session_pb2.GatewayMessage:
    msg = session_pb2.GatewayMessage()
    msg.welcome.CopyFrom(draw(messages(session_pb2.Welcome.DESCRIPTOR, depth=3, hostile=False)))
    return msg


frames = st.one_of(gateway_frames, desired_states(), welcomes())


def new_core(applied: int, mark: int) -> AgentSessionCore:
    return AgentSessionCore(
        node_id=NODE,
        role="node",
        boot_id="b1",
        journal_id="j1",
        incarnation_id="i1",
        applied_generation=applied,
        applied_spec_hash="",
        time_mark_ms=mark,
    )


def check_effects(effects: list[Effect]) -> None:
    for e in effects:
        assert isinstance(e, Effect.__args__)  # type: ignore[attr-defined]
        if isinstance(e, Send):
            assert e.msg.ByteSize() <= LIMITS.max_frame_bytes
        if isinstance(e, AcceptSpec):
            assert e.spec is not None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    applied=st.integers(0, 2**40),
    mark=st.integers(0, 2**45),
    first_welcome=st.booleans(),
    opening=welcomes(),
    script=st.lists(st.tuples(frames, st.floats(0, 100), st.integers(-(2**45), 2**45)), max_size=12),
)
def test_any_frames_leave_the_core_consistent(
    applied: int,
    mark: int,
    first_welcome: bool,
    opening: session_pb2.GatewayMessage,
    script: list[tuple[session_pb2.GatewayMessage, float, int]],
) -> None:
    core = new_core(applied, mark)
    assert core.hello(0.0).ByteSize() <= LIMITS.max_frame_bytes
    now = 0.0
    steps = [(opening, 0.0, 2**41)] if first_welcome else []
    for msg, dt, wall in steps + script:
        now += dt
        before_gen, before_mark = core.applied_generation, core.time_mark_ms
        try:
            effects = core.on_message(msg, now, wall)
        except ProtocolError as e:
            assert e.message and "\n" not in e.message
            event("ProtocolError")
            continue
        check_effects(effects)
        for e in effects:
            event(type(e).__name__)
        check_effects(core.tick(now))
        assert core.applied_generation >= before_gen
        assert core.time_mark_ms >= before_mark
        for e in effects:
            if isinstance(e, AcceptSpec):
                assert e.generation > before_gen
                body = session_pb2.DesiredStateBody.FromString(msg.desired_state.envelope.body)
                assert body.node_id == NODE
    # Whatever a gateway sent, an honest one is welcome afterwards: nothing can wedge the node.
    honest_wall = max([w for _, _, w in steps + script] + [mark]) + 1
    again = new_core(core.applied_generation, core.time_mark_ms)
    again.hello(now)
    honest = session_pb2.GatewayMessage(welcome=session_pb2.Welcome(server_time_ms=honest_wall, session_epoch=2))
    assert not any(isinstance(e, Close) for e in again.on_message(honest, now, honest_wall))
    assert again.state is State.OPEN
    # However the session went, silence ends it.
    later = now + WELCOME_TIMEOUT_S + MISSED_HEARTBEATS * max(core.heartbeat_interval_s, 1.0) + 1
    effects = core.tick(later) if core.state is not State.CLOSED else []
    if core.state is not State.CLOSED:
        effects += core.tick(later + 1)
    assert core.state is State.CLOSED or any(isinstance(e, Close) for e in effects)
