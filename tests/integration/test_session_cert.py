"""A TPM identity's session on an in-memory key (`Join.SessionCert`), end to end, over SQLite and PostgreSQL.

Real parts above the hardware edge: a real `bc serve` over gRPC and mutual TLS on 127.0.0.1, the real agent
(`production_parts`, fake GPUs) whose TPM is played in software at `NodeKeyHolder` (tests/soft_tpm.py: the
same record in node.key, the same attestation key's certification the server checks). The same agent on a
real (software) TPM through tpm2-tools is tests/integration/test_tpm_swtpm.py.

The refusals call `Join.SessionCert`, `Join.Renew` and `Join.Rejoin` directly, as a stale, stolen or
tampered node would; the expiry is reached by stepping the server's (and its store's) clock, as
tests/integration/test_rejoin.py does.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agent.app import Agent, AgentOptions
from agent.identity import Identity
from agent.renewal import Renewer
from agent.session_key import SessionKeys
from bc.assembly.server import Seams
from bc.errors import Unauthenticated
from bc.pki import attest, keys, tokens
from bc.pki.identity import make_csr, peer_identity
from bc.pki.rejoin import rejoin_proof_message
from bc.pki.renewal import renew_proof_message
from bc.pki.secrets_source import SystemSecrets, os_seeded_random
from bc.pki.session_cert import session_of, session_proof_message
from bc.pki.tpm_attest import ak_uri_of
from bc.protocol.pb import join_pb2
from bc.seams.clock import Clock, LoopClock, SystemClock
from bc.store import Store, open_store
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.test_keyless_gateway import keyless_pair
from tests.soft_tpm import SoftTpm, SoftTpmKey, soft_join, soft_tpm_parts

DAY_S = 24 * 3600
SHORT_TTL_S = 20


@pytest.fixture
async def stepped(tmp_path: Path, store_url: str) -> AsyncIterator[tuple[InprocLab, LoopClock]]:
    """A lab on a clock the test steps (its store's too: on PostgreSQL the store reads the server's clock)."""
    loop = asyncio.get_running_loop()
    clock = LoopClock(wall_offset=time.time() - loop.time())

    async def opener(url: str, store_clock: Clock) -> Store:
        if not url.startswith("postgresql://"):
            return await open_store(url, store_clock)
        from bc.store.postgres import PostgresStore

        store = PostgresStore(url, store_clock, db_clock=False)
        await store.open(migrate=True)
        return store

    seams = Seams(clock, os_seeded_random(), SystemSecrets(), store_opener=opener)
    async with open_lab(tmp_path, seams, store=store_url) as lab:
        yield lab, clock


@pytest.fixture
async def short_lab(tmp_path: Path, store_url: str) -> AsyncIterator[InprocLab]:
    """Node certificates of 20 s (`bc serve --node-cert-ttl 20`): a session certificate lasts at most as long."""
    async with open_lab(tmp_path, store=store_url, node_cert_ttl_s=SHORT_TTL_S) as lab:
        yield lab


async def _join(lab: InprocLab, node_id: str = "n1", server: str | None = None) -> tuple[Path, SoftTpmKey]:
    tok = await lab.admin.create_token(node_id)
    d = lab.node_dir(node_id)
    holder = await soft_join(server or lab.server.address, tok.token, d, SoftTpm())
    return d, holder


def _start(lab: InprocLab, node_id: str, holder: SoftTpmKey) -> Agent:
    opts = AgentOptions(data_dir=lab.node_dir(node_id), fake_hw="hgx-h100-8", heartbeat_interval_s=1.0)
    agent = Agent(opts, soft_tpm_parts(opts, holder))
    lab.agents[node_id] = agent
    lab.tasks[node_id] = asyncio.create_task(agent.run(), name=f"agent-{node_id}")
    return agent


def _cert(d: Path) -> x509.Certificate:
    return keys.load_cert_pem((d / "node.crt").read_bytes())


def _serial(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


async def _row(lab: InprocLab, sql: str, **params: object) -> dict[str, object] | None:
    assert lab.server.store is not None
    async with lab.server.store.transaction(write=False) as tx:
        return await tx.fetchone(sql, params)


async def _reasons(lab: InprocLab, prefix: str = "security.session-cert.") -> list[str]:
    return [json.loads(ev.data_json)["reason"] for ev in await lab.admin.list_events(type_prefix=prefix)]


async def _call(lab: InprocLab, d: Path, method: str, request: object, address: str | None = None) -> object:
    """A Join call as a TPM node makes it: under a leaf of the join root naming the node, which proves nothing."""
    ident = Identity.load(d)
    leaf_key, leaf_cert = tokens.rejoin_client_credentials(ident.ca_fingerprint, ident.node_id, SystemClock())
    creds = channel_credentials(ident.read(d, "ca"), leaf_key, leaf_cert)
    async with grpc.aio.secure_channel(address or lab.server.address, creds) as ch:
        return await getattr(join_pb2_grpc.JoinStub(ch), method)(request, timeout=20)


Sign = Callable[[bytes], Awaitable[bytes]]


def _by(key: ec.EllipticCurvePrivateKey) -> Sign:
    """Signing with a key `cryptography` holds: a thief's, or a key the TPM no longer has."""

    async def sign(message: bytes) -> bytes:
        return attest.sign(key, message)

    return sign


async def _session_request(
    sign: Sign, d: Path, *, cert: x509.Certificate | None = None, skew_ms: int = 0, node_id: str = "n1"
) -> join_pb2.SessionCertRequest:
    cert = cert or _cert(d)
    csr_der = make_csr(keys.generate_key(), node_id).public_bytes(serialization.Encoding.DER)
    ts, nonce = round(time.time() * 1000) + skew_ms, secrets.token_bytes(16)
    message = session_proof_message(node_id, _serial(cert), _der(cert), csr_der, ts, nonce)
    return join_pb2.SessionCertRequest(
        cert_der=_der(cert), csr_der=csr_der, timestamp_ms=ts, nonce=nonce, proof=await sign(message)
    )


def _keeper(d: Path, holder: SoftTpmKey, clock: Clock | None = None) -> SessionKeys:
    return SessionKeys(d, Identity.load(d), holder, clock or SystemClock(), os_seeded_random())


# -- the node's own path -------------------------------------------------------------------------------------


async def test_a_tpm_node_runs_its_session_on_an_in_memory_key_certified_by_its_tpm_key(
    stepped: tuple[InprocLab, LoopClock],
) -> None:
    lab, _ = stepped
    d, holder = await _join(lab)
    tpm_cert = _cert(d)
    agent = _start(lab, "n1", holder)
    issued = await lab.wait_event("node.session-cert.issued", lambda ev, data: ev.subject == "n1")
    data = json.loads(issued.data_json)
    connected = await lab.wait_connected("n1", timeout=30)
    assert connected.seq > issued.seq
    assert data["session_of"] == _serial(tpm_cert)

    # The session presents the session certificate, recorded against the TPM certificate it came from.
    session_row = await _row(lab, "SELECT cert_serial FROM node_sessions WHERE node_id = :n", n="n1")
    assert session_row is not None and session_row["cert_serial"] == data["serial"]
    cert_row = await _row(lab, "SELECT * FROM node_certs WHERE serial = :s", s=data["serial"])
    assert cert_row is not None and cert_row["session_of"] == _serial(tpm_cert) and cert_row["node_id"] == "n1"
    keeper = agent.parts.session_keys
    assert keeper is not None and keeper.current is not None
    session = keeper.current.cert
    assert session_of(session) == _serial(tpm_cert) and ak_uri_of(session) is None
    peer = peer_identity(session, keys.load_cert_pem((d / "ca.crt").read_bytes()))
    assert (peer.name, peer.identity_generation) == ("n1", 1)
    # The lesser of 24 h and what the TPM certificate has left: here the TPM certificate's own end.
    assert session.not_valid_after_utc <= tpm_cert.not_valid_after_utc
    assert data["not_after_ms"] == int(session.not_valid_after_utc.timestamp() * 1000)

    # The session key is in memory only: no file of the node holds a private key.
    for f in d.rglob("*"):
        if f.is_file():
            assert b"PRIVATE KEY" not in f.read_bytes(), f
    # An attested command's result is signed with the session key, and the control plane takes it.
    signed_before = holder.tpm.signed
    cmd = await lab.admin.run_command("n1", "diag.nvml")
    ev = await lab.wait_event("command.settled", lambda ev, data: ev.subject == cmd.id, timeout=30)
    assert (await lab.admin.get_command(cmd.id)).state == "succeeded", ev.data_json
    assert holder.tpm.signed == signed_before, "results are signed in memory, not by a TPM command each"


async def test_revoking_the_node_revokes_its_session_certificates_ends_the_session_and_refuses_a_new_one(
    stepped: tuple[InprocLab, LoopClock],
) -> None:
    lab, _ = stepped
    d, holder = await _join(lab)
    _start(lab, "n1", holder)
    issued = await lab.wait_event("node.session-cert.issued", lambda ev, data: ev.subject == "n1")
    session_serial = json.loads(issued.data_json)["serial"]
    connected = await lab.wait_connected("n1", timeout=30)

    await lab.admin.revoke_node("n1", reason="stolen")
    row = await _row(lab, "SELECT revoked_at_ms, revoke_reason FROM node_certs WHERE serial = :s", s=session_serial)
    assert row is not None and row["revoked_at_ms"] is not None and row["revoke_reason"] == "stolen"
    await lab.wait_event(
        "node.connectivity",
        lambda ev, data: ev.subject == "n1" and ev.seq > connected.seq and data["state"] != "connected",
        timeout=30,
    )
    # The agent stops, as a file-key node refused at its Hello does, and says why in identity.json.
    await asyncio.wait_for(lab.tasks.pop("n1"), 30)
    lab.agents.pop("n1")
    assert Identity.load(d).revoked

    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await _call(lab, d, "SessionCert", await _session_request(holder.sign, d))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert f"certificate {_serial(_cert(d))} of node n1 was revoked" in (ei.value.details() or "")
    assert "bc join --reset --yes" in (ei.value.details() or "")
    assert (await _reasons(lab))[-1] == "session-cert:revoked"


async def test_a_tpm_node_refused_at_start_stops_with_the_servers_sentence(
    stepped: tuple[InprocLab, LoopClock],
) -> None:
    lab, _ = stepped
    _, holder = await _join(lab)
    await lab.admin.revoke_node("n1", reason="retired")
    agent = _start(lab, "n1", holder)
    await asyncio.wait_for(lab.tasks.pop("n1"), 30)
    lab.agents.pop("n1")
    assert "was revoked, so it gets no session certificate" in agent.revoked_reason
    assert await _reasons(lab) == ["session-cert:revoked"]


async def test_a_session_certificate_is_renewed_before_it_expires_and_the_node_certificate_renews_by_proof(
    short_lab: InprocLab,
) -> None:
    lab = short_lab
    d, holder = await _join(lab)
    first = _cert(d)
    _start(lab, "n1", holder)
    one = await lab.wait_event("node.session-cert.issued", lambda ev, data: ev.subject == "n1")
    await lab.wait_connected("n1", after_seq=one.seq, timeout=30)
    # The node certificate renews by proof (no TLS with the TPM key), its next key in the TPM, certified by the AK.
    renewed = await lab.wait_event("node.cert.renewed", lambda ev, data: ev.subject == "n1", timeout=40)
    rdata = json.loads(renewed.data_json)
    assert rdata["previous_serial"] == _serial(first)
    # A session certificate of the new node certificate follows, before the first one expired, and the session
    # moves onto it.
    two = await lab.wait_event(
        "node.session-cert.issued",
        lambda ev, data: ev.subject == "n1" and data["session_of"] == rdata["serial"],
        timeout=40,
    )
    assert two.seq > one.seq
    assert json.loads(two.data_json)["serial"] != json.loads(one.data_json)["serial"]
    first_end_ms = json.loads(one.data_json)["not_after_ms"]
    assert two.at_ms < first_end_ms, "the next session certificate came before the first one ended"
    await lab.wait_connected("n1", after_seq=two.seq, timeout=30)
    # 20 s certificates keep renewing: whichever node certificate is on disk now, it is a renewal's, names the
    # same AK, and node.key records its key, which the TPM holds.
    now = _cert(d)
    renewals = {json.loads(e.data_json)["serial"] for e in await lab.admin.list_events(type_prefix="node.cert.renewed")}
    assert _serial(now) in renewals and ak_uri_of(now) == ak_uri_of(first) == holder.tpm.ak_uri()
    await holder.check(now)
    assert now.public_key() != first.public_key()
    # One change of identity at a time: a session certificate is never asked for with a node certificate the
    # server has just replaced, so no refusal was published.
    assert await _reasons(lab, "security.") == []


# -- the server's refusals, one sentence and one event each --------------------------------------------------


async def test_each_refusal_is_one_sentence_and_a_security_event(stepped: tuple[InprocLab, LoopClock]) -> None:
    lab, clock = stepped
    d, holder = await _join(lab)

    # A good request first: the answer is a session certificate of this node certificate.
    resp = await _call(lab, d, "SessionCert", await _session_request(holder.sign, d))
    assert isinstance(resp, join_pb2.SessionCertResponse)
    session = keys.load_cert_pem(resp.cert_pem)
    assert session_of(session) == _serial(_cert(d))

    async def refused(request: object, code: grpc.StatusCode, words: str, method: str = "SessionCert") -> None:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await _call(lab, d, method, request)
        assert ei.value.code() == code, ei.value.details()
        assert words in (ei.value.details() or ""), ei.value.details()
        assert "\n" not in (ei.value.details() or "")

    # The request's timestamp more than 5 minutes from the store's clock (a retry: the node fixes its clock).
    await refused(
        await _session_request(holder.sign, d, skew_ms=-301_000),
        grpc.StatusCode.FAILED_PRECONDITION,
        "timestamp is -301 s from the server's clock (at most ±300 s); check the node's clock",
    )
    # A session certificate asking for another, signed by its key (a thief of it): it certifies nothing.
    pair = await _keeper(d, holder).obtain_once()
    await refused(
        await _session_request(_by(pair.key), d, cert=pair.cert),
        grpc.StatusCode.UNAUTHENTICATED,
        "is a session certificate, which certifies no other key",
    )
    # A proof by another key: the caller has shown nothing, and no event is written.
    before = await _reasons(lab)
    await refused(
        await _session_request(_by(keys.generate_key()), d), grpc.StatusCode.UNAUTHENTICATED, "proof was not made"
    )
    assert await _reasons(lab) == before
    # A leaf naming another node than the certificate.
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        ident = Identity.load(d)
        leaf_key, leaf_cert = tokens.rejoin_client_credentials(ident.ca_fingerprint, "n2", SystemClock())
        creds = channel_credentials(ident.read(d, "ca"), leaf_key, leaf_cert)
        async with grpc.aio.secure_channel(lab.server.address, creds) as ch:
            await join_pb2_grpc.JoinStub(ch).SessionCert(await _session_request(holder.sign, d), timeout=20)
    assert "names another node than its client certificate" in (ei.value.details() or "")

    # A file-key node: its key is the session's own TLS key, and it gets no session certificate.
    await lab.join("f1")
    fd = lab.node_dir("f1")
    file_key = keys.load_key_pem((fd / "node.key").read_bytes())
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await _call(lab, fd, "SessionCert", await _session_request(_by(file_key), fd, node_id="f1"))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "names no TPM attestation key" in (ei.value.details() or "")

    # Once the node certificate renewed (by proof), the old one is not the latest (a retry: renew, then ask).
    old, old_key = _cert(d), holder.tpm.keys[holder.record.handle]
    renewer = Renewer(d, Identity.load(d), SystemClock(), os_seeded_random(), key_holder=holder, by_proof=True)
    await renewer.renew_once()
    assert _serial(_cert(d)) != _serial(old)
    await refused(
        await _session_request(_by(old_key), d, cert=old),
        grpc.StatusCode.FAILED_PRECONDITION,
        "is not the node's latest certificate",
    )
    # Past the node certificate's expiry (the store's clock stepped a day on): re-join first.
    clock.step(DAY_S + 120)
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await _call(lab, d, "SessionCert", await _session_request(holder.sign, d, skew_ms=(DAY_S + 120) * 1000))
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "expired at" in (ei.value.details() or "") and "re-joins first" in (ei.value.details() or "")

    # A later join replaced the identity (bc join --reset with a new token): the old one's is refused for good.
    tok = await lab.admin.create_token("n1")
    await soft_join(lab.server.address, tok.token, lab.node_dir("n1-again"), SoftTpm())
    await refused(
        await _session_request(holder.sign, d, skew_ms=(DAY_S + 120) * 1000),
        grpc.StatusCode.UNAUTHENTICATED,
        "belongs to an older identity of the node; join again with a new token",
    )

    assert await _reasons(lab) == [
        "session-cert:stale-timestamp",
        "session-cert:session-certificate",
        "session-cert:not-tpm",
        "session-cert:not-latest",
        "session-cert:expired",
        "session-cert:old-identity",
    ]


async def test_a_session_certificate_neither_renews_nor_rejoins(stepped: tuple[InprocLab, LoopClock]) -> None:
    """A stolen session key dies with its day: it cannot be turned into an identity without the TPM."""
    lab, _ = stepped
    d, holder = await _join(lab)
    keeper = _keeper(d, holder)
    pair = await keeper.obtain_once()
    ident = Identity.load(d)
    csr_der = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    ts = round(time.time() * 1000)
    renew = join_pb2.RenewRequest(
        csr_der=csr_der, timestamp_ms=ts, proof=attest.sign(pair.key, renew_proof_message(csr_der, ts))
    )
    creds = channel_credentials(ident.read(d, "ca"), pair.key_pem, pair.cert_pem)
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        async with grpc.aio.secure_channel(lab.server.address, creds) as ch:
            await join_pb2_grpc.JoinStub(ch).Renew(renew, timeout=20)
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "is a session certificate, which is never renewed" in (ei.value.details() or "")

    session_der = _der(pair.cert)
    nonce = secrets.token_bytes(16)
    rejoin = join_pb2.RejoinRequest(
        cert_der=session_der,
        csr_der=csr_der,
        timestamp_ms=ts,
        nonce=nonce,
        proof=attest.sign(pair.key, rejoin_proof_message(session_der, csr_der, ts, nonce)),
    )
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await _call(lab, d, "Rejoin", rejoin)
    assert "is a session certificate, which is never re-joined" in (ei.value.details() or "")
    assert await _reasons(lab, "security.renew.") == ["renew:session-certificate"]
    assert await _reasons(lab, "security.rejoin.") == ["rejoin:session-certificate"]


async def test_a_tpm_node_renews_by_proof_only_with_a_next_key_its_ak_certifies(
    stepped: tuple[InprocLab, LoopClock],
) -> None:
    lab, _ = stepped
    d, holder = await _join(lab)
    first = _cert(d)
    renewer = Renewer(d, Identity.load(d), SystemClock(), os_seeded_random(), key_holder=holder, by_proof=True)
    new = await renewer.renew_once()
    ev = await lab.wait_event("node.cert.renewed", lambda ev, data: ev.subject == "n1")
    assert json.loads(ev.data_json)["previous_serial"] == _serial(first)
    assert ak_uri_of(new) == ak_uri_of(first) and new.public_key() != first.public_key()
    await holder.check(_cert(d))  # node.key records the new key, which the TPM holds

    # A next key certified by another TPM's AK is refused: the certificate names this TPM's.
    careless = _CarelessKey(SoftTpm(), holder.record)
    careless.tpm.keys = holder.tpm.keys  # the same keys, another attestation key
    with pytest.raises(Unauthenticated, match="not the one the certificate names"):
        await Renewer(
            d, Identity.load(d), SystemClock(), os_seeded_random(), key_holder=careless, by_proof=True
        ).renew_once()
    assert (await _reasons(lab, "security.renew."))[-1] == "renew:key-attestation-invalid"


async def test_a_tpm_node_gets_its_session_certificate_and_renews_through_a_gateway_that_holds_no_key(
    tmp_path: Path, store_url: str
) -> None:
    async with keyless_pair(tmp_path, store_url) as (lab, gw):
        d, holder = await _join(lab, server=gw.address)
        keeper = _keeper(d, holder)
        pair = await keeper.obtain_once()  # Join.SessionCert, forwarded as it came
        assert session_of(pair.cert) == _serial(_cert(d))
        renewer = Renewer(d, Identity.load(d), SystemClock(), os_seeded_random(), key_holder=holder, by_proof=True)
        await renewer.renew_once()  # Join.Renew by proof, forwarded without the caller's leaf
        _start(lab, "n1", holder)
        await lab.wait_connected("n1", timeout=30)
        assert (await lab.admin.get_node("n1")).gateway_id == "gw-k"


# -- helpers ---------------------------------------------------------------------------------------------------


class _CarelessKey(SoftTpmKey):
    """A node that does not check its TPM against its certificate before it asks (the server does)."""

    async def check(self, cert: x509.Certificate) -> None:
        return None
