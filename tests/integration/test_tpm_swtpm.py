"""The node key in a real (software) TPM: swtpm in the test's tmp dir, reached through the `swtpm:` TCTI.

Each test starts its own swtpm (`--daemon`: the start returns once it listens, so nothing polls), drives
it through `agent.tpm` exactly as a node drives /dev/tpmrm0, and judges what the TPM produced with
`cryptography` and `bc.pki.tpm_attest`, as the server would. The failure modes are made for real:
`tpm2_clear` (a cleared TPM), `tpm2_changeeps` (a new endorsement seed, as another TPM has), and the
swtpm process stopped (no TPM). A real `bc node` runs a TPM identity on its in-memory session key against a
real `bc serve`, renewing both through the TPM.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import random
import secrets
import shutil
import signal
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.app import Agent, AgentOptions
from agent.doctor import check_identity, check_tpm, load_node_files
from agent.identity import Identity
from agent.join import join_node
from agent.key_holder import FileNodeKey, NodeKeyHolder
from agent.renewal import Renewer
from agent.session_key import SessionKeys
from agent.tpm import (
    ANOTHER_AK,
    CLEARED,
    HANDLES,
    UNAVAILABLE,
    Tpm,
    TpmNodeKey,
    TpmRecord,
    TpmUnavailable,
    open_node_key,
)
from bc.assembly.server import Seams
from bc.cli.main import cli
from bc.errors import Unauthenticated
from bc.pki import attest, keys, tokens
from bc.pki.rejoin import rejoin_proof_message
from bc.pki.remote_csr import make_remote_csr
from bc.pki.secrets_source import SystemSecrets, os_seeded_random
from bc.pki.tpm_attest import TpmCertification, ak_uri, ak_uri_of, check_tpm_key, spki, verify_certified_key
from bc.protocol.pb import join_pb2
from bc.seams.clock import LoopClock, SystemClock
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import channel_credentials
from tests.integration.conftest import InprocLab, open_lab

pytestmark = pytest.mark.skipif(
    not (shutil.which("swtpm") and shutil.which("tpm2_createprimary")),
    reason="needs swtpm and tpm2-tools (Debian: swtpm swtpm-tools tpm2-tools; .ci/run installs them)",
)


@dataclass
class SoftTpm:
    tcti: str
    pid: int

    async def tool(self, *argv: str) -> None:
        """Run one tpm2-tools command against this TPM, as an operator would by hand."""
        proc = await asyncio.create_subprocess_exec(
            *argv, env={**os.environ, "TPM2TOOLS_TCTI": self.tcti}, stderr=asyncio.subprocess.PIPE
        )
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()

    async def stop(self) -> None:
        """SIGTERM, then wait for the exit on a pidfd (an event, not a poll)."""
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
            gone = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_reader(fd, gone.set)
            try:
                async with asyncio.timeout(10):
                    await gone.wait()
            finally:
                loop.remove_reader(fd)
        finally:
            os.close(fd)


def _free_port_pair() -> int:
    """A port P with P+1 free too (the swtpm TCTI dials P for commands and P+1 for control)."""
    while True:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port


@pytest.fixture
async def soft_tpm(tmp_path: Path) -> AsyncIterator[SoftTpm]:
    state = tmp_path / "swtpm"
    state.mkdir()
    for _ in range(5):  # a port taken between the check and swtpm's bind: another pair
        port = _free_port_pair()
        proc = await asyncio.create_subprocess_exec(
            "swtpm", "socket", "--tpm2", "--daemon", "--pid", f"file={state / 'pid'}",
            "--tpmstate", f"dir={state}",
            "--server", f"type=tcp,port={port},bindaddr=127.0.0.1",
            "--ctrl", f"type=tcp,port={port + 1},bindaddr=127.0.0.1",
            "--flags", "not-need-init,startup-clear",
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
        if proc.returncode == 0:
            break
    else:
        raise AssertionError(f"swtpm did not start: {err.decode()}")
    tpm = SoftTpm(f"swtpm:host=127.0.0.1,port={port}", int((state / "pid").read_text()))
    try:
        yield tpm
    finally:
        await tpm.stop()


def _certificate(key: ec.EllipticCurvePublicKey, ak: str) -> x509.Certificate:
    """A node certificate for the TPM's key naming its AK, signed by a CA key of the test's own."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node:n1")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")]))
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=24))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(u) for u in ("urn:bc:node:n1", "urn:bc:idgen:1", ak)]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


async def test_the_node_key_is_made_and_used_inside_the_tpm_and_no_file_holds_it(soft_tpm: SoftTpm) -> None:
    tpm = Tpm(soft_tpm.tcti)
    key = await TpmNodeKey.create(tpm)
    record = key.record.dump()
    assert b"PRIVATE" not in record and TpmRecord.load(record) == key.record
    public = await key.public_key()
    message = b"bc.v1/command-result\nc1\nCOMMAND_SUCCEEDED\n00"
    assert attest.verify(public, message, await key.sign(message)), "the TPM's signature checks as a file key's would"
    # The AK is derived again from the endorsement seed: the same on every call.
    assert ak_uri(await tpm.attestation_key()) == key.record.ak_uri == ak_uri(await tpm.attestation_key())
    await key.check(_certificate(public, key.record.ak_uri))


async def test_a_next_key_is_certified_by_the_ak_and_replaces_the_old_one(soft_tpm: SoftTpm) -> None:
    tpm = Tpm(soft_tpm.tcti)
    key = await TpmNodeKey.create(tpm)
    old = await key.public_key()
    ak = await tpm.attestation_key()
    nxt = await key.create_next()
    assert nxt.handle == HANDLES[1]
    certified = verify_certified_key(ak, nxt.tpm2b_public, nxt.attest, nxt.signature)
    assert certified.public_numbers() == nxt.public.key.public_numbers() != old.public_numbers()

    # What the server refuses: another AK, a changed attestation, the certification paired with another key.
    with pytest.raises(Unauthenticated, match="not signed by the attestation key"):
        verify_certified_key(
            ec.generate_private_key(ec.SECP256R1()).public_key(), nxt.tpm2b_public, nxt.attest, nxt.signature
        )
    with pytest.raises(Unauthenticated, match="not signed by the attestation key"):
        verify_certified_key(ak, nxt.tpm2b_public, nxt.attest[:-1] + bytes([nxt.attest[-1] ^ 1]), nxt.signature)
    other = await tpm.certify(HANDLES[0])
    with pytest.raises(Unauthenticated, match="certifies another key"):
        verify_certified_key(ak, other.tpm2b_public, nxt.attest, nxt.signature)

    await key.promote(nxt)
    assert key.record.handle == HANDLES[1]
    assert await tpm.read_public(HANDLES[0]) is None, "the old key left the TPM"
    assert (await key.public_key()).public_numbers() == certified.public_numbers()


async def test_a_cleared_tpm_has_lost_the_key_and_says_so(soft_tpm: SoftTpm) -> None:
    tpm = Tpm(soft_tpm.tcti)
    key = await TpmNodeKey.create(tpm)
    cert = _certificate(await key.public_key(), key.record.ak_uri)
    ak_before = ak_uri(await tpm.attestation_key())
    await soft_tpm.tool("tpm2_clear", "-c", "p")
    with pytest.raises(Unauthenticated) as ei:
        await key.check(cert)
    assert ei.value.message == CLEARED
    assert "was the TPM cleared?" in CLEARED and "bc join --reset --yes --attestor tpm" in CLEARED
    with pytest.raises(Unauthenticated, match="was the TPM cleared"):
        await key.sign(b"anything")
    # A clear replaces the owner seed, not the endorsement one: the AK is the same, only the key is gone.
    assert ak_uri(await tpm.attestation_key()) == ak_before


async def test_another_endorsement_seed_is_another_tpm_and_says_so(soft_tpm: SoftTpm) -> None:
    tpm = Tpm(soft_tpm.tcti)
    key = await TpmNodeKey.create(tpm)
    cert = _certificate(await key.public_key(), key.record.ak_uri)
    await soft_tpm.tool("tpm2_changeeps")
    with pytest.raises(Unauthenticated) as ei:
        await key.check(cert)
    assert ei.value.message == ANOTHER_AK
    assert ei.value.exit_code == 6 and not ei.value.retryable


async def test_an_unreachable_tpm_is_a_retryable_failure_in_one_sentence(soft_tpm: SoftTpm) -> None:
    tpm = Tpm(soft_tpm.tcti)
    key = await TpmNodeKey.create(tpm)
    await soft_tpm.stop()
    with pytest.raises(TpmUnavailable) as ei:
        await key.sign(b"anything")
    assert ei.value.retryable and ei.value.exit_code == 5
    assert ei.value.message.startswith(UNAVAILABLE + " (swtpm:host=127.0.0.1")
    assert "\n" not in ei.value.message


async def test_both_holders_answer_the_same_interface(soft_tpm: SoftTpm, tmp_path: Path) -> None:
    """The agent's code path is the same for a file key and a TPM key: `open_node_key` picks by node.key."""
    tpm_key = await TpmNodeKey.create(Tpm(soft_tpm.tcti))
    (tmp_path / "tpm.key").write_bytes(tpm_key.record.dump())
    file_key = ec.generate_private_key(ec.SECP256R1())
    keys.write_private_key(tmp_path / "file.key", file_key)
    holders: list[NodeKeyHolder] = [
        await open_node_key(tmp_path / "tpm.key", soft_tpm.tcti),
        await open_node_key(tmp_path / "file.key"),
    ]
    assert isinstance(holders[0], TpmNodeKey) and isinstance(holders[1], FileNodeKey)
    for holder in holders:
        public = await holder.public_key()
        assert attest.verify(public, b"m", await holder.sign(b"m"))
        await holder.check(_certificate(public, tpm_key.record.ak_uri))
        with pytest.raises(Unauthenticated, match="does not match the node certificate"):
            await holder.check(
                _certificate(ec.generate_private_key(ec.SECP256R1()).public_key(), tpm_key.record.ak_uri)
            )


# -- a TPM node against a real bc serve --------------------------------------------------------------


@pytest.fixture
async def past_lab(tmp_path: Path) -> AsyncIterator[tuple[InprocLab, LoopClock]]:
    """A lab whose clock starts two days back (as tests/integration/test_rejoin.py's): the node's first
    certificate has expired once the clock is stepped to the present, so it re-joins."""
    loop = asyncio.get_running_loop()
    clock = LoopClock(wall_offset=time.time() - loop.time() - 2 * 24 * 3600)
    async with open_lab(tmp_path, Seams(clock, os_seeded_random(), SystemSecrets())) as lab:
        yield lab, clock


async def _rejoin(lab: InprocLab, d: Path, req: join_pb2.RejoinRequest) -> join_pb2.RenewResponse:
    ident = Identity.load(d)
    leaf_key, leaf_cert = tokens.rejoin_client_credentials(ident.ca_fingerprint, ident.node_id, SystemClock())
    async with grpc.aio.secure_channel(
        lab.server.address, channel_credentials(ident.read(d, "ca"), leaf_key, leaf_cert)
    ) as ch:
        resp: join_pb2.RenewResponse = await join_pb2_grpc.JoinStub(ch).Rejoin(req, timeout=20)
    return resp


async def test_a_tpm_node_joins_naming_its_ak_and_renews_only_with_a_key_the_ak_certifies(
    soft_tpm: SoftTpm, past_lab: tuple[InprocLab, LoopClock]
) -> None:
    lab, clock = past_lab
    tpm = Tpm(soft_tpm.tcti)
    tok = await lab.admin.create_token("n1")
    d = lab.node_dir("n1")
    await join_node(lab.server.address, tok.token, d, attestor="tpm", tcti=soft_tpm.tcti)

    record_bytes = (d / "node.key").read_bytes()
    assert b"PRIVATE" not in record_bytes and (d / "node.key").stat().st_mode & 0o777 == 0o600
    key = TpmNodeKey(tpm, TpmRecord.load(record_bytes))
    cert = keys.load_cert_pem((d / "node.crt").read_bytes())
    ak = ak_uri(await tpm.attestation_key())
    assert ak_uri_of(cert) == ak == key.record.ak_uri
    assert spki(cert.public_key()) == spki(await key.public_key())  # type: ignore[arg-type]
    ev = await lab.wait_event("node.joined", lambda ev, data: ev.subject == "n1")
    assert json.loads(ev.data_json)["attestor"] == "tpm"

    clock.step(2 * 24 * 3600)  # the certificate expired a day ago
    cert_der = cert.public_bytes(serialization.Encoding.DER)

    async def request(
        next_key: ec.EllipticCurvePublicKey, sign_next: object, tpm_cert: object
    ) -> join_pb2.RejoinRequest:
        csr_der = await make_remote_csr(next_key, "n1", sign_next)  # type: ignore[arg-type]
        ts, nonce = round(time.time() * 1000), secrets.token_bytes(16)
        req = join_pb2.RejoinRequest(
            cert_der=cert_der, csr_der=csr_der, timestamp_ms=ts, nonce=nonce,
            proof=await key.sign(rejoin_proof_message(cert_der, csr_der, ts, nonce)),
        )  # fmt: skip
        if tpm_cert is not None:
            req.tpm.CopyFrom(tpm_cert)  # type: ignore[arg-type]
        return req

    # A next key outside the TPM (a file key) is refused: the certificate names an AK.
    file_key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await _rejoin(lab, d, await request(file_key.public_key(), lambda m: _async(attest.sign(file_key, m)), None))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "needs the next key certified by it" in (ei.value.details() or "")

    # A next key in the TPM, certified by its AK, gets a certificate naming the same AK.
    nxt = await key.create_next()
    certification = join_pb2.TpmCertification(
        ak_spki_der=spki(await tpm.attestation_key()), key_public=nxt.tpm2b_public, attest=nxt.attest,
        signature=nxt.signature,
    )  # fmt: skip
    resp = await _rejoin(lab, d, await request(nxt.public.key, lambda m: tpm.sign(nxt.handle, m), certification))
    renewed = keys.load_cert_pem(resp.cert_pem)
    assert spki(renewed.public_key()) == spki(nxt.public.key)  # type: ignore[arg-type]
    assert ak_uri_of(renewed) == ak
    reasons = [json.loads(e.data_json)["reason"] for e in await lab.admin.list_events(type_prefix="security.rejoin.")]
    assert reasons == ["rejoin:key-attestation-missing"]

    # Another endorsement seed gives another AK, whose certification the server refuses for this certificate.
    await soft_tpm.tool("tpm2_changeeps")
    other = await tpm.certify(nxt.handle)
    with pytest.raises(Unauthenticated, match="not the one the certificate names"):
        check_tpm_key(
            TpmCertification(spki(await tpm.attestation_key()), other.tpm2b_public, other.attest, other.signature),
            nxt.public.key,
            ak,
        )


async def _async(value: bytes) -> bytes:
    return value


SHORT_TTL_S = 20


@pytest.fixture
async def short_lab(tmp_path: Path) -> AsyncIterator[InprocLab]:
    """A lab on the host's clock whose node certificates last 20 s (`bc serve --node-cert-ttl 20`): the agent's
    session certificate and its node certificate are both renewed within the test."""
    async with open_lab(tmp_path, node_cert_ttl_s=SHORT_TTL_S) as lab:
        yield lab


async def test_bc_node_runs_a_tpm_identity_on_an_in_memory_session_key_and_renews_both_through_the_tpm(
    soft_tpm: SoftTpm, short_lab: InprocLab
) -> None:
    lab = short_lab
    tpm = Tpm(soft_tpm.tcti)
    d = lab.node_dir("n1")
    tok = await lab.admin.create_token("n1")
    await join_node(lab.server.address, tok.token, d, attestor="tpm", tcti=soft_tpm.tcti)
    first = keys.load_cert_pem((d / "node.crt").read_bytes())
    first_record = TpmRecord.load((d / "node.key").read_bytes())

    # The real agent, as `bc node --tcti …` runs it: production_parts finds the TPM record in node.key.
    agent = Agent(AgentOptions(data_dir=d, fake_hw="hgx-h100-8", heartbeat_interval_s=1.0, tcti=soft_tpm.tcti))
    lab.agents["n1"], lab.tasks["n1"] = agent, asyncio.create_task(agent.run(), name="agent-n1")
    issued = await lab.wait_event("node.session-cert.issued", lambda ev, data: ev.subject == "n1", timeout=30)
    assert json.loads(issued.data_json)["session_of"] == format(first.serial_number, "x")
    await lab.wait_connected("n1", after_seq=issued.seq, timeout=30)
    await lab.wait_observed("n1", 1, timeout=30)  # a converged session: the first spec observed
    for f in d.rglob("*"):
        if f.is_file():
            assert b"PRIVATE KEY" not in f.read_bytes(), f"{f} holds a private key"

    # The node certificate renews by proof, its next key made in the TPM at the other handle and certified by
    # the AK; the session then moves onto a session certificate of the new node certificate.
    renewed = await lab.wait_event("node.cert.renewed", lambda ev, data: ev.subject == "n1", timeout=60)
    new_serial = json.loads(renewed.data_json)["serial"]
    two = await lab.wait_event(
        "node.session-cert.issued", lambda ev, data: ev.subject == "n1" and data["session_of"] == new_serial, timeout=60
    )
    await lab.wait_connected("n1", after_seq=two.seq, timeout=30)
    record = TpmRecord.load((d / "node.key").read_bytes())
    assert record.handle != first_record.handle and record.ak_uri == first_record.ak_uri
    assert await tpm.read_public(first_record.handle) is None, "the old key left the TPM"
    now = keys.load_cert_pem((d / "node.crt").read_bytes())
    assert format(now.serial_number, "x") == new_serial and ak_uri_of(now) == first_record.ak_uri
    # bc doctor's tpm check, on the running node's TPM, passes.
    f = await asyncio.to_thread(check_tpm, await asyncio.to_thread(load_node_files, d), tpm)
    assert f is not None and f.status == "pass", f

    # Revoked: the session ends, the agent stops for good, and a new session certificate is refused.
    await lab.admin.revoke_node("n1", reason="retired")
    await asyncio.wait_for(lab.tasks.pop("n1"), 30)
    lab.agents.pop("n1")
    assert Identity.load(d).revoked
    keeper = SessionKeys(d, Identity.load(d), TpmNodeKey(tpm, record), SystemClock(), random.Random(1))
    with pytest.raises(Unauthenticated, match="was revoked, so it gets no session certificate"):
        await keeper.obtain_once()
    events = await lab.admin.list_events(type_prefix="security.session-cert.")
    assert [json.loads(e.data_json)["reason"] for e in events] == ["session-cert:revoked"]
    assert not await lab.admin.list_events(type_prefix="security.renew."), "every renewal by proof was taken"


async def test_after_a_tpm_clear_the_node_joins_again_with_the_tpm_and_the_old_identity_moves_aside(
    soft_tpm: SoftTpm, past_lab: tuple[InprocLab, LoopClock]
) -> None:
    lab, _ = past_lab
    tpm = Tpm(soft_tpm.tcti)
    d = lab.node_dir("n1")
    tok = await lab.admin.create_token("n1")
    await join_node(lab.server.address, tok.token, d, attestor="tpm", tcti=soft_tpm.tcti)
    (d / "journal.db").write_bytes(b"the journal of the first identity")
    old_record = (d / "node.key").read_bytes()
    await soft_tpm.tool("tpm2_clear", "-c", "p")
    with pytest.raises(Unauthenticated) as ei:
        await TpmNodeKey(tpm, TpmRecord.load(old_record)).check(keys.load_cert_pem((d / "node.crt").read_bytes()))
    assert ei.value.message == CLEARED

    # The recovery the sentence names: bc join --reset --yes --attestor tpm, with a new token.
    tok = await lab.admin.create_token("n1")
    r = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["join", "--server", lab.server.address, "--token", tok.token, "--data-dir", str(d), "--reset", "--yes",
         "--attestor", "tpm", "--tcti", soft_tpm.tcti],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "moved aside:" in r.output and "journal.db" in r.output
    aside = {p.name.split(".reset-")[0]: p for p in d.glob("*.reset-*")}
    assert aside["node.key"].read_bytes() == old_record, "the old identity is kept, renamed"
    assert aside["journal.db"].read_bytes() == b"the journal of the first identity"
    ident = Identity.load(d)
    assert ident.identity_generation == 2
    new = TpmNodeKey(tpm, TpmRecord.load((d / "node.key").read_bytes()))
    await new.check(keys.load_cert_pem((d / "node.crt").read_bytes()))  # the new key is the TPM's, with its AK


async def test_the_agents_rejoin_with_a_tpm_key_makes_the_next_key_in_the_tpm_certified_by_the_ak(
    soft_tpm: SoftTpm, past_lab: tuple[InprocLab, LoopClock]
) -> None:
    lab, clock = past_lab
    tpm = Tpm(soft_tpm.tcti)
    d = lab.node_dir("n1")
    tok = await lab.admin.create_token("n1")
    await join_node(lab.server.address, tok.token, d, attestor="tpm", tcti=soft_tpm.tcti)
    first = TpmRecord.load((d / "node.key").read_bytes())
    clock.step(2 * 24 * 3600)
    holder = TpmNodeKey(tpm, first)
    renewer = Renewer(d, Identity.load(d), SystemClock(), random.Random(1), key_holder=holder)
    cert = await renewer.rejoin_once()
    ev = await lab.wait_event("node.rejoined", lambda ev, data: ev.subject == "n1")
    assert json.loads(ev.data_json)["serial"] == format(cert.serial_number, "x")
    now = TpmRecord.load((d / "node.key").read_bytes())
    assert now.handle != first.handle and now.ak_uri == first.ak_uri == ak_uri_of(cert)
    assert await tpm.read_public(first.handle) is None, "the old key left the TPM"
    assert b"PRIVATE" not in (d / "node.key").read_bytes() and not list(d.glob("*.next"))
    await TpmNodeKey(tpm, TpmRecord.load((d / "node.key").read_bytes())).check(
        keys.load_cert_pem((d / "node.crt").read_bytes())
    )
    Identity.load(d)  # the pair on disk is a finished one


async def test_bc_doctor_reads_a_tpm_identity_from_its_record(
    soft_tpm: SoftTpm, past_lab: tuple[InprocLab, LoopClock]
) -> None:
    lab, _ = past_lab
    d = lab.node_dir("n1")
    tok = await lab.admin.create_token("n1")
    await join_node(lab.server.address, tok.token, d, attestor="tpm", tcti=soft_tpm.tcti)
    files = await asyncio.to_thread(load_node_files, d)
    f = check_identity(files)
    assert f.status == "pass" and f.message.endswith(f"(held by the TPM at handle 0x{HANDLES[0]:08x})")
    # The `tpm` check asks the TPM itself (asyncio.run inside: the CLI's doctor is synchronous).
    tpm = Tpm(soft_tpm.tcti)
    f = await asyncio.to_thread(check_tpm, files, tpm)
    assert f is not None and f.status == "pass", f
    assert await tpm.evict(HANDLES[0])  # as a TPM clear would leave it
    f = await asyncio.to_thread(check_tpm, files, tpm)
    assert f is not None and (f.status, f.message) == ("fail", CLEARED)
    other = TpmRecord(HANDLES[0], "00" * 91, "urn:bc:tpm-ak:00")
    (d / "node.key").write_bytes(other.dump())
    f = check_identity(await asyncio.to_thread(load_node_files, d))
    assert f.status == "fail" and f.message == "the TPM key node.key records is not the node certificate's key"
