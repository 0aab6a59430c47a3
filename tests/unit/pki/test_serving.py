"""A keyless gateway's serving certificate: the hosts it asks for, when it asks again, what the CA issues."""

from __future__ import annotations

import random

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from bc.errors import Unauthenticated, UsageError
from bc.pki import keys, serving
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import peer_identity
from bc.pki.secrets_source import SeededSecrets
from bc.testing import virtual_clock

NOW = 1_800_000_000.0
DAY = 24 * 3600.0


def _ca(now: float = NOW) -> CertificateAuthority:
    return CertificateAuthority.create(virtual_clock(now), random.Random(1), SeededSecrets(1))


def test_the_hosts_are_the_listen_host_and_the_advertised_names_without_wildcards_or_ports() -> None:
    assert serving.gateway_hosts("0.0.0.0", ["gw-a.example", "10.0.0.5:7443", "gw-a.example"]) == [
        "gw-a.example",
        "10.0.0.5",
    ]
    assert serving.gateway_hosts("127.0.0.1", []) == ["127.0.0.1"]
    assert serving.gateway_hosts("::", ["[fd00::1]"]) == ["fd00::1"]
    with pytest.raises(UsageError, match="at most 32 names"):
        serving.gateway_hosts("0.0.0.0", [f"h{i}" for i in range(40)])


def test_hosts_round_trip_and_a_bad_stored_list_is_refused() -> None:
    assert serving.decode_hosts(serving.encode_hosts(["a", "b"])) == ["a", "b"]
    with pytest.raises(UsageError):
        serving.decode_hosts('{"a": 1}')


def test_renewal_is_due_at_sixty_percent_of_the_life() -> None:
    assert serving.renew_at(0.0, 100.0) == 60.0
    assert serving.renew_at(NOW, NOW + serving.SERVING_CERT_TTL_S) == NOW + 18 * DAY


def test_when_to_ask_again() -> None:
    key = keys.generate_key()
    ca = _ca()
    cert = ca.issue_gateway_cert(serving.make_csr(key, "gw-a"), "gw-a", ["gw-a.example"], serving.SERVING_CERT_TTL_S)
    pub = key.public_key()
    start = cert.not_valid_before_utc.timestamp()
    assert serving.needs_request(None, pub, ["gw-a.example"], [], NOW)  # nothing yet
    assert not serving.needs_request(cert, pub, ["gw-a.example"], ["gw-a.example"], NOW + DAY)
    due = serving.renew_at(start, cert.not_valid_after_utc.timestamp())
    assert not serving.needs_request(cert, pub, ["gw-a.example"], ["gw-a.example"], due - 1)
    assert serving.needs_request(cert, pub, ["gw-a.example"], ["gw-a.example"], due)
    assert serving.needs_request(cert, pub, ["gw-b.example"], ["gw-a.example"], NOW)  # other hosts
    assert serving.needs_request(cert, keys.generate_key().public_key(), ["gw-a.example"], ["gw-a.example"], NOW)
    assert serving.usable(cert, pub, NOW) and not serving.usable(cert, pub, NOW + 31 * DAY)


def test_the_ca_issues_a_gateway_certificate_for_serving_and_calling_the_api() -> None:
    ca = _ca()
    key = keys.generate_key()
    cert = ca.issue_gateway_cert(serving.make_csr(key, "gw-a"), "gw-a", ["gw-a.example", "10.0.0.5"], 30 * DAY)
    assert cert.not_valid_after_utc.timestamp() == NOW + 30 * DAY
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gw-a.example" in san.get_values_for_type(x509.DNSName)
    peer = peer_identity(cert, ca.certificate)
    assert (peer.kind, peer.name) == ("gateway", "gw-a")


def test_a_request_for_a_key_that_is_not_p256_or_a_bad_name_is_refused() -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    ca = _ca()
    p384 = ec.generate_private_key(ec.SECP384R1())
    other = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(p384, hashes.SHA256())
    with pytest.raises(Unauthenticated, match="P-256"):
        ca.issue_gateway_cert(other, "gw-a", [], 30 * DAY)
    csr = serving.make_csr(keys.generate_key(), "gw-a")
    with pytest.raises(UsageError, match="gateway id"):
        ca.issue_gateway_cert(csr, "gw a/../", [], 30 * DAY)
