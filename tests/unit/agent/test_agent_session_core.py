"""The agent's I/O-free session core: which specs it takes, the server time mark, heartbeats."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.session_core import (
    REWIND_LIMIT_MS,
    AcceptSpec,
    AckEvents,
    AdvanceTimeMark,
    AgentSessionCore,
    Close,
    IgnoredSpec,
    Send,
    State,
    TunnelOffered,
    Welcomed,
    decide_spec,
)
from bc.errors import ProtocolError
from bc.protocol.capabilities import TUNNEL_OFFERS
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2, tunnel_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage

NODE = "n1"
JOURNAL = "j-00112233"
MONO0 = 500.0
WALL0 = 1_800_000_000_000


def agent(
    applied: int = 0,
    time_mark_ms: int = 0,
    inventory_hash: str = "",
    inventory: common_pb2.Inventory | None = None,
    server_inventory_hash: str = "",
) -> AgentSessionCore:
    return AgentSessionCore(
        node_id=NODE,
        role="node",
        boot_id="boot-1",
        journal_id=JOURNAL,
        incarnation_id="inc-1",
        applied_generation=applied,
        applied_spec_hash="",
        time_mark_ms=time_mark_ms,
        inventory_hash=inventory_hash,
        inventory=inventory,
        server_inventory_hash=server_inventory_hash,
    )


def welcome(server_time_ms: int = WALL0, epoch: int = 3, hb_ms: int = 10_000, inv_hash: str = "") -> GatewayMessage:
    return GatewayMessage(
        welcome=session_pb2.Welcome(
            server_time_ms=server_time_ms, session_epoch=epoch, heartbeat_interval_ms=hb_ms, inventory_hash=inv_hash
        )
    )


def opened(applied: int = 0, applied_spec: spec_pb2.NodeSpec | None = None) -> AgentSessionCore:
    a = agent(applied=applied)
    a.applied_spec = applied_spec
    a.hello(MONO0)
    a.on_message(welcome(), MONO0, WALL0)
    assert a.state is State.OPEN
    return a


def full_body(
    generation: int, spec: spec_pb2.NodeSpec | None = None, node_id: str = NODE
) -> session_pb2.DesiredStateBody:
    body = session_pb2.DesiredStateBody(node_id=node_id, generation=generation, spec_hash=f"sha256:g{generation}")
    body.full.CopyFrom(spec or spec_pb2.NodeSpec())
    return body


def patch_body(
    generation: int, base: int, sections: spec_pb2.NodeSpec | None = None, cleared: list[str] | None = None
) -> session_pb2.DesiredStateBody:
    body = session_pb2.DesiredStateBody(
        node_id=NODE, generation=generation, spec_hash=f"sha256:p{generation}", base_generation=base
    )
    body.patch.sections.CopyFrom(sections or spec_pb2.NodeSpec())
    body.patch.cleared.extend(cleared or [])
    return body


def desired(body: session_pb2.DesiredStateBody, signature: bytes = b"sig") -> GatewayMessage:
    return GatewayMessage(
        desired_state=session_pb2.DesiredState(
            envelope=common_pb2.Envelope(
                purpose="desired-state", body=body.SerializeToString(), signature=signature, key_id="k1"
            )
        )
    )


def base_spec() -> spec_pb2.NodeSpec:
    spec = spec_pb2.NodeSpec()
    spec.telemetry.otlp_endpoint = "https://otel.example:4317"
    spec.telemetry.export_interval_s = 30
    spec.access.principals.extend(["ops", "oncall"])
    spec.host.units.add(name="sysctl", settings_json='{"vm.swappiness":1}')
    return spec


# -- decide_spec ---------------------------------------------------------------


def test_a_body_for_another_node_is_ignored() -> None:
    out = decide_spec(full_body(5, node_id="n2"), NODE, 1, None)
    assert isinstance(out, str)
    assert "n2" in out


@pytest.mark.parametrize("generation", [0, 3, 4])
def test_a_generation_not_above_the_applied_one_is_ignored(generation: int) -> None:
    assert isinstance(decide_spec(full_body(generation), NODE, 4, base_spec()), str)


def test_a_full_body_is_accepted_as_is() -> None:
    spec = base_spec()
    out = decide_spec(full_body(2, spec), NODE, 1, None)
    assert isinstance(out, spec_pb2.NodeSpec)
    assert out == spec


def test_a_body_without_a_spec_is_ignored() -> None:
    body = session_pb2.DesiredStateBody(node_id=NODE, generation=9)
    assert isinstance(decide_spec(body, NODE, 1, base_spec()), str)


@pytest.mark.parametrize("base", [0, 2, 4])
def test_a_patch_against_another_base_is_a_mismatch(base: int) -> None:
    assert decide_spec(patch_body(5, base), NODE, 3, base_spec()) == "patch-base-mismatch"


def test_a_patch_without_an_applied_spec_is_a_mismatch() -> None:
    assert decide_spec(patch_body(5, 3), NODE, 3, None) == "patch-base-mismatch"


def test_a_patch_replaces_the_sections_it_sets_wholesale_and_keeps_the_rest() -> None:
    applied = base_spec()
    sections = spec_pb2.NodeSpec()
    sections.telemetry.otlp_endpoint = "https://new.example:4317"  # export_interval_s not set: replaced, not merged
    out = decide_spec(patch_body(4, 3, sections), NODE, 3, applied)
    assert isinstance(out, spec_pb2.NodeSpec)
    assert out.telemetry.otlp_endpoint == "https://new.example:4317"
    assert out.telemetry.export_interval_s == 0
    assert list(out.access.principals) == ["ops", "oncall"]
    assert out.host == applied.host
    assert applied == base_spec(), "the applied spec is not changed in place"


def test_a_patch_replaces_repeated_fields_rather_than_appending() -> None:
    sections = spec_pb2.NodeSpec()
    sections.access.principals.append("only")
    out = decide_spec(patch_body(4, 3, sections), NODE, 3, base_spec())
    assert isinstance(out, spec_pb2.NodeSpec)
    assert list(out.access.principals) == ["only"]


def test_a_patch_clears_the_sections_it_names() -> None:
    out = decide_spec(patch_body(4, 3, cleared=["access", "host"]), NODE, 3, base_spec())
    assert isinstance(out, spec_pb2.NodeSpec)
    assert not out.HasField("access")
    assert not out.HasField("host")
    assert out.telemetry == base_spec().telemetry


@given(a=st.integers(min_value=0, max_value=2**40), g=st.integers(min_value=0, max_value=2**40))
def test_a_full_body_is_accepted_iff_its_generation_is_above_the_applied_one(a: int, g: int) -> None:
    out = decide_spec(full_body(g), NODE, a, base_spec())
    assert isinstance(out, spec_pb2.NodeSpec) is (g > a)


# -- DesiredState through the core -----------------------------------------------


def test_an_accepted_spec_moves_the_applied_generation_and_echoes_the_hash() -> None:
    a = opened(applied=1, applied_spec=base_spec())
    body = full_body(2, base_spec())
    effects = a.on_message(desired(body), MONO0 + 1, WALL0 + 1000)
    accepted = [e for e in effects if isinstance(e, AcceptSpec)]
    assert len(accepted) == 1
    assert accepted[0].generation == 2
    assert accepted[0].spec_hash == "sha256:g2"
    assert accepted[0].body == body.SerializeToString()
    assert accepted[0].signature == b"sig"
    assert a.applied_generation == 2
    assert a.applied_spec_hash == "sha256:g2"
    # the same generation again is ignored
    again = a.on_message(desired(body), MONO0 + 2, WALL0 + 2000)
    assert not any(isinstance(e, AcceptSpec) for e in again)
    assert any(isinstance(e, IgnoredSpec) for e in again)


def test_a_patch_base_mismatch_asks_for_the_full_spec() -> None:
    a = opened(applied=3, applied_spec=base_spec())
    effects = a.on_message(desired(patch_body(5, 4)), MONO0 + 1, WALL0)
    assert any(isinstance(e, IgnoredSpec) for e in effects)
    reqs = [e.msg.spec_request for e in effects if isinstance(e, Send) and e.msg.WhichOneof("msg") == "spec_request"]
    assert len(reqs) == 1
    assert reqs[0].reason == session_pb2.SpecRequest.PATCH_BASE_MISMATCH
    assert reqs[0].have_generation == 3
    assert a.applied_generation == 3


def test_an_undecodable_body_is_ignored() -> None:
    a = opened(applied=1)
    msg = GatewayMessage(desired_state=session_pb2.DesiredState(envelope=common_pb2.Envelope(body=b"\xff\xff\xff")))
    effects = a.on_message(msg, MONO0 + 1, WALL0)
    assert effects and all(isinstance(e, IgnoredSpec) for e in effects)
    assert a.applied_generation == 1


# -- Welcome and the server time mark ---------------------------------------------


def test_welcome_gives_the_epoch_offset_and_interval() -> None:
    a = agent(time_mark_ms=0)
    a.hello(MONO0)
    effects = a.on_message(welcome(server_time_ms=WALL0 + 2_500, epoch=9, hb_ms=4_000), MONO0, WALL0)
    w = [e for e in effects if isinstance(e, Welcomed)]
    assert len(w) == 1
    assert w[0].epoch == 9
    assert w[0].offset_ms == 2_500
    assert w[0].heartbeat_interval_s == 4.0
    assert a.offset_ms == 2_500
    assert a.server_now_ms(WALL0 + 10) == WALL0 + 2_510
    assert AdvanceTimeMark(WALL0 + 2_500) in effects


def test_a_welcome_behind_the_clock_gives_a_negative_offset() -> None:
    a = agent()
    a.hello(MONO0)
    effects = a.on_message(welcome(server_time_ms=WALL0 - 60_000), MONO0, WALL0)
    assert [e.offset_ms for e in effects if isinstance(e, Welcomed)] == [-60_000]


def test_a_welcome_more_than_five_minutes_before_the_mark_is_refused() -> None:
    mark = WALL0
    a = agent(time_mark_ms=mark)
    a.hello(MONO0)
    effects = a.on_message(welcome(server_time_ms=mark - REWIND_LIMIT_MS - 1), MONO0, WALL0)
    assert any(isinstance(e, Close) for e in effects)
    assert not any(isinstance(e, Welcomed) for e in effects)
    assert not any(isinstance(e, AdvanceTimeMark) for e in effects)
    assert a.state is State.CLOSED
    assert a.time_mark_ms == mark


def test_a_welcome_slightly_behind_the_mark_is_accepted_without_moving_the_mark() -> None:
    mark = WALL0
    a = agent(time_mark_ms=mark)
    a.hello(MONO0)
    effects = a.on_message(welcome(server_time_ms=mark - 60_000), MONO0, WALL0)
    assert any(isinstance(e, Welcomed) for e in effects)
    assert not any(isinstance(e, AdvanceTimeMark) for e in effects)
    assert a.time_mark_ms == mark


def test_heartbeats_advance_the_mark_only_forward() -> None:
    a = opened()
    start = a.time_mark_ms
    assert a.on_message(
        GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=start + 5)), MONO0 + 1, WALL0
    ) == [AdvanceTimeMark(start + 5)]
    assert (
        a.on_message(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=start + 1)), MONO0 + 2, WALL0) == []
    )
    assert (
        a.on_message(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=start + 5)), MONO0 + 3, WALL0) == []
    )
    assert a.time_mark_ms == start + 5


def test_a_frame_before_welcome_is_a_protocol_error() -> None:
    a = agent()
    a.hello(MONO0)
    with pytest.raises(ProtocolError, match="can't handle heartbeat in state hello-sent"):
        a.on_message(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=1)), MONO0, WALL0)


# -- acks and revocation --------------------------------------------------------------


def test_an_ack_for_this_journal_drops_events() -> None:
    a = opened()
    effects = a.on_message(GatewayMessage(ack=session_pb2.Ack(journal_id=JOURNAL, event_seq=12)), MONO0 + 1, WALL0)
    assert effects == [AckEvents(12)]


def test_an_ack_for_another_journal_is_ignored() -> None:
    a = opened()
    assert a.on_message(GatewayMessage(ack=session_pb2.Ack(journal_id="j-other", event_seq=12)), MONO0 + 1, WALL0) == []


@pytest.mark.parametrize("welcomed", [False, True])
def test_a_revocation_closes_without_redial(welcomed: bool) -> None:
    a = opened() if welcomed else agent()
    effects = a.on_message(
        GatewayMessage(revocation=session_pb2.RevocationNotice(reason="duplicate-identity", serials=["01"])),
        MONO0 + 1,
        WALL0,
    )
    closes = [e for e in effects if isinstance(e, Close)]
    assert len(closes) == 1
    assert closes[0].redial is False
    assert a.state is State.CLOSED


# -- heartbeats and silence -----------------------------------------------------------


def test_tick_sends_a_heartbeat_with_the_applied_generation_every_interval() -> None:
    a = opened(applied=4)  # the Welcome set a 10 s interval
    step = 0.5
    sent_at: list[float] = []
    for n in range(1, 121):  # 60 s of ticks, the gateway talking every 5 s
        t = MONO0 + n * step
        if n % 10 == 0:
            a.on_message(GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=WALL0 + n)), t, WALL0)
        for e in a.tick(t):
            assert isinstance(e, Send), e
            assert e.msg.heartbeat.applied_generation == 4
            sent_at.append(t)
    assert 6 <= len(sent_at) <= 7
    assert sent_at[0] - MONO0 <= 10.0 + step
    assert all(10.0 <= y - x <= 10.0 + step for x, y in pairwise(sent_at))
    assert a.state is State.OPEN


def test_three_silent_intervals_close_the_session_and_redial() -> None:
    a = opened()
    assert not any(isinstance(e, Close) for e in a.tick(MONO0 + 29))
    closes = [e for e in a.tick(MONO0 + 31) if isinstance(e, Close)]
    assert len(closes) == 1
    assert closes[0].redial is True
    assert a.state is State.CLOSED


# -- Hello -----------------------------------------------------------------------------


def inventory() -> common_pb2.Inventory:
    return common_pb2.Inventory(hostname="n1", gpus=[common_pb2.Gpu(index=0, uuid="GPU-a", healthy=True)])


def test_hello_carries_the_inventory_when_the_server_does_not_know_its_hash() -> None:
    a = agent(applied=2, inventory_hash="sha256:new", inventory=inventory(), server_inventory_hash="sha256:old")
    h = a.hello(MONO0).hello
    assert h.HasField("inventory")
    assert h.inventory == inventory()
    assert h.inventory_hash == "sha256:new"
    assert h.applied_generation == 2
    assert h.node_id == NODE
    assert h.journal_id == JOURNAL


def test_hello_carries_only_the_hash_when_the_server_knows_it() -> None:
    a = agent(inventory_hash="sha256:same", inventory=inventory(), server_inventory_hash="sha256:same")
    h = a.hello(MONO0).hello
    assert not h.HasField("inventory")
    assert h.inventory_hash == "sha256:same"


def test_the_server_hash_from_welcome_decides_the_next_hello() -> None:
    a = agent(inventory_hash="sha256:x", inventory=inventory())
    assert a.hello(MONO0).hello.HasField("inventory")
    a.on_message(welcome(inv_hash="sha256:x"), MONO0, WALL0)
    assert not a.hello(MONO0 + 1).hello.HasField("inventory")


# -- tunnel offers on the session (bc.protocol.capabilities.TUNNEL_OFFERS) --------------------------------


def test_welcome_says_which_capabilities_the_gateway_answered() -> None:
    a = agent()
    a.capabilities = ["devices.cdi", TUNNEL_OFFERS]
    assert TUNNEL_OFFERS in a.hello(MONO0).hello.capabilities
    msg = welcome()
    msg.welcome.capabilities.append(TUNNEL_OFFERS)
    (w,) = [e for e in a.on_message(msg, MONO0, WALL0) if isinstance(e, Welcomed)]
    assert w.capabilities == (TUNNEL_OFFERS,)
    # An older gateway answers nothing: the node's tunnels then take their offers on Listen.
    b = agent()
    b.hello(MONO0)
    (w,) = [e for e in b.on_message(welcome(), MONO0, WALL0) if isinstance(e, Welcomed)]
    assert w.capabilities == ()


def test_a_tunnel_offer_on_the_session_goes_to_the_tunnels() -> None:
    a = opened()
    offer = tunnel_pb2.TunnelOffer(sid="t-1", token="tok")
    assert a.on_message(GatewayMessage(tunnel_offer=offer), MONO0 + 1, WALL0 + 1) == [TunnelOffered(offer)]
