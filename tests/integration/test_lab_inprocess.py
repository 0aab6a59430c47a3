"""The foundation over real gRPC and real certificates, in one process."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from agent.identity import Identity
from agent.join import join_node
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.pki import keys, tokens
from bc.pki.identity import make_csr
from bc.protocol.pb import join_pb2, session_pb2
from bc.seams.clock import SystemClock
from bc.wire.stubs import admin_pb2_grpc, join_pb2_grpc, session_pb2_grpc
from bc.wire.tls import channel_credentials
from tests.integration.conftest import InprocLab


async def test_join_connect_converge_reserve_release(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    await lab.wait_observed("n1", 1)
    node = await lab.admin.get_node("n1")
    assert node.state == "connected"
    assert len(node.inventory.gpus) == 8

    res = await lab.admin.reserve(2, node_id="n1")
    assert res.state == "placed" and len(res.devices) == 2
    await lab.wait_observed("n1", res.generation)
    cdi = lab.node_dir("n1") / "cdi" / f"bc-{res.allocation_id}.json"
    doc = json.loads(cdi.read_text())
    assert doc["kind"] == "bc.dev/gpu"
    assert {d["name"] for d in doc["devices"]} == {d.atom_id.replace("/", "_") for d in res.devices}
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id)
    (gpu,) = (await lab.admin.get_node("n1")).capacity  # `bc nodes show`: what is booked and free
    assert (gpu.device_class, gpu.offered, gpu.booked_now, gpu.free_now) == ("gpu", 8, 2, 6)

    rel = await lab.admin.release(res.id)
    assert rel.state == "releasing"
    await lab.wait_event("reservation.released", lambda ev, d: ev.subject == res.id)
    assert not cdi.exists()
    await lab.wait_observed("n1", rel.generation)


async def test_spec_sections_and_generations(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    spec = await lab.admin.set_spec_section("n1", "telemetry", '{"otlp_endpoint": "http://127.0.0.1:4317"}')
    assert spec.generation == 2
    again = await lab.admin.set_spec_section("n1", "telemetry", '{"otlp_endpoint":"http://127.0.0.1:4317"}')
    assert again.generation == 2, "the same canonical JSON must not raise the generation"
    await lab.wait_observed("n1", 2)
    node = await lab.admin.get_node("n1")
    states = {s.section: s.state for s in node.sections}
    assert states["telemetry"] == 1  # CONVERGED: the node exports there (docs/telemetry.md), collector or not
    with pytest.raises(UsageError, match="does not parse"):
        await lab.admin.set_spec_section("n1", "telemetry", '{"no_such_field": 1}')
    assert (await lab.admin.get_spec("n1")).generation == 2


async def test_bad_requests_change_nothing(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    before = (await lab.admin.get_spec("n1")).generation
    with pytest.raises(Conflict):
        await lab.admin.reserve(99, node_id="n1")
    with pytest.raises(NotFound):
        await lab.admin.reserve(1, node_id="nosuch")
    with pytest.raises(UsageError):
        await lab.admin.reserve(1, node_id="n1", device_class="tpu")
    with pytest.raises(UsageError):
        await lab.admin.create_token("Bad Id!")
    assert (await lab.admin.get_spec("n1")).generation == before
    assert await lab.admin.list_reservations(include_released=True) == []


async def test_token_is_one_use(lab: InprocLab) -> None:
    tok = await lab.admin.create_token("n1")
    await join_node(lab.server.address, tok.token, lab.node_dir("n1"))
    with pytest.raises(Unauthenticated, match="already been used"):
        await join_node(lab.server.address, tok.token, lab.root / "elsewhere")
    assert not Identity.exists(lab.root / "elsewhere")


async def test_wrong_ca_pin_is_refused(lab: InprocLab) -> None:
    tok = await lab.admin.create_token("n1")
    forged = tok.token.rsplit(".", 1)[0] + "." + "A" * 43
    with pytest.raises(Unauthenticated, match="pin"):
        await join_node(lab.server.address, forged, lab.node_dir("n1"))
    assert not Identity.exists(lab.node_dir("n1"))


def _node_creds(lab: InprocLab, node_id: str) -> grpc.ChannelCredentials:
    d = lab.node_dir(node_id)
    ident = Identity.load(d)
    return channel_credentials(ident.read(d, "ca"), ident.read(d, "key"), ident.read(d, "cert"))


async def test_hello_naming_another_node_is_refused(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.join("n2")
    async with grpc.aio.secure_channel(lab.server.address, _node_creds(lab, "n1")) as ch:
        call = session_pb2_grpc.NodeSessionStub(ch).Session()
        await call.write(session_pb2.NodeMessage(hello=session_pb2.Hello(node_id="n2", journal_id="j-x")))
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await call.read()
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    node = await lab.admin.get_node("n2")
    assert node.state == "new" and node.session_epoch == 0


async def test_node_certificate_cannot_call_admin(lab: InprocLab) -> None:
    await lab.join("n1")
    async with grpc.aio.secure_channel(lab.server.address, _node_creds(lab, "n1")) as ch:
        from bc.protocol.pb import admin_pb2

        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await admin_pb2_grpc.AdminStub(ch).ListNodes(admin_pb2.ListNodesRequest(), timeout=5)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _join_leaf_creds(lab: InprocLab, token: str) -> grpc.ChannelCredentials:
    """What `bc join` presents in TLS: a leaf under the install's join root, whose key the CA pin derives."""
    key_pem, cert_pem = tokens.join_client_credentials(tokens.parse_token(token), SystemClock())
    assert lab.server.ca is not None
    return channel_credentials(lab.server.ca.ca_pem, key_pem, cert_pem)


async def test_a_join_leaf_cannot_call_admin_or_session(lab: InprocLab) -> None:
    """The join root's key is public (derived from the CA fingerprint): its leaves get past TLS, and no further."""
    tok = await lab.admin.create_token("n1")
    from bc.protocol.pb import admin_pb2

    async with grpc.aio.secure_channel(lab.server.address, _join_leaf_creds(lab, tok.token)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await admin_pb2_grpc.AdminStub(ch).ListNodes(admin_pb2.ListNodesRequest(), timeout=5)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Refused before the stream carries a frame; nothing written: a write racing the refusal's trailers
        # fails in grpc's core, which then reports INTERNAL in place of the server's status.
        call = session_pb2_grpc.NodeSessionStub(ch).Session()
        assert await asyncio.wait_for(call.code(), 15) == grpc.StatusCode.UNAUTHENTICATED
        renew = join_pb2.RenewRequest(csr_der=b"x", timestamp_ms=1, proof=b"x")
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await join_pb2_grpc.JoinStub(ch).Renew(renew, timeout=5)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await lab.admin.list_nodes() == []
    await join_node(lab.server.address, tok.token, lab.node_dir("n1"))  # the token is still whole


async def test_join_refuses_a_proof_over_another_csr_or_by_another_tokens_key(lab: InprocLab) -> None:
    tok = await lab.admin.create_token("n1")
    other = await lab.admin.create_token("n2")
    parsed, other_secret = tokens.parse_token(tok.token), tokens.parse_token(other.token).secret

    def csr() -> bytes:
        return make_csr(keys.generate_key(), "pending").public_bytes(serialization.Encoding.DER)

    mine, theirs = csr(), csr()
    cases = [
        ("over another CSR", tokens.join_proof(parsed.secret, parsed.token_id, theirs), "secret does not match"),
        ("by another token's key", tokens.join_proof(other_secret, parsed.token_id, mine), "secret does not match"),
    ]
    async with grpc.aio.secure_channel(lab.server.address, _join_leaf_creds(lab, tok.token)) as ch:
        for label, proof, sentence in cases:
            req = join_pb2.JoinRequest(csr_der=mine, hostname="h", token_id=parsed.token_id, token_proof=proof)
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await join_pb2_grpc.JoinStub(ch).Join(req, timeout=5)
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED, label
            assert sentence in (ei.value.details() or ""), label
        # Another token named in the request than in the leaf: refused, whatever the proof.
        other_id = tokens.parse_token(other.token).token_id
        req = join_pb2.JoinRequest(
            csr_der=mine, token_id=other_id, token_proof=tokens.join_proof(other_secret, other_id, mine)
        )
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await join_pb2_grpc.JoinStub(ch).Join(req, timeout=5)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # No proof at all (a client that predates it): a sentence, not a crash.
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await join_pb2_grpc.JoinStub(ch).Join(join_pb2.JoinRequest(csr_der=mine), timeout=5)
        assert "no token id and proof" in (ei.value.details() or "")
    # Nothing was burnt: both genuine tokens still join.
    await join_node(lab.server.address, tok.token, lab.node_dir("n1"))
    await join_node(lab.server.address, other.token, lab.node_dir("n2"))


async def test_node_restart_keeps_holds_and_reconverges(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    res = await lab.admin.reserve(1, node_id="n1")
    await lab.wait_observed("n1", res.generation)
    first = await lab.wait_connected("n1")
    await lab.stop_node("n1")
    await lab.wait_event("node.connectivity", lambda ev, d: ev.subject == "n1" and d["state"] == "disconnected")
    # While it is down, a hold named for it waits (issue 13; it was placed at once) and is placed on
    # reconnect: a new generation.
    res2 = await lab.admin.reserve(1, node_id="n1")
    assert (res2.state, res2.reason) == ("pending", "node n1 is disconnected")
    await lab.start_node("n1")
    await lab.wait_connected("n1", after_seq=first.seq)
    placed = await lab.wait_event("reservation.placed", lambda ev, d: ev.subject == res2.id)
    await lab.wait_observed("n1", json.loads(placed.data_json)["generation"])
    cdi = lab.node_dir("n1") / "cdi"
    assert {p.name for p in cdi.glob("bc-*.json")} == {f"bc-{res.allocation_id}.json", f"bc-{res2.allocation_id}.json"}
    # The first hold was never reported released: it was held through the restart.
    released = [
        ev
        for ev in await lab.admin.list_events(type_prefix="node.event")
        if json.loads(ev.data_json).get("kind") == "released"
    ]
    assert released == []


async def test_a_deleted_node_keeps_its_history_and_its_id_joins_again(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    res = await lab.admin.reserve(1, node_id="n1")
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id)
    await lab.admin.release(res.id)
    await lab.wait_event("reservation.released", lambda ev, d: ev.subject == res.id)
    await lab.stop_node("n1")
    await lab.admin.cordon_node("n1", True)
    await lab.admin.delete_node("n1")

    assert [n.node_id for n in await lab.admin.list_nodes()] == []
    (gone,) = await lab.admin.list_nodes(include_deleted=True)
    assert (gone.node_id, gone.state, gone.revoked) == ("n1", "deleted", True)
    assert (await lab.admin.get_node("n1")).state == "deleted"  # its history still reads
    assert [r.id for r in await lab.admin.list_reservations(include_released=True)] == [res.id]
    with pytest.raises(NotFound):
        await lab.admin.reserve(1, node_id="n1")

    # A new token revives the id: a new identity generation, uncordoned, the history still there.
    await join_node(lab.server.address, (await lab.admin.create_token("n1")).token, lab.root / "n1-again")
    back = await lab.admin.get_node("n1")
    assert (back.state, back.cordoned) == ("new", False)
    assert [r.id for r in await lab.admin.list_reservations(include_released=True)] == [res.id]
    ident = Identity.load(lab.root / "n1-again")
    assert ident.identity_generation == 2
