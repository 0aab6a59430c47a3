from __future__ import annotations

import ipaddress
import random
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bc.errors import Unauthenticated, UsageError
from bc.pki import keys
from bc.pki.ca import CA_CERT_FILE, CA_KEY_FILE, CertificateAuthority
from bc.pki.identity import make_csr, peer_identity
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import SigningKeys
from bc.seams.clock import Clock, SystemClock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


def _cn(cert: x509.Certificate) -> str:
    value = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert isinstance(value, str)
    return value


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_create_then_load_gives_the_same_ca(tmp_path: Path, clock: Clock) -> None:
    ca, created = CertificateAuthority.load_or_create(tmp_path / "ca", clock, RNG, SECRETS)
    assert created
    again, created_again = CertificateAuthority.load_or_create(tmp_path / "ca", clock, RNG, SECRETS)
    assert not created_again
    assert again.fingerprint == ca.fingerprint
    assert again.ca_pem == ca.ca_pem
    assert stat.S_IMODE((tmp_path / "ca" / CA_KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca").stat().st_mode) == 0o700


def test_ca_certificate_shape(ca: CertificateAuthority, clock: Clock) -> None:
    cert = ca.certificate
    assert _cn(cert).startswith("bc CA ")
    assert cert.subject == cert.issuer
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    years = (cert.not_valid_after_utc.timestamp() - clock.now()) / (365 * 24 * 3600)
    assert 9.9 < years < 10.1
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)


def test_half_a_ca_directory_is_refused_not_replaced(tmp_path: Path, clock: Clock) -> None:
    CertificateAuthority.load_or_create(tmp_path, clock, RNG, SECRETS)
    (tmp_path / CA_CERT_FILE).unlink()
    with pytest.raises(UsageError, match="move the directory aside"):
        CertificateAuthority.load_or_create(tmp_path, clock, RNG, SECRETS)
    assert not (tmp_path / CA_CERT_FILE).exists()


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path: Path, clock: Clock) -> None:
    CertificateAuthority.load_or_create(tmp_path, clock, RNG, SECRETS)
    keys.write_private_key(tmp_path / CA_KEY_FILE, keys.generate_key())
    with pytest.raises(UsageError, match="does not match"):
        CertificateAuthority.load_or_create(tmp_path, clock, RNG, SECRETS)


def test_node_cert_names_the_node_whatever_the_csr_asks(ca: CertificateAuthority, clock: Clock) -> None:
    key = keys.generate_key()
    csr = make_csr(key, "evil")  # the request claims another name; the CA ignores it
    cert = ca.issue_node_cert(csr, "n1", "gpu", 3)
    assert _cn(cert) == "node:n1"
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [
        "urn:bc:node:n1",
        "urn:bc:role:gpu",
        "urn:bc:idgen:3",
    ]
    assert _eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.public_key() == key.public_key()
    assert cert.not_valid_before_utc.timestamp() == clock.now() - 60
    assert cert.not_valid_after_utc.timestamp() == clock.now() + 24 * 3600

    ident = peer_identity(cert, ca.certificate)
    assert (ident.kind, ident.name, ident.role, ident.identity_generation) == ("node", "n1", "gpu", 3)
    assert ident.serial == format(cert.serial_number, "x")
    assert ident.not_after == clock.now() + 24 * 3600


def test_node_cert_lifetime_is_capped_at_a_day(ca: CertificateAuthority, clock: Clock) -> None:
    csr = make_csr(keys.generate_key(), "n1")
    short = ca.issue_node_cert(csr, "n1", "", 0, ttl_s=3600)
    assert short.not_valid_after_utc.timestamp() == clock.now() + 3600
    long = ca.issue_node_cert(csr, "n1", "", 0, ttl_s=7 * 24 * 3600)
    assert long.not_valid_after_utc.timestamp() == clock.now() + 24 * 3600
    ident = peer_identity(long, ca.certificate)
    assert (ident.role, ident.identity_generation) == ("", 0)


def test_node_cert_refuses_bad_requests(ca: CertificateAuthority) -> None:
    csr = make_csr(keys.generate_key(), "n1")
    with pytest.raises(UsageError):
        ca.issue_node_cert(csr, "n1 with spaces", "gpu", 1)
    with pytest.raises(UsageError):
        ca.issue_node_cert(csr, "n1", "gpu", -1)
    p384 = ec.generate_private_key(ec.SECP384R1())
    csr384 = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node:n1")]))
        .sign(p384, hashes.SHA256())
    )
    with pytest.raises(Unauthenticated, match="P-256"):
        ca.issue_node_cert(csr384, "n1", "gpu", 1)


def test_operator_and_server_certs(ca: CertificateAuthority) -> None:
    op = ca.issue_operator_cert("alice", keys.generate_key())
    assert _cn(op) == "operator:alice"
    assert _eku(op) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    ident = peer_identity(op, ca.certificate)
    assert (ident.kind, ident.name, ident.role, ident.identity_generation) == ("operator", "alice", "", 0)

    server = ca.issue_server_cert(["10.0.0.5", "ctl.example"], keys.generate_key().public_key())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    assert set(san.get_values_for_type(x509.DNSName)) == {"ctl.example", "localhost"}
    assert _eku(server) == [ExtendedKeyUsageOID.SERVER_AUTH]
    with pytest.raises(Unauthenticated, match="client authentication"):
        peer_identity(server, ca.certificate)


def _openssl_verify(ca_file: Path, cert_file: Path, purpose: str | None) -> subprocess.CompletedProcess[str]:
    argv = ["openssl", "verify", *(["-purpose", purpose] if purpose else []), "-CAfile", str(ca_file), str(cert_file)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("which", ["node", "server", "operator", "worker"])
def test_openssl_verifies_every_certificate_we_issue(which: str, ca: CertificateAuthority, tmp_path: Path) -> None:
    """The real `openssl verify`, against the CA file (the worker key: against its command-signing root)."""
    assert shutil.which("openssl"), "the openssl command is part of the test environment"
    key = keys.generate_key()
    purpose: str | None
    if which == "node":
        cert, purpose, anchor = ca.issue_node_cert(make_csr(key, "n1"), "n1", "node", 1), "sslclient", ca.ca_pem
    elif which == "server":
        cert, purpose, anchor = ca.issue_server_cert(["10.0.0.5", "bc.example"], key), "sslserver", ca.ca_pem
    elif which == "operator":
        cert, purpose, anchor = ca.issue_operator_cert("alice", key), "sslclient", ca.ca_pem
    else:
        signing = SigningKeys.create(tmp_path / "pki", SystemClock(), RNG, SECRETS)
        cert, purpose, anchor = signing.worker.cert, None, signing.root_pem
    (tmp_path / "anchor.pem").write_bytes(anchor)
    (tmp_path / "leaf.pem").write_bytes(keys.cert_to_pem(cert))
    ok = _openssl_verify(tmp_path / "anchor.pem", tmp_path / "leaf.pem", purpose)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (tmp_path / "other.pem").write_bytes(CertificateAuthority.create(SystemClock(), RNG, SECRETS).ca_pem)
    assert _openssl_verify(tmp_path / "other.pem", tmp_path / "leaf.pem", purpose).returncode != 0


def test_openssl_verifies_a_node_cert(ca: CertificateAuthority, tmp_path: Path) -> None:
    cert = ca.issue_node_cert(make_csr(keys.generate_key(), "n1"), "n1", "gpu", 1)
    (tmp_path / "ca.pem").write_bytes(ca.ca_pem)
    (tmp_path / "node.pem").write_bytes(keys.cert_to_pem(cert))
    (tmp_path / "other.pem").write_bytes(CertificateAuthority.create(SystemClock(), RNG, SECRETS).ca_pem)
    ok = subprocess.run(
        [
            "openssl",
            "verify",
            "-purpose",
            "sslclient",
            "-CAfile",
            str(tmp_path / "ca.pem"),
            str(tmp_path / "node.pem"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "other.pem"), str(tmp_path / "node.pem")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode != 0


def test_a_ramdisk_certificate_lasts_at_most_two_hours(ca: CertificateAuthority) -> None:
    def life(role: str) -> float:
        cert = ca.issue_node_cert(make_csr(keys.generate_key(), "r1"), "r1", role, 1, 24 * 3600)
        return (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds()

    assert life("ramdisk") <= 2 * 3600 + 60  # the window starts 60 s back
    assert life("node") > 23 * 3600
