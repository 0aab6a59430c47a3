"""Credential activation on the first TPM join: bc serve checks the attestation key (AK) against the TPM's
endorsement key (EK) certificate, with a real (software) TPM manufactured by swtpm with an EK certificate from its
own local CA, over SQLite and PostgreSQL.

With that CA listed beside bc serve's CA (`pki/tpm-ek-roots.pem`) the TPM joins after activating the credential
the server sealed to its EK for its AK's name; an EK certificate from a CA the server does not list is refused;
a software "AK" presented with the TPM's own EK certificate gets a challenge the TPM cannot open, and a guessed
secret is refused, with the token still unused after every refusal.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import secrets
import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from agent.join import _join_at, join_node
from agent.tpm import Tpm
from bc.errors import BcError, Unauthenticated
from bc.pki import keys, tokens
from bc.pki.discovery import fetch_pinned_ca
from bc.pki.identity import make_csr
from bc.pki.tpm_attest import ak_uri, ak_uri_of
from bc.pki.tpm_ek import EK_ROOTS_FILE
from bc.protocol.pb import join_pb2
from bc.seams.clock import SystemClock
from bc.wire.tls import channel_credentials
from tests.integration.conftest import InprocLab, open_lab
from tests.soft_ak import certify, tpm2b_public
from tests.swtpm import EkCa, Swtpm, manufacture, start

pytestmark = pytest.mark.skipif(
    not (shutil.which("swtpm_setup") and shutil.which("tpm2_createek")),
    reason="needs swtpm, swtpm-tools and tpm2-tools (Debian: swtpm swtpm-tools tpm2-tools; .ci/run installs them)",
)

AK_ATTRS = 0x00000002 | 0x00000010 | 0x00000020 | 0x00000040 | 0x00000400 | 0x00010000 | 0x00040000


@dataclass
class EkTpm:
    swtpm: Swtpm
    ca: EkCa


@pytest.fixture
async def ek_tpm(tmp_path: Path) -> AsyncIterator[EkTpm]:
    ca = await manufacture(tmp_path / "tpm", tmp_path / "tpm-ca")
    tpm = await start(tmp_path / "tpm")
    try:
        yield EkTpm(tpm, ca)
    finally:
        await tpm.stop()


def _other_ca() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another TPM maker")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM)


@contextlib.asynccontextmanager
async def roots_lab(tmp_path: Path, store_url: str, roots_pem: bytes) -> AsyncIterator[InprocLab]:
    """A lab whose bc serve lists these EK CAs beside its CA."""
    pki = tmp_path / "server" / "pki"
    pki.mkdir(parents=True)
    (pki / EK_ROOTS_FILE).write_bytes(roots_pem)
    async with open_lab(tmp_path, store=store_url) as lab:
        yield lab


@pytest.fixture
async def ek_lab(tmp_path: Path, store_url: str, ek_tpm: EkTpm) -> AsyncIterator[InprocLab]:
    async with roots_lab(tmp_path, store_url, ek_tpm.ca.pem()) as lab:
        yield lab


async def test_a_tpm_whose_ek_certificate_chains_to_the_roots_joins_once_it_activates_the_credential(
    ek_tpm: EkTpm, ek_lab: InprocLab
) -> None:
    tok = await ek_lab.admin.create_token("n1")
    d = ek_lab.node_dir("n1")
    await join_node(ek_lab.server.address, tok.token, d, attestor="tpm", tcti=ek_tpm.swtpm.tcti)
    cert = keys.load_cert_pem((d / "node.crt").read_bytes())
    assert ak_uri_of(cert) == ak_uri(await Tpm(ek_tpm.swtpm.tcti).attestation_key())
    ev = await ek_lab.wait_event("node.joined", lambda ev, data: ev.subject == "n1")
    assert json.loads(ev.data_json)["attestor"] == "tpm"
    assert json.loads(ev.data_json)["endorsement"] == "activated"


async def test_an_ek_certificate_from_a_ca_the_server_does_not_list_is_refused(
    ek_tpm: EkTpm, tmp_path: Path, store_url: str
) -> None:
    async with roots_lab(tmp_path, store_url, _other_ca()) as lab:
        tok = await lab.admin.create_token("n1")
        d = lab.node_dir("n1")
        with pytest.raises(Unauthenticated, match=r"does not chain to an EK CA this server trusts: no certificate in"):
            await join_node(lab.server.address, tok.token, d, attestor="tpm", tcti=ek_tpm.swtpm.tcti)
        assert not (d / "node.crt").exists()


async def test_a_software_ak_with_the_tpms_ek_certificate_cannot_activate_and_a_guess_is_refused(
    ek_tpm: EkTpm, ek_lab: InprocLab
) -> None:
    tok = await ek_lab.admin.create_token("n1")
    parsed = tokens.parse_token(tok.token)
    tpm = Tpm(ek_tpm.swtpm.tcti)
    ek_der = await tpm.ek_certificate()
    assert ek_der is not None and isinstance(x509.load_der_x509_certificate(ek_der).public_key(), rsa.RSAPublicKey)

    # A token holder's forgery: a node key and an "AK" in software, the AK's public area built by hand, and this
    # TPM's genuine EK certificate beside them.
    ak, node_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    csr_der = make_csr(node_key, "pending").public_bytes(serialization.Encoding.DER)
    cert = certify(ak, node_key.public_key())
    req = join_pb2.JoinRequest(
        csr_der=csr_der, hostname=socket.gethostname(), token_id=parsed.token_id,
        token_proof=tokens.join_proof(parsed.secret, parsed.token_id, csr_der),
        tpm=join_pb2.TpmCertification(
            ak_spki_der=cert.ak_spki_der, key_public=cert.key_public, attest=cert.attest, signature=cert.signature
        ),
        ek_cert_der=ek_der, ak_public=tpm2b_public(ak.public_key(), AK_ATTRS),
    )  # fmt: skip
    host, port = ek_lab.server.address.rsplit(":", 1)
    ca_pem = fetch_pinned_ca(host, int(port), parsed.ca_pin)
    creds = channel_credentials(ca_pem, *tokens.join_client_credentials(parsed, SystemClock()))

    async def join(r: join_pb2.JoinRequest) -> join_pb2.JoinResponse:
        resp = await _join_at(ek_lab.server.address, creds, r, [])
        assert resp is not None
        return resp

    # Without the EK certificate: refused, saying so.
    bare = join_pb2.JoinRequest()
    bare.CopyFrom(req)
    bare.ClearField("ek_cert_der")
    with pytest.raises(Unauthenticated, match="against its endorsement key certificate, and the join sent none"):
        await join(bare)

    # With it: a challenge, which the TPM cannot open for an AK that is not its own.
    challenge = (await join(req)).challenge
    assert challenge.credential and challenge.secret and challenge.ticket
    with pytest.raises(BcError, match="the TPM refused tpm2_activatecredential"):
        await tpm.activate_credential(challenge.credential, challenge.secret)

    # A guessed secret, a ticket whose expiry was moved, and another AK's public area are refused.
    guess = join_pb2.JoinRequest()
    guess.CopyFrom(req)
    guess.activation.CopyFrom(join_pb2.TpmActivation(secret=secrets.token_bytes(32), ticket=challenge.ticket))
    with pytest.raises(Unauthenticated, match=r"^the TPM did not recover the activation secret: its attestation key"):
        await join(guess)
    guess.activation.ticket = bytes(8 * [0xFF]) + challenge.ticket[8:]
    with pytest.raises(Unauthenticated, match=r"^the TPM activation's ticket is not this server's for this join"):
        await join(guess)
    guess.activation.ticket = challenge.ticket
    guess.ak_public = tpm2b_public(ec.generate_private_key(ec.SECP256R1()).public_key(), AK_ATTRS)
    with pytest.raises(Unauthenticated, match=r"^the attestation key's public area is not the key that certified"):
        await join(guess)

    # Nothing was consumed: the TPM itself joins with the same token.
    d = ek_lab.node_dir("n1")
    await join_node(ek_lab.server.address, tok.token, d, attestor="tpm", tcti=ek_tpm.swtpm.tcti)
    assert ak_uri_of(keys.load_cert_pem((d / "node.crt").read_bytes())) == ak_uri(await tpm.attestation_key())
