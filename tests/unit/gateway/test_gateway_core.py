"""The gateway's I/O-free session core: messages in, messages and store work out."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import pytest

from bc.errors import ProtocolError
from bc.gateway.core import (
    Action,
    ApplyCommandUpdate,
    Close,
    GatewaySessionCore,
    IngestEvents,
    LoadSpec,
    OpenSession,
    Send,
    State,
)
from bc.protocol.capabilities import TUNNEL_OFFERS
from bc.protocol.pb import common_pb2, session_pb2, tunnel_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.protocol.status import status_key

NODE = "n1"
HB = 10.0
T0 = 1000.0


def core() -> GatewaySessionCore:
    return GatewaySessionCore(node_id=NODE, heartbeat_interval_s=HB, now=T0)


def hello(node_id: str = NODE, applied: int = 0) -> NodeMessage:
    return NodeMessage(hello=session_pb2.Hello(node_id=node_id, journal_id="j-1", applied_generation=applied))


def heartbeat(applied: int = 0) -> NodeMessage:
    return NodeMessage(heartbeat=session_pb2.Heartbeat(applied_generation=applied))


def status(applied: int = 0, observed: int = 0, conditions: list[common_pb2.Condition] | None = None) -> NodeMessage:
    return NodeMessage(
        status=session_pb2.StatusReport(
            applied_generation=applied, observed_generation=observed, conditions=conditions or []
        )
    )


def opened(c: GatewaySessionCore, generation: int = 0, epoch: int = 7, server_time_ms: int = 5_000) -> list[Action]:
    return c.opened(epoch, generation, server_time_ms, common_pb2.TrustBundle(), "gw-1")


def open_core(applied: int = 0, generation: int = 0) -> GatewaySessionCore:
    c = core()
    c.on_message(hello(applied=applied), T0)
    opened(c, generation=generation)
    return c


def sends(actions: Sequence[object]) -> list[GatewayMessage]:
    return [a.msg for a in actions if isinstance(a, Send)]


def load_specs(actions: Sequence[object]) -> list[LoadSpec]:
    return [a for a in actions if isinstance(a, LoadSpec)]


# -- the first frame ------------------------------------------------------


@pytest.mark.parametrize(
    "msg",
    [
        heartbeat(),
        status(),
        NodeMessage(spec_request=session_pb2.SpecRequest()),
        NodeMessage(event_batch=session_pb2.EventBatch(journal_id="j-1")),
        NodeMessage(command_update=session_pb2.CommandUpdate(command_id="c1")),
    ],
)
def test_the_first_frame_must_be_hello(msg: NodeMessage) -> None:
    c = core()
    kind = msg.WhichOneof("msg")
    with pytest.raises(ProtocolError, match=rf"can't handle {kind} in state {State.AWAIT_HELLO.value}"):
        c.on_message(msg, T0)


def test_hello_opens_the_session() -> None:
    c = core()
    actions = c.on_message(hello(applied=3), T0)
    assert len(actions) == 1
    assert isinstance(actions[0], OpenSession)
    assert actions[0].hello.node_id == NODE
    assert actions[0].hello.applied_generation == 3
    assert c.state is State.OPENING


def test_a_hello_naming_another_node_is_closed_unauthenticated() -> None:
    c = core()
    actions = c.on_message(hello(node_id="n2"), T0)
    assert len(actions) == 1
    assert isinstance(actions[0], Close)
    assert actions[0].code == "UNAUTHENTICATED"
    assert not any(isinstance(a, OpenSession) for a in actions)


def test_a_hello_without_a_node_id_takes_the_certificate_identity() -> None:
    c = core()
    actions = c.on_message(hello(node_id=""), T0)
    assert [type(a) for a in actions] == [OpenSession]


def test_a_second_hello_in_open_is_a_protocol_error() -> None:
    c = open_core()
    with pytest.raises(ProtocolError, match=r"can't handle hello in state open"):
        c.on_message(hello(), T0 + 1)


# -- OPENING: frames wait for the Hello transaction -----------------------


def test_frames_during_opening_are_queued_and_replayed_in_order_after_opened() -> None:
    c = core()
    c.on_message(hello(), T0)
    batch = NodeMessage(event_batch=session_pb2.EventBatch(journal_id="j-1"))
    update = NodeMessage(command_update=session_pb2.CommandUpdate(command_id="c1"))
    request = NodeMessage(spec_request=session_pb2.SpecRequest(have_generation=0))
    for m in (batch, update, request):
        assert c.on_message(m, T0 + 0.1) == []
    actions = opened(c, generation=0)
    assert isinstance(actions[0], Send)
    assert actions[0].msg.WhichOneof("msg") == "welcome"
    rest = actions[1:]
    assert len(rest) == 3
    assert isinstance(rest[0], IngestEvents)
    assert rest[0].batch.journal_id == "j-1"
    assert isinstance(rest[1], ApplyCommandUpdate)
    assert rest[1].update.command_id == "c1"
    assert isinstance(rest[2], LoadSpec)
    assert c.state is State.OPEN


def test_nothing_is_replayed_twice() -> None:
    c = core()
    c.on_message(hello(), T0)
    c.on_message(NodeMessage(event_batch=session_pb2.EventBatch(journal_id="j-1")), T0)
    opened(c)
    assert c.on_message(heartbeat(), T0 + 1) == []
    assert not any(isinstance(a, IngestEvents) for a in c.tick(T0 + 2, 6_000))


# -- Welcome and the spec at Hello ----------------------------------------


def test_opened_sends_welcome_with_server_time_epoch_and_heartbeat_interval() -> None:
    c = core()
    c.on_message(hello(applied=0), T0)
    actions = opened(c, generation=0, epoch=42, server_time_ms=1_234_567)
    welcomes = [m.welcome for m in sends(actions) if m.WhichOneof("msg") == "welcome"]
    assert len(welcomes) == 1
    w = welcomes[0]
    assert w.server_time_ms == 1_234_567
    assert w.session_epoch == 42
    assert w.heartbeat_interval_ms == int(HB * 1000)
    assert w.gateway_id == "gw-1"
    assert c.epoch == 42


@pytest.mark.parametrize(
    ("applied", "generation", "wanted"), [(0, 0, False), (3, 3, False), (5, 3, False), (2, 3, True)]
)
def test_opened_asks_for_the_spec_only_when_the_node_is_behind(applied: int, generation: int, wanted: bool) -> None:
    c = core()
    c.on_message(hello(applied=applied), T0)
    assert bool(load_specs(opened(c, generation=generation))) is wanted


def test_opened_outside_opening_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="can't handle opened in state await-hello"):
        opened(core())


def test_spec_loaded_sends_the_envelope_verbatim() -> None:
    c = open_core(applied=0, generation=1)
    env = common_pb2.Envelope(purpose="desired-state", body=b"\x01\x02body", signature=b"sig", key_id="k1")
    out = sends(c.spec_loaded(1, env))
    assert len(out) == 1
    assert out[0].desired_state.envelope == env


# -- pokes, backstop and SpecRequest ---------------------------------------


def test_generation_is_asks_only_above_applied_and_above_what_was_sent() -> None:
    c = open_core(applied=2, generation=2)
    assert c.generation_is(2, "poke") == []  # not above applied
    assert c.generation_is(1, "poke") == []
    asked = c.generation_is(3, "poke")
    assert asked == [LoadSpec("poke")]
    c.spec_loaded(3, common_pb2.Envelope(body=b"g3"))
    assert c.generation_is(3, "poke") == []  # already sent on this session
    assert c.generation_is(4, "poke") == [LoadSpec("poke")]


def test_the_backstop_resends_while_the_node_still_reports_an_older_generation() -> None:
    c = open_core(applied=2, generation=2)
    c.spec_loaded(3, common_pb2.Envelope(body=b"g3"))
    # The frame was lost, or the node refused what reached it: the backstop sends the stored bytes again.
    assert c.generation_is(3, "backstop") == [LoadSpec("backstop")]
    c.on_message(heartbeat(applied=3), T0 + 1)
    assert c.generation_is(3, "backstop") == []


def test_generation_is_respects_the_applied_generation_reported_later() -> None:
    c = open_core(applied=1, generation=1)
    c.on_message(heartbeat(applied=5), T0 + 1)
    assert c.generation_is(5, "poke") == []
    c.on_message(status(applied=6), T0 + 2)
    assert c.generation_is(6, "poke") == []
    assert c.generation_is(7, "poke") == [LoadSpec("poke")]


def test_generation_is_before_open_asks_nothing() -> None:
    c = core()
    assert c.generation_is(5, "poke") == []
    c.on_message(hello(), T0)
    assert c.generation_is(5, "poke") == []


def test_spec_request_always_asks_for_the_spec() -> None:
    c = open_core(applied=3, generation=3)
    c.spec_loaded(3, common_pb2.Envelope(body=b"g3"))
    req = NodeMessage(spec_request=session_pb2.SpecRequest(have_generation=3))
    assert load_specs(c.on_message(req, T0 + 1))
    assert load_specs(c.on_message(req, T0 + 2))


def test_event_batches_and_command_updates_become_store_work() -> None:
    c = open_core()
    a = c.on_message(NodeMessage(event_batch=session_pb2.EventBatch(journal_id="j-1")), T0 + 1)
    assert len(a) == 1 and isinstance(a[0], IngestEvents)
    b = c.on_message(NodeMessage(command_update=session_pb2.CommandUpdate(command_id="c9")), T0 + 1)
    assert len(b) == 1 and isinstance(b[0], ApplyCommandUpdate) and b[0].update.command_id == "c9"


# -- heartbeats and silence -------------------------------------------------


def test_tick_sends_heartbeats_every_interval_with_server_time() -> None:
    c = open_core()
    step = 0.5
    sent_at: list[float] = []
    server_times: list[int] = []
    for n in range(1, 121):  # 60 s of ticks, the node talking every tick
        t = T0 + n * step
        c.on_message(heartbeat(), t)
        for m in sends(c.tick(t, 5_000 + n)):
            assert m.WhichOneof("msg") == "heartbeat"
            sent_at.append(t)
            server_times.append(m.heartbeat.server_time_ms)
    assert 6 <= len(sent_at) <= 7
    assert sent_at[0] - T0 <= HB + step
    gaps = [b - a for a, b in pairwise(sent_at)]
    assert all(HB <= g <= HB + step for g in gaps)
    assert server_times == sorted(server_times) and server_times[0] > 5_000


def test_three_missed_intervals_close_the_session() -> None:
    c = open_core()
    c.on_message(heartbeat(), T0 + 1)
    assert not any(isinstance(a, Close) for a in c.tick(T0 + 1 + 3 * HB - 0.5, 1))
    closing = [a for a in c.tick(T0 + 1 + 3 * HB + 0.5, 2) if isinstance(a, Close)]
    assert len(closing) == 1
    assert closing[0].code == "UNAVAILABLE"
    assert c.state is State.CLOSED
    assert c.tick(T0 + 100, 3) == []


def test_any_frame_keeps_the_session_alive() -> None:
    c = open_core()
    t = T0
    for _ in range(10):
        t += 2 * HB
        c.on_message(NodeMessage(event_batch=session_pb2.EventBatch(journal_id="j-1")), t)
        assert not any(isinstance(a, Close) for a in c.tick(t + 0.5, 1))
    assert c.state is State.OPEN


def test_a_node_that_never_says_hello_is_closed() -> None:
    c = core()
    assert any(isinstance(a, Close) for a in c.tick(T0 + 3 * HB + 1, 1))


# -- status coalescing ------------------------------------------------------


def cond(type_: str, age_ms: int, status_: str = "True") -> common_pb2.Condition:
    return common_pb2.Condition(type=type_, status=status_, reason="r", message="m", age_ms=age_ms)


def test_status_reports_are_coalesced_latest_wins() -> None:
    c = open_core()
    assert c.take_status() is None
    for observed in (1, 2, 3):
        c.on_message(status(applied=3, observed=observed), T0 + observed)
    taken = c.take_status()
    assert taken is not None
    report, publish = taken
    assert report.observed_generation == 3
    assert publish is True
    assert c.take_status() is None


def test_a_status_is_published_only_when_its_key_changes() -> None:
    c = open_core()
    c.on_message(status(applied=1, observed=1, conditions=[cond("Ready", 10)]), T0 + 1)
    first = c.take_status()
    assert first is not None and first[1] is True
    # only condition ages moved: same key, written but not published
    again = status(applied=1, observed=1, conditions=[cond("Ready", 99_999)])
    assert status_key(again.status) == status_key(first[0])
    c.on_message(again, T0 + 2)
    second = c.take_status()
    assert second is not None
    assert second[0].conditions[0].age_ms == 99_999
    assert second[1] is False
    # something new: published
    c.on_message(status(applied=1, observed=1, conditions=[cond("Ready", 5, "False")]), T0 + 3)
    third = c.take_status()
    assert third is not None and third[1] is True
    # back to a key seen two reports ago: it differs from the last taken, so it is news again
    c.on_message(status(applied=1, observed=1, conditions=[cond("Ready", 7)]), T0 + 4)
    fourth = c.take_status()
    assert fourth is not None and fourth[1] is True


def test_the_newest_report_decides_publish_even_if_an_older_one_was_new() -> None:
    c = open_core()
    c.on_message(status(applied=1, observed=1), T0 + 1)
    assert c.take_status() is not None
    c.on_message(status(applied=2, observed=1), T0 + 2)  # new, but superseded before it was taken
    c.on_message(status(applied=1, observed=1), T0 + 3)  # same key as the last taken
    taken = c.take_status()
    assert taken is not None
    assert taken[0].applied_generation == 1
    assert taken[1] is False


def test_a_new_session_publishes_its_first_report_again() -> None:
    a = open_core()
    a.on_message(status(applied=1, observed=1), T0 + 1)
    assert (a.take_status() or (None, None))[1] is True
    b = open_core()
    b.on_message(status(applied=1, observed=1), T0 + 1)
    assert (b.take_status() or (None, None))[1] is True


# -- tunnel offers on the session (bc.protocol.capabilities.TUNNEL_OFFERS) --------------------------------


def offer(sid: str) -> tunnel_pb2.TunnelOffer:
    return tunnel_pb2.TunnelOffer(sid=sid, token=f"token-{sid}")


def test_a_hello_that_takes_offers_on_the_session_is_welcomed_so_and_sent_them_in_order() -> None:
    c = core()
    msg = hello()
    msg.hello.capabilities.extend(["devices.cdi", TUNNEL_OFFERS])
    c.on_message(msg, T0)
    assert c.offer_tunnel(offer("t-early")) == []  # nothing before the Welcome
    (welcome,) = [m for m in sends(opened(c)) if m.WhichOneof("msg") == "welcome"]
    assert list(welcome.welcome.capabilities) == [TUNNEL_OFFERS]
    out = sends(c.offer_tunnel(offer("t-1")) + c.offer_tunnel(offer("t-2")))
    assert [(m.WhichOneof("msg"), m.tunnel_offer.sid, m.tunnel_offer.token) for m in out] == [
        ("tunnel_offer", "t-1", "token-t-1"),
        ("tunnel_offer", "t-2", "token-t-2"),
    ]
    c.close()
    assert c.offer_tunnel(offer("t-late")) == []  # a closed session sends nothing more


def test_an_older_agents_session_is_welcomed_without_offers_and_never_sent_one() -> None:
    c = core()
    c.on_message(hello(), T0)  # no `tunnel.offers`: its offers go on its Listen stream
    (welcome,) = [m for m in sends(opened(c)) if m.WhichOneof("msg") == "welcome"]
    assert list(welcome.welcome.capabilities) == []
    assert not c.tunnel_offers
    assert c.offer_tunnel(offer("t-1")) == []
