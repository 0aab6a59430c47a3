"""The secret broker end to end (docs/secrets.md): a real `bc serve`, a real agent, a real OTLP receiver.

The gateway is the production gateway with its node links wrapped by the compromised-gateway tamperer
(`tests/integration/test_compromised_gateway.py`): every frame it relays in either direction is kept, so
the tests can say what a gateway sees. On SQLite and PostgreSQL (the `lab` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from agent.join import join_node
from agent.secrets import SecretRefused
from bc.assembly.server import Server
from bc.gateway.secret_feed import NoBroker
from bc.pki import attest, secret_jwe
from bc.protocol.pb import common_pb2, secrets_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.store import catalog
from tests.integration.conftest import InprocLab
from tests.integration.test_compromised_gateway import Tamperer, TamperingLink, compromise
from tests.integration.test_keyless_gateway import keyless_pair
from tests.otlp_receiver import Received, grpc_receiver

NAME = "otlp-auth"


@dataclass
class Wire:
    """Every frame the gateway relayed for the node, serialized, both ways."""

    frames: list[bytes] = field(default_factory=list)

    def tap(self, t: Tamperer) -> None:
        def inbound(msg: NodeMessage) -> NodeMessage:
            self.frames.append(msg.SerializeToString())
            return msg

        def outbound(msg: GatewayMessage) -> GatewayMessage:
            self.frames.append(msg.SerializeToString())
            return msg

        t.inbound, t.outbound = inbound, outbound

    def holds(self, needle: bytes) -> bool:
        return any(needle in f for f in self.frames)

    def kinds(self) -> set[str]:
        out: set[str] = set()
        for f in self.frames:
            for cls in (NodeMessage, GatewayMessage):
                try:
                    kind = cls.FromString(f).WhichOneof("msg")
                except Exception:
                    continue
                if kind and kind.startswith("secret"):
                    out.add(kind)
        return out


def compromise_gateway(server: Server) -> Tamperer:
    """`compromise` for a gateway-only server: its node links wrapped in the tamperer."""
    t = Tamperer()
    gw = server.gateway
    real_serve = gw.serve

    async def serve(link: Any, peer: Any) -> None:
        await real_serve(TamperingLink(link, t), peer)

    gw.serve = serve  # type: ignore[method-assign]
    return t


@pytest.fixture
def receiver() -> Iterator[tuple[int, Received]]:
    with grpc_receiver() as r:
        yield r


def token() -> str:
    return "s3cr3t-" + secrets.token_hex(12)


async def start(lab: InprocLab) -> Wire:
    wire = Wire()
    wire.tap(compromise(lab))
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    return wire


async def telemetry(lab: InprocLab, port: int, ref: str = NAME) -> int:
    doc = {"otlp_endpoint": f"http://127.0.0.1:{port}", "export_interval_s": 1, "headers_secret_ref": ref}
    info = await lab.admin.set_spec_section("n1", "telemetry", json.dumps(doc))
    return int(info.generation)


async def section(lab: InprocLab, state: str, after_seq: int = 0) -> common_pb2.SectionStatus:
    """The telemetry section once a status report says it is in `state` (a node.status event)."""
    await lab.wait_event(
        "node.status",
        lambda ev, d: ev.subject == "n1" and ev.seq > after_seq and d["sections"].get("telemetry") == state,
    )
    node = await lab.admin.get_node("n1")
    return next(s for s in node.sections if s.section == "telemetry")


async def header_seen(received: Received, value: str) -> None:
    await asyncio.to_thread(received.wait, lambda r: value in r.header_values("authorization"), 30.0)


async def store_dump(lab: InprocLab) -> bytes:
    store = lab.server.store
    assert store is not None
    out: list[bytes] = []
    async with store.transaction(write=False) as tx:
        for table in await catalog.tables_in(tx, store.dialect):
            for row in await catalog.rows_of(tx, table):
                for v in row.values():
                    out.append(bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else str(v).encode())
    return b"\n".join(out)


async def refused(lab: InprocLab, reason: str) -> dict[str, Any]:
    ev = await lab.wait_event("secret.refused", lambda ev, d: ev.subject == "n1" and d["reason"] == reason)
    return dict(json.loads(ev.data_json))


# -- delivery -----------------------------------------------------------------------------------------------


async def test_the_exporter_sends_the_secret_header_and_the_value_is_nowhere_else(
    lab: InprocLab, receiver: tuple[int, Received], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port, received = receiver
    wire = await start(lab)
    value = token()
    info = await lab.admin.set_secret(NAME, f"authorization=Bearer%20{value}".encode(), nodes=["n1"])
    assert info.version == 1 and list(info.scope.nodes) == ["n1"]
    generation = await telemetry(lab, port)

    await header_seen(received, f"Bearer {value}")
    delivered = await lab.wait_event("secret.delivered", lambda ev, d: ev.subject == "n1")
    d = json.loads(delivered.data_json)
    assert (d["name"], d["version"], d["section"], d["generation"]) == (NAME, 1, "telemetry", generation)
    await lab.wait_observed("n1", generation)
    assert lab.agents["n1"].secrets is not None and lab.agents["n1"].secrets.version(NAME, "telemetry") == 1

    # What a gateway relayed: the request and a JWE, never the value.
    assert {"secret_request", "secret_response"} <= wire.kinds()
    assert not wire.holds(value.encode())
    # The store holds it sealed only; the operator's view lists it without a value.
    assert value.encode() not in await store_dump(lab)
    listed = await lab.admin.list_secrets()
    assert [(s.name, s.version, list(s.used_by)) for s in listed.secrets] == [(NAME, 1, ["n1/telemetry"])]
    assert value not in str(listed)
    # No log line of the server, the gateway or the agent carries it.
    assert caplog.records and not [r for r in caplog.records if value in r.getMessage()]
    # Nor the node's files (its journal included).
    for path in lab.node_dir("n1").rglob("*"):
        if path.is_file():
            assert value.encode() not in path.read_bytes(), path


async def test_a_rotation_is_delivered_again_to_the_section_that_uses_it(
    lab: InprocLab, receiver: tuple[int, Received]
) -> None:
    port, received = receiver
    await start(lab)
    first, second = token(), token()
    await lab.admin.set_secret(NAME, f"authorization={first}".encode(), nodes=["n1"])
    await telemetry(lab, port)
    await header_seen(received, first)

    info = await lab.admin.set_secret(NAME, f"authorization={second}".encode())  # the scope is kept
    assert info.version == 2 and list(info.scope.nodes) == ["n1"] and list(info.used_by) == ["n1/telemetry"]
    await header_seen(received, second)
    await lab.wait_event("secret.delivered", lambda ev, d: ev.subject == "n1" and d["version"] == 2)
    assert lab.agents["n1"].secrets is not None and lab.agents["n1"].secrets.version(NAME, "telemetry") == 2
    versions = await lab.admin.secret_versions(NAME)
    assert [v.version for v in versions.versions] == [2, 1]


# -- refusals --------------------------------------------------------------------------------------------


async def test_a_node_outside_the_scope_is_refused_until_the_scope_admits_it(
    lab: InprocLab, receiver: tuple[int, Received]
) -> None:
    port, received = receiver
    await start(lab)
    value = token()
    await lab.admin.set_secret(NAME, f"authorization={value}".encode(), labels=["pool=a"])
    await telemetry(lab, port)

    why = await refused(lab, "out-of-scope")
    assert why["name"] == NAME and why["section"] == "telemetry"
    failed = await section(lab, "FAILED")
    assert failed.reason == "SecretRefused" and "out-of-scope" in failed.message
    assert received.header_values("authorization") == []  # nothing was exported without its headers

    # The node gets the label: a new set of the secret (same scope) tells it to ask again, and it is admitted.
    await lab.admin.label_node("n1", {"pool": "a"}, [])
    seq = (await lab.admin.fleet_snapshot()).event_seq
    await lab.admin.set_secret(NAME, f"authorization={value}".encode())
    await section(lab, "CONVERGED", after_seq=seq)
    await header_seen(received, value)


async def test_a_node_asking_for_a_secret_its_spec_does_not_name_is_refused(lab: InprocLab) -> None:
    await start(lab)
    await lab.admin.set_secret("other", b"authorization=x", nodes=["n1"])
    await lab.wait_observed("n1", (await lab.admin.get_node("n1")).generation)  # the node holds its spec
    agent = lab.agents["n1"]
    assert agent.secrets is not None
    with pytest.raises(SecretRefused) as e:
        await agent.secrets.get("other", "telemetry", agent.applied_generation)
    assert e.value.reason == "not-bound"
    why = await refused(lab, "not-bound")
    assert why["name"] == "other" and "does not name" in why["why"]
    # Bound to a generation the node is not at: stale, which the node asks again for (not a refusal it keeps).
    with pytest.raises(Exception, match="stale-generation"):
        await agent.secrets.get("other", "telemetry", agent.applied_generation + 5)


async def test_an_unavailable_broker_keeps_the_section_progressing(
    lab: InprocLab, receiver: tuple[int, Received]
) -> None:
    port, received = receiver
    await start(lab)
    broker = lab.server.gateway.secrets
    lab.server.gateway.secrets = NoBroker()
    value = token()
    await lab.admin.set_secret(NAME, f"authorization={value}".encode(), nodes=["n1"])
    generation = await telemetry(lab, port)
    waiting = await section(lab, "PROGRESSING")
    assert waiting.reason == "SecretUnavailable"
    node = await lab.admin.get_node("n1")
    assert node.observed_generation < generation  # not settled: it is not FAILED for good

    lab.server.gateway.secrets = broker
    await lab.admin.set_secret(NAME, f"authorization={value}".encode())  # a rotation wakes the node at once
    await header_seen(received, value)
    await lab.wait_observed("n1", generation)


async def test_a_gateway_cannot_ask_in_the_nodes_name(lab: InprocLab) -> None:
    """A request the gateway makes up (its own key, the node's id) or rewrites (its own public key in the
    node's body) fails the node-key check: the broker never seals a value to a key the gateway holds."""
    t = compromise(lab)
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    await lab.admin.set_secret(NAME, b"authorization=x", nodes=["n1"])
    generation = await telemetry(lab, 1)  # nothing listens: the request is what matters

    mine = secret_jwe.OneTimeKey()
    body = secrets_pb2.SecretRequestBody(
        request_id="forged",
        node_id="n1",
        name=NAME,
        binding=secrets_pb2.SecretBinding(section="telemetry", generation=generation),
        public_jwk=mine.public_jwk,
        issued_at_ms=await lab.server.store.now_ms(),  # type: ignore[union-attr]
    ).SerializeToString()
    gateway_key = ec.generate_private_key(ec.SECP256R1())
    sig = attest.sign(gateway_key, secret_jwe.request_message(body))
    answers: list[secrets_pb2.SecretResponse] = []
    answered = asyncio.Event()

    def keep(msg: GatewayMessage) -> GatewayMessage:
        if msg.HasField("secret_response"):
            answers.append(msg.secret_response)
            answered.set()
        return msg

    async def answer_to(pred: Callable[[secrets_pb2.SecretResponse], bool]) -> secrets_pb2.SecretResponse:
        # The refusal's event is stored before the gateway writes the answer to the node: wait for the answer.
        async with asyncio.timeout(15):
            while not any(pred(a) for a in answers):
                answered.clear()
                await answered.wait()
        return next(a for a in answers if pred(a))

    t.outbound = keep
    await t.inject(NodeMessage(secret_request=secrets_pb2.SecretRequest(body=body, node_sig=sig)))
    why = await refused(lab, "bad-signature")
    assert why["name"] == NAME
    forged = await answer_to(lambda a: a.request_id == "forged")
    assert forged.refused == "bad-signature" and not forged.jwe

    # Now the node's own requests, with the gateway's key put in place of the node's one-time key.
    def swap_key(msg: NodeMessage) -> NodeMessage:
        if msg.HasField("secret_request"):
            b = secrets_pb2.SecretRequestBody.FromString(msg.secret_request.body)
            b.public_jwk = mine.public_jwk
            msg.secret_request.body = b.SerializeToString()
        return msg

    t.inbound = swap_key
    seq = (await lab.admin.fleet_snapshot()).event_seq
    await lab.admin.set_secret(NAME, b"authorization=y")  # the node is told to ask again
    await lab.wait_event("secret.refused", lambda ev, d: ev.seq > seq and d["reason"] == "bad-signature")
    await answer_to(lambda a: a.request_id != "forged" and a.refused == "bad-signature")  # the node's, answered
    sealed_to_gateway = []
    for a in answers:
        if a.jwe:
            with contextlib.suppress(secret_jwe.BadSecretAnswer):
                sealed_to_gateway.append(mine.open(a.jwe, name=NAME, request_id=a.request_id))
    assert sealed_to_gateway == []  # no answer the gateway's key opens


async def test_admin_views_never_carry_a_value(lab: InprocLab) -> None:
    value = token()
    await lab.admin.set_secret("k8s-join", value.encode(), nodes=["n1"], labels=["pool=a"])
    listed = await lab.admin.list_secrets()
    assert [(s.name, list(s.scope.nodes), list(s.scope.labels)) for s in listed.secrets] == [
        ("k8s-join", ["n1"], ["pool=a"])
    ]
    events = await lab.admin.list_events(type_prefix="secret.")
    assert [e.type for e in events] == ["secret.set"]
    assert value not in str(events) and value not in str(listed)
    removed = await lab.admin.remove_secret("k8s-join")
    assert removed.name == "k8s-join"
    assert not (await lab.admin.list_secrets()).secrets


# -- the kubernetes unit's join token ---------------------------------------------------------------------

K8S_TOKEN = "q7x2mz.4kd9s0a1b2c3d4e5"


async def test_the_kubernetes_join_takes_its_token_from_a_secret_and_keeps_it_nowhere(
    lab: InprocLab, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wire = await start(lab)
    await lab.admin.set_secret("k8s-join", f"{K8S_TOKEN}\n".encode(), nodes=["n1"])
    settings = {
        "api_server": "10.0.0.1:6443",
        "token_secret_ref": "k8s-join",
        "ca_cert_hashes": ["sha256:" + "ab" * 32],
    }
    host = {"units": [{"name": "kubernetes", "settings_json": json.dumps(settings)}]}
    info = await lab.admin.set_spec_section("n1", "host", json.dumps(host))
    await lab.wait_observed("n1", info.generation)

    node = await lab.admin.get_node("n1")
    host_status = next(s for s in node.sections if s.section == "host")
    assert common_pb2.SectionState.Name(host_status.state) == "CONVERGED", host_status
    await lab.wait_event(
        "node.condition",
        lambda ev, d: d["type"] == "KubernetesJoined" and (d["status"], d["reason"]) == ("True", "Joined"),
    )
    assert (lab.node_dir("n1") / "host-root" / "etc/kubernetes/kubelet.conf").exists()
    d = json.loads((await lab.wait_event("secret.delivered", lambda ev, d: d["name"] == "k8s-join")).data_json)
    assert (d["section"], d["unit"]) == ("host", "kubernetes")
    listed = await lab.admin.list_secrets()
    assert [list(s.used_by) for s in listed.secrets] == [["n1/host/kubernetes"]]

    secret_half = K8S_TOKEN.split(".")[1]
    assert not wire.holds(secret_half.encode())
    assert secret_half.encode() not in await store_dump(lab)
    assert not [r for r in caplog.records if secret_half in r.getMessage()]
    for path in lab.node_dir("n1").rglob("*"):
        if path.is_file():
            assert secret_half.encode() not in path.read_bytes(), path


# -- through a gateway that holds no key -------------------------------------------------------------------


async def test_a_keyless_gateway_forwards_requests_and_relays_ciphertext_only(
    tmp_path: Path, store_url: str, receiver: tuple[int, Received]
) -> None:
    port, received = receiver
    async with keyless_pair(tmp_path, store_url) as (lab, gw):
        assert gw.secret_box is None and not (tmp_path / "gw" / "pki" / "secrets.key").exists()
        wire = Wire()
        wire.tap(compromise_gateway(gw))
        tok = await lab.admin.create_token("n1")
        await join_node(gw.address, tok.token, lab.node_dir("n1"))
        await lab.start_node("n1")
        await lab.wait_connected("n1", timeout=30)
        assert (await lab.admin.get_node("n1")).gateway_id == "gw-k"
        value = token()
        await lab.admin.set_secret(NAME, f"authorization={value}".encode(), nodes=["n1"])
        await telemetry(lab, port)
        await header_seen(received, value)
        assert {"secret_request", "secret_response"} <= wire.kinds() and not wire.holds(value.encode())
        # A rotation set through the api reaches the node on the other process's gateway.
        second = token()
        await lab.admin.set_secret(NAME, f"authorization={second}".encode())
        await header_seen(received, second)
        assert not wire.holds(second.encode())
