"""Node certificate renewal end to end: real gRPC over mutual TLS, real SQLite, a real agent on fake GPUs.

A 20 s node certificate renews 12 s after it was issued, so the agent's own
renewal happens within the test. The refusals call `Join.Renew` directly with
the node's files, as a tampered or stale node would.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.identity import Identity
from bc.pki import keys
from bc.pki.identity import make_csr
from bc.pki.renewal import sign_renew_proof
from bc.protocol.pb import join_pb2
from bc.runtime.config import OperatorConfig
from bc.store import identity as id_sql
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials
from tests.integration.conftest import InprocLab, open_lab

SHORT_TTL_S = 20


@pytest.fixture
async def short_lab(tmp_path: Path) -> AsyncIterator[InprocLab]:
    """The in-process lab, with node certificates of 20 s (`bc serve --node-cert-ttl 20`)."""
    async with open_lab(tmp_path, node_cert_ttl_s=SHORT_TTL_S) as lab:
        yield lab


def _cert(d: Path) -> x509.Certificate:
    return keys.load_cert_pem((d / "node.crt").read_bytes())


def _serial(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


async def _cert_row(lab: InprocLab, serial: str) -> dict[str, object] | None:
    assert lab.server.store is not None
    async with lab.server.store.transaction(write=False) as tx:
        return await id_sql.get_cert(tx, serial)


async def test_a_node_renews_and_keeps_working(short_lab: InprocLab) -> None:
    lab = short_lab
    await lab.join("n1")
    d = lab.node_dir("n1")
    first, first_key = _cert(d), (d / "node.key").read_bytes()
    lifetime = first.not_valid_after_utc - first.not_valid_before_utc
    assert lifetime.total_seconds() == SHORT_TTL_S + 60  # the CA backdates 60 s
    await lab.start_node("n1")
    await lab.wait_connected("n1")

    ev = await lab.wait_event("node.cert.renewed", lambda ev, d: ev.subject == "n1", timeout=40)
    data = json.loads(ev.data_json)
    assert data["previous_serial"] == _serial(first) != data["serial"]
    row = await _cert_row(lab, data["serial"])
    assert row is not None and row["node_id"] == "n1" and row["identity_generation"] == 1
    assert row["revoked_at_ms"] is None and row["not_after_ms"] == data["not_after_ms"]
    old = await _cert_row(lab, _serial(first))
    assert old is not None and old["revoked_at_ms"] is None, "the previous certificate stays valid until it expires"

    # The node moved to the new certificate: a new session is welcomed after the renewal.
    await lab.wait_connected("n1", after_seq=ev.seq, timeout=20)
    on_disk = _cert(d)
    assert _serial(on_disk) != _serial(first)
    assert (await _cert_row(lab, _serial(on_disk))) is not None
    key = keys.load_key_pem((d / "node.key").read_bytes())
    assert (d / "node.key").read_bytes() != first_key
    assert on_disk.public_key() == key.public_key()
    assert (d / "node.key").stat().st_mode & 0o777 == 0o600
    assert not list(d.glob("*.next"))

    # And it keeps working, past the first certificate's expiry.
    cmd = await lab.admin.run_command("n1", "inventory.refresh")
    await lab.wait_event("command.settled", lambda ev, d: ev.subject == cmd.id, timeout=20)
    assert (await lab.admin.get_command(cmd.id)).state == "succeeded"
    refused = await lab.admin.list_events(type_prefix="security.renew.refused")
    assert refused == []


# -- refusals ------------------------------------------------------------------------------------


def _request(
    d: Path,
    *,
    new_key: keys.PrivateKey | None = None,
    timestamp_ms: int | None = None,
    signer: keys.PrivateKey | None = None,
) -> join_pb2.RenewRequest:
    current = keys.load_key_pem((d / "node.key").read_bytes())
    csr_der = make_csr(new_key or keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    ts = round(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    return join_pb2.RenewRequest(
        csr_der=csr_der, timestamp_ms=ts, proof=sign_renew_proof(signer or current, csr_der, ts)
    )


async def _renew(lab: InprocLab, d: Path, req: join_pb2.RenewRequest) -> join_pb2.RenewResponse:
    ident = Identity.load(d)
    creds = channel_credentials(ident.read(d, "ca"), ident.read(d, "key"), ident.read(d, "cert"))
    async with grpc.aio.secure_channel(lab.server.address, creds) as ch:
        resp: join_pb2.RenewResponse = await join_pb2_grpc.JoinStub(ch).Renew(req, timeout=10)
        return resp


async def _refused(lab: InprocLab, d: Path, req: join_pb2.RenewRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await _renew(lab, d, req)
    return ei.value


async def _refusal_reasons(lab: InprocLab) -> list[str]:
    return [json.loads(ev.data_json)["reason"] for ev in await lab.admin.list_events(type_prefix="security.renew.")]


async def _cert_count(lab: InprocLab) -> int:
    assert lab.server.store is not None
    async with lab.server.store.transaction(write=False) as tx:
        return int(await tx.fetchval("SELECT COUNT(*) FROM node_certs", {}))


async def test_renew_by_hand_issues_a_certificate_for_the_new_key(lab: InprocLab) -> None:
    await lab.join("n1")
    d = lab.node_dir("n1")
    new_key = keys.generate_key()
    resp = await _renew(lab, d, _request(d, new_key=new_key))
    cert = keys.load_cert_pem(resp.cert_pem)
    assert cert.public_key() == new_key.public_key()
    assert resp.trust.ca_pem == lab.server.ca.ca_pem
    assert (await _cert_row(lab, _serial(cert))) is not None


async def test_a_revoked_certificate_is_not_renewed(lab: InprocLab) -> None:
    await lab.join("n1")
    d = lab.node_dir("n1")
    assert lab.server.store is not None
    async with lab.server.store.transaction() as tx:
        await tx.execute(
            "UPDATE node_certs SET revoked_at_ms = :t, revoke_reason = 'test' WHERE serial = :s",
            {"t": round(time.time() * 1000), "s": _serial(_cert(d))},
        )
    before = await _cert_count(lab)
    err = await _refused(lab, d, _request(d))
    # Refused in the call or, where revocation reaches the handshake, before it.
    assert err.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE), err
    if err.code() == grpc.StatusCode.UNAUTHENTICATED:
        assert "revoked" in (err.details() or "")
        ev = await lab.wait_event("security.renew.refused", lambda ev, data: ev.subject == "n1")
        assert json.loads(ev.data_json)["reason"] == "renew:revoked"
    assert await _cert_count(lab) == before


async def test_a_certificate_of_an_older_identity_is_not_renewed(lab: InprocLab) -> None:
    await lab.join("n1")
    old_dir = lab.node_dir("n1")
    # The node joins again (a new identity generation) from another data dir; the old files remain.
    tok = await lab.admin.create_token("n1")
    from agent.join import join_node

    await join_node(lab.server.address, tok.token, lab.root / "n1-again")
    assert Identity.load(lab.root / "n1-again").identity_generation == 2
    before = await _cert_count(lab)
    err = await _refused(lab, old_dir, _request(old_dir))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "older identity" in (err.details() or "")
    ev = await lab.wait_event("security.renew.refused", lambda ev, data: ev.subject == "n1")
    assert json.loads(ev.data_json)["reason"] == "renew:old-identity"
    assert await _cert_count(lab) == before
    # The current identity still renews.
    await _renew(lab, lab.root / "n1-again", _request(lab.root / "n1-again"))


async def test_a_bad_proof_is_refused_without_an_event(lab: InprocLab) -> None:
    await lab.join("n1")
    d = lab.node_dir("n1")
    before = await _cert_count(lab)
    err = await _refused(lab, d, _request(d, signer=keys.generate_key()))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "proof of possession" in (err.details() or "")
    # A proof for another CSR fails the same way.
    req = _request(d)
    req.csr_der = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    assert (await _refused(lab, d, req)).code() == grpc.StatusCode.UNAUTHENTICATED
    assert await _cert_count(lab) == before
    # Nothing proved the key, so nothing is published (an event is written only after the proof).
    assert await _refusal_reasons(lab) == []


async def test_a_stale_timestamp_is_refused(lab: InprocLab) -> None:
    await lab.join("n1")
    d = lab.node_dir("n1")
    before = await _cert_count(lab)
    stale = await _refused(lab, d, _request(d, timestamp_ms=round(time.time() * 1000) - 61_000))
    assert stale.code() == grpc.StatusCode.UNAUTHENTICATED and "clock" in (stale.details() or "")
    ahead = await _refused(lab, d, _request(d, timestamp_ms=round(time.time() * 1000) + 61_000))
    assert ahead.code() == grpc.StatusCode.UNAUTHENTICATED
    await lab.wait_event("security.renew.refused", lambda ev, data: data["reason"] == "renew:stale-timestamp")
    assert await _refusal_reasons(lab) == ["renew:stale-timestamp", "renew:stale-timestamp"]
    assert await _cert_count(lab) == before


async def test_a_csr_reusing_the_current_key_is_refused(lab: InprocLab) -> None:
    await lab.join("n1")
    d = lab.node_dir("n1")
    before = await _cert_count(lab)
    current = keys.load_key_pem((d / "node.key").read_bytes())
    err = await _refused(lab, d, _request(d, new_key=current))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "new key" in (err.details() or "")
    ev = await lab.wait_event("security.renew.refused", lambda ev, data: ev.subject == "n1")
    assert json.loads(ev.data_json)["reason"] == "renew:key-reused"
    assert await _cert_count(lab) == before


async def test_an_operator_certificate_cannot_renew(lab: InprocLab) -> None:
    cfg = OperatorConfig.load(lab.server.operator_config)
    key = keys.load_key_pem(cfg.key_pem)
    csr_der = make_csr(keys.generate_key(), "x").public_bytes(serialization.Encoding.DER)
    ts = round(time.time() * 1000)
    req = join_pb2.RenewRequest(csr_der=csr_der, timestamp_ms=ts, proof=sign_renew_proof(key, csr_der, ts))
    creds = channel_credentials(cfg.ca_pem, cfg.key_pem, cfg.cert_pem)
    async with grpc.aio.secure_channel(lab.server.address, creds) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await join_pb2_grpc.JoinStub(ch).Renew(req, timeout=10)
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "node certificate" in (ei.value.details() or "")
