"""The session core's signing hooks: spec_check on specs it would apply, need_spec after Welcome, the rewind limit."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from cryptography.hazmat.primitives import serialization

from agent.session_core import (
    REWIND_LIMIT_MS,
    AcceptSpec,
    AdvanceTimeMark,
    AgentSessionCore,
    Close,
    Effect,
    IgnoredSpec,
    RejectedSpec,
    Send,
    State,
    Welcomed,
)
from agent.trust import AgentTrust
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import PURPOSE_COMMAND, PURPOSE_DESIRED_STATE, WorkerSigner, create_root, issue_worker
from bc.protocol.pb import common_pb2, session_pb2, spec_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage
from bc.testing import virtual_clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

NODE = "n1"
MONO0 = 500.0
WALL0 = 1_800_000_000_000
CLOCK = virtual_clock(WALL0 / 1000)
ROOT_KEY_A, ROOT_A = create_root(CLOCK, RNG, SECRETS)
ROOT_KEY_B, ROOT_B = create_root(CLOCK, RNG, SECRETS)
WORKER_A = WorkerSigner(*issue_worker(ROOT_KEY_A, ROOT_A, CLOCK, RNG, SECRETS))
WORKER_B = WorkerSigner(*issue_worker(ROOT_KEY_B, ROOT_B, CLOCK, RNG, SECRETS))


def trust_a() -> AgentTrust:
    root = ROOT_A.public_bytes(serialization.Encoding.PEM)
    return AgentTrust(common_pb2.TrustBundle(command_signing_roots=[root]))


class Recorder:
    """A spec_check that records what it was asked and answers as told."""

    def __init__(self, answer: str | None = None) -> None:
        self.answer = answer
        self.calls: list[tuple[common_pb2.Envelope, float]] = []

    def __call__(self, env: common_pb2.Envelope, at: float) -> str | None:
        self.calls.append((env, at))
        return self.answer


def agent(applied: int = 0, time_mark_ms: int = 0, need_spec: bool = False) -> AgentSessionCore:
    return AgentSessionCore(
        node_id=NODE,
        role="node",
        boot_id="boot-1",
        journal_id="j-1",
        incarnation_id="inc-1",
        applied_generation=applied,
        applied_spec_hash=f"sha256:g{applied}" if applied else "",
        time_mark_ms=time_mark_ms,
        need_spec=need_spec,
    )


def welcome(server_time_ms: int = WALL0, epoch: int = 3) -> GatewayMessage:
    return GatewayMessage(
        welcome=session_pb2.Welcome(server_time_ms=server_time_ms, session_epoch=epoch, heartbeat_interval_ms=10_000)
    )


def opened(applied: int = 0, spec_check: Recorder | AgentTrust | None = None) -> AgentSessionCore:
    a = agent(applied)
    if isinstance(spec_check, AgentTrust):
        a.spec_check = spec_check.check_spec
    else:
        a.spec_check = spec_check
    a.hello(MONO0)
    a.on_message(welcome(), MONO0, WALL0)
    assert a.state is State.OPEN
    return a


def full_body(generation: int, node_id: str = NODE, endpoint: str = "") -> session_pb2.DesiredStateBody:
    body = session_pb2.DesiredStateBody(node_id=node_id, generation=generation, spec_hash=f"sha256:g{generation}")
    spec = spec_pb2.NodeSpec()
    if endpoint:
        spec.telemetry.otlp_endpoint = endpoint
    body.full.CopyFrom(spec)
    return body


def desired(body: bytes | session_pb2.DesiredStateBody, signer: WorkerSigner | None = None) -> GatewayMessage:
    raw = body if isinstance(body, bytes) else body.SerializeToString(deterministic=True)
    env = (
        signer.envelope(PURPOSE_DESIRED_STATE, raw)
        if signer
        else common_pb2.Envelope(purpose=PURPOSE_DESIRED_STATE, body=raw)
    )
    return GatewayMessage(desired_state=session_pb2.DesiredState(envelope=env))


def spec_requests(effects: Sequence[Effect]) -> list[session_pb2.SpecRequest]:
    return [e.msg.spec_request for e in effects if isinstance(e, Send) and e.msg.HasField("spec_request")]


# -- spec_check ----------------------------------------------------------------------------------


def test_a_spec_signed_by_a_held_root_is_applied() -> None:
    a = opened(spec_check=trust_a())
    msg = desired(full_body(1, endpoint="http://otel:4317"), WORKER_A)
    [eff] = a.on_message(msg, MONO0 + 1, WALL0 + 1000)
    assert isinstance(eff, AcceptSpec)
    assert (eff.generation, eff.spec_hash) == (1, "sha256:g1")
    assert eff.spec.telemetry.otlp_endpoint == "http://otel:4317"
    env = msg.desired_state.envelope
    assert (eff.body, eff.signature, eff.key_id) == (env.body, env.signature, WORKER_A.key_id)
    assert (a.applied_generation, a.applied_spec_hash) == (1, "sha256:g1")


@pytest.mark.parametrize(
    ("signer", "why"),
    [(None, "unsigned"), (WORKER_B, "does not chain")],
    ids=["unsigned", "another-root"],
)
def test_a_refused_spec_is_rejected_and_not_applied(signer: WorkerSigner | None, why: str) -> None:
    spec = spec_pb2.NodeSpec()
    spec.telemetry.otlp_endpoint = "http://held:4317"
    a = opened(applied=4, spec_check=trust_a())
    a.applied_spec = spec
    msg = desired(full_body(5, endpoint="http://evil:4317"), signer)
    [eff] = a.on_message(msg, MONO0 + 1, WALL0 + 1000)
    assert isinstance(eff, RejectedSpec)
    assert eff.generation == 5 and why in eff.reason and eff.body == msg.desired_state.envelope.body
    assert (a.applied_generation, a.applied_spec_hash) == (4, "sha256:g4")
    assert a.applied_spec is spec and a.applied_spec.telemetry.otlp_endpoint == "http://held:4317"
    # The heartbeat still reports the generation held.
    [hb] = a.tick(MONO0 + 20)
    assert isinstance(hb, Send) and hb.msg.heartbeat.applied_generation == 4


def test_a_rejection_does_not_use_up_the_generation() -> None:
    a = opened(spec_check=trust_a())
    body = full_body(1)
    [rejected] = a.on_message(desired(body), MONO0 + 1, WALL0)
    assert isinstance(rejected, RejectedSpec)
    [accepted] = a.on_message(desired(body, WORKER_A), MONO0 + 2, WALL0)
    assert isinstance(accepted, AcceptSpec) and a.applied_generation == 1


def test_a_tampered_spec_is_rejected() -> None:
    a = opened(spec_check=trust_a())
    msg = desired(full_body(1), WORKER_A)
    msg.desired_state.envelope.body = full_body(1, endpoint="http://evil:4317").SerializeToString()
    [eff] = a.on_message(msg, MONO0 + 1, WALL0)
    assert isinstance(eff, RejectedSpec) and "does not match the body" in eff.reason
    assert a.applied_generation == 0


def test_a_spec_signed_as_a_command_is_rejected() -> None:
    a = opened(spec_check=trust_a())
    raw = full_body(1).SerializeToString()
    msg = GatewayMessage(desired_state=session_pb2.DesiredState(envelope=WORKER_A.envelope(PURPOSE_COMMAND, raw)))
    [eff] = a.on_message(msg, MONO0 + 1, WALL0)
    assert isinstance(eff, RejectedSpec) and "purpose" in eff.reason


def test_spec_check_gets_the_envelope_and_server_time_in_seconds() -> None:
    rec = Recorder()
    a = agent()
    a.spec_check = rec
    a.hello(MONO0)
    a.on_message(welcome(server_time_ms=WALL0 + 3_600_000), MONO0, WALL0)  # the server is an hour ahead
    msg = desired(full_body(1), WORKER_A)
    a.on_message(msg, MONO0 + 5, WALL0 + 5_000)
    [(env, at)] = rec.calls
    assert env == msg.desired_state.envelope
    assert at == (WALL0 + 3_600_000 + 5_000) / 1000


def test_the_signers_window_is_judged_by_server_time_not_the_local_clock() -> None:
    """The local clock says the worker is valid; the server's time (from Welcome) says it has expired."""
    a = agent()
    a.spec_check = trust_a().check_spec
    a.hello(MONO0)
    far = int(WORKER_A.not_after * 1000) + 86_400_000
    a.on_message(welcome(server_time_ms=far), MONO0, WALL0)
    [eff] = a.on_message(desired(full_body(1), WORKER_A), MONO0 + 1, WALL0 + 1000)
    assert isinstance(eff, RejectedSpec) and "not valid at this time" in eff.reason


def test_whatever_spec_check_answers_is_the_rejection_reason() -> None:
    a = opened(spec_check=Recorder("no thanks"))
    [eff] = a.on_message(desired(full_body(1), WORKER_A), MONO0 + 1, WALL0)
    assert eff == RejectedSpec(1, "no thanks", full_body(1).SerializeToString(deterministic=True))


def test_without_roots_or_without_a_check_an_unsigned_spec_is_applied() -> None:
    for check in (None, AgentTrust(common_pb2.TrustBundle())):
        a = opened(spec_check=check)
        [eff] = a.on_message(desired(full_body(1)), MONO0 + 1, WALL0)
        assert isinstance(eff, AcceptSpec) and eff.signature == b"" and a.applied_generation == 1


def _patch(generation: int, base: int) -> session_pb2.DesiredStateBody:
    body = session_pb2.DesiredStateBody(node_id=NODE, generation=generation, spec_hash="p", base_generation=base)
    body.patch.cleared.append("telemetry")
    return body


@pytest.mark.parametrize(
    "raw",
    [
        full_body(3, node_id="n2").SerializeToString(),  # another node's
        full_body(2).SerializeToString(),  # not above the applied generation
        full_body(1).SerializeToString(),
        b"\xff\xff\xff",  # does not decode
        _patch(3, base=1).SerializeToString(),  # patch on another base
        session_pb2.DesiredStateBody(node_id=NODE, generation=3).SerializeToString(),  # no spec in it
    ],
    ids=["other-node", "same-generation", "older-generation", "undecodable", "patch-base-mismatch", "empty"],
)
def test_spec_check_is_not_called_for_bodies_that_are_ignored_anyway(raw: bytes) -> None:
    rec = Recorder("must not be asked")
    a = opened(applied=2, spec_check=rec)
    a.applied_spec = spec_pb2.NodeSpec()
    effects = a.on_message(desired(raw), MONO0 + 1, WALL0)
    assert rec.calls == []
    assert isinstance(effects[0], IgnoredSpec)
    assert not any(isinstance(e, (AcceptSpec, RejectedSpec)) for e in effects)
    assert a.applied_generation == 2


def test_a_patch_on_the_applied_base_is_checked_too() -> None:
    rec = Recorder("unsigned")
    a = opened(applied=2, spec_check=rec)
    a.applied_spec = spec_pb2.NodeSpec()
    [eff] = a.on_message(desired(_patch(3, base=2)), MONO0 + 1, WALL0)
    assert isinstance(eff, RejectedSpec) and len(rec.calls) == 1 and a.applied_generation == 2


# -- need_spec -----------------------------------------------------------------------------------


def test_a_node_needing_a_spec_asks_for_a_full_one_right_after_welcome() -> None:
    a = agent(applied=7, need_spec=True)
    a.hello(MONO0)
    effects = a.on_message(welcome(), MONO0, WALL0)
    assert [type(e) for e in effects] == [Welcomed, AdvanceTimeMark, Send]
    [req] = spec_requests(effects)
    assert req == session_pb2.SpecRequest(have_generation=0, reason=session_pb2.SpecRequest.NO_SPEC)


def test_a_node_holding_a_usable_spec_asks_for_nothing() -> None:
    a = agent(applied=7)
    a.hello(MONO0)
    assert spec_requests(a.on_message(welcome(), MONO0, WALL0)) == []


def test_need_spec_is_cleared_only_by_an_applied_spec() -> None:
    a = agent(need_spec=True)
    a.spec_check = trust_a().check_spec
    a.hello(MONO0)
    a.on_message(welcome(), MONO0, WALL0)
    [rejected] = a.on_message(desired(full_body(1)), MONO0 + 1, WALL0)
    assert isinstance(rejected, RejectedSpec) and a.need_spec
    [accepted] = a.on_message(desired(full_body(1), WORKER_A), MONO0 + 2, WALL0)
    assert isinstance(accepted, AcceptSpec) and not a.need_spec


def test_a_spec_request_is_sent_once_per_welcome_not_with_every_frame() -> None:
    a = agent(need_spec=True)
    a.hello(MONO0)
    assert len(spec_requests(a.on_message(welcome(), MONO0, WALL0))) == 1
    hb = GatewayMessage(heartbeat=session_pb2.Heartbeat(server_time_ms=WALL0 + 10_000))
    assert spec_requests(a.on_message(hb, MONO0 + 10, WALL0 + 10_000)) == []


# -- the rewind limit ----------------------------------------------------------------------------


@pytest.mark.parametrize("need_spec", [False, True])
def test_a_welcome_six_minutes_before_the_time_mark_is_refused(need_spec: bool) -> None:
    mark = WALL0 + 3_600_000
    a = agent(time_mark_ms=mark, need_spec=need_spec)
    a.hello(MONO0)
    effects = a.on_message(welcome(server_time_ms=mark - 6 * 60 * 1000), MONO0, WALL0)
    [eff] = effects
    assert isinstance(eff, Close) and eff.redial
    assert "more than 5 minutes before the time mark" in eff.reason
    assert a.state is State.CLOSED and a.time_mark_ms == mark
    # Nothing is accepted from that gateway afterwards.
    assert a.on_message(desired(full_body(1), WORKER_A), MONO0 + 1, WALL0) == []
    assert a.applied_generation == 0


@pytest.mark.parametrize("behind_ms", [0, 60_000, REWIND_LIMIT_MS])
def test_a_welcome_up_to_five_minutes_before_the_mark_is_taken(behind_ms: int) -> None:
    mark = WALL0 + 3_600_000
    a = agent(time_mark_ms=mark)
    a.hello(MONO0)
    effects = a.on_message(welcome(server_time_ms=mark - behind_ms), MONO0, WALL0)
    assert isinstance(effects[0], Welcomed) and a.state is State.OPEN
    assert a.time_mark_ms == mark  # the mark never moves back
    assert not any(isinstance(e, AdvanceTimeMark) for e in effects)


def test_a_welcome_a_millisecond_past_the_limit_is_refused() -> None:
    mark = WALL0
    a = agent(time_mark_ms=mark)
    a.hello(MONO0)
    [eff] = a.on_message(welcome(server_time_ms=mark - REWIND_LIMIT_MS - 1), MONO0, WALL0)
    assert isinstance(eff, Close) and a.state is State.CLOSED


def test_a_welcome_past_the_mark_advances_it() -> None:
    a = agent(time_mark_ms=WALL0)
    a.hello(MONO0)
    effects = a.on_message(welcome(server_time_ms=WALL0 + 1), MONO0, WALL0)
    assert AdvanceTimeMark(WALL0 + 1) in effects and a.time_mark_ms == WALL0 + 1
