"""`peer_identity` trusts the CA's signature, never what a certificate says about itself."""

from __future__ import annotations

import random

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bc.errors import Unauthenticated
from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import join_leaf_identity, make_csr, peer_identity
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import Clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


def _forged_node_cert(
    signer: ec.EllipticCurvePrivateKey, issuer: x509.Name, now: float, cn: str = "node:n1"
) -> x509.Certificate:
    """What a join-token holder could sign: a leaf that claims to be node n1 with the CA's issuer name."""
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(issuer)
        .public_key(keys.generate_key().public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(keys.utc(now - 60))
        .not_valid_after(keys.utc(now + 3600))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(u) for u in ("urn:bc:node:n1", "urn:bc:idgen:1")]
            ),
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )


def test_a_node_cert_signed_by_a_token_key_or_the_join_root_is_refused(ca: CertificateAuthority, clock: Clock) -> None:
    new = tokens.create_token(ca.fingerprint, 600, clock, RNG, SECRETS)
    token_key = tokens.derive_token_key(tokens.parse_token(new.token).secret)
    root = keys.load_cert_pem(new.root_cert_pem)
    join_root = tokens.join_root_cert(ca.fingerprint)
    join_key = tokens.join_root_key(ca.fingerprint)  # anyone who knows the fingerprint can sign with it
    for signer, issuer in (
        (token_key, ca.certificate.subject),
        (token_key, root.subject),
        (join_key, ca.certificate.subject),
        (join_key, join_root.subject),
    ):
        forged = _forged_node_cert(signer, issuer, clock.now())
        with pytest.raises(Unauthenticated, match="not issued by this cluster's CA"):
            peer_identity(forged, ca.certificate)


def test_a_join_leaf_is_not_a_peer_identity(ca: CertificateAuthority, clock: Clock) -> None:
    new = tokens.create_token(ca.fingerprint, 600, clock, RNG, SECRETS)
    _, leaf_pem = tokens.join_client_credentials(tokens.parse_token(new.token), clock)
    leaf = keys.load_cert_pem(leaf_pem)
    with pytest.raises(Unauthenticated):
        peer_identity(leaf, ca.certificate)

    ident = join_leaf_identity(leaf, tokens.join_root_cert(ca.fingerprint))
    assert (ident.kind, ident.name) == ("join", new.token_id)
    assert ident.not_after == clock.now() + tokens.JOIN_LEAF_LIFETIME_S

    other = CertificateAuthority.create(clock, RNG, SECRETS)
    with pytest.raises(Unauthenticated, match="not issued by this install's join root"):
        join_leaf_identity(leaf, tokens.join_root_cert(other.fingerprint))
    with pytest.raises(Unauthenticated, match="not issued by this install's join root"):
        join_leaf_identity(leaf, keys.load_cert_pem(new.root_cert_pem))  # the token's own key signs no leaf
    with pytest.raises(Unauthenticated):
        join_leaf_identity(leaf, ca.certificate)
    # A leaf under the join root that names no token (the root's key is public) is refused as such.
    forged = _forged_node_cert(
        tokens.join_root_key(ca.fingerprint), tokens.join_root_cert(ca.fingerprint).subject, clock.now()
    )
    with pytest.raises(Unauthenticated, match="names no join token"):
        join_leaf_identity(forged, tokens.join_root_cert(ca.fingerprint))


def test_a_node_cert_from_another_ca_is_refused(ca: CertificateAuthority, clock: Clock) -> None:
    other = CertificateAuthority.create(clock, RNG, SECRETS)
    cert = other.issue_node_cert(make_csr(keys.generate_key(), "n1"), "n1", "gpu", 1)
    with pytest.raises(Unauthenticated):
        peer_identity(cert, ca.certificate)


def test_validity_is_checked_when_a_time_is_given(ca: CertificateAuthority, clock: Clock) -> None:
    cert = ca.issue_node_cert(make_csr(keys.generate_key(), "n1"), "n1", "gpu", 1, ttl_s=3600)
    assert peer_identity(cert, ca.certificate, now=clock.now() + 3599).name == "n1"
    with pytest.raises(Unauthenticated, match="expired"):
        peer_identity(cert, ca.certificate, now=clock.now() + 3601)
    with pytest.raises(Unauthenticated, match="not valid yet"):
        peer_identity(cert, ca.certificate, now=clock.now() - 61)


def test_make_csr_is_signed_by_its_key() -> None:
    key = keys.generate_key()
    csr = make_csr(key, "n1")
    assert csr.is_signature_valid
    assert csr.public_key() == key.public_key()
    assert csr.subject.rfc4514_string() == "CN=node:n1"
