"""The session-certificate rule (`bc.pki.session_cert.decide`) over every case, its lifetime, and the proof's bytes.

Hypothesis draws what the store could know about the certificate a request presents, the request's
timestamp and the store's time; the properties are the table of the module docstring.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import CertificateRevoked, Conflict, Unauthenticated, UsageError
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr, peer_identity
from bc.pki.rejoin import sign_rejoin_proof
from bc.pki.renewal import (
    renew_by_proof_message,
    sign_renew_proof,
    verify_renew_by_proof,
    verify_renew_proof,
)
from bc.pki.session_cert import (
    SESSION_MAX_TTL_S,
    SESSION_SKEW_MS,
    CertFacts,
    decide,
    refusal,
    session_not_after_ms,
    session_of,
    session_proof_message,
    sign_session_proof,
    verify_session_proof,
)
from bc.pki.tpm_attest import ak_uri_of

NOT_AFTER_MS = 1_800_000_000_000
DAY_MS = 24 * 3600 * 1000

facts = st.builds(
    CertFacts,
    known=st.booleans(),
    session=st.booleans(),
    attested=st.booleans(),
    revoked=st.booleans(),
    not_after_ms=st.just(NOT_AFTER_MS),
    current_generation=st.booleans(),
    latest=st.booleans(),
)
# The store's time around the expiry, and the request's timestamp around the edges of the 5 minutes.
now_offsets = st.one_of(st.integers(-2 * DAY_MS, 2 * DAY_MS), st.integers(-2, 2))
skews = st.one_of(
    st.integers(-3 * SESSION_SKEW_MS, 3 * SESSION_SKEW_MS),
    st.integers(SESSION_SKEW_MS - 2, SESSION_SKEW_MS + 2),
    st.integers(-SESSION_SKEW_MS - 2, -SESSION_SKEW_MS + 2),
)


@given(facts, now_offsets, skews)
def test_a_session_certificate_is_issued_exactly_for_the_latest_live_tpm_certificate_and_a_timely_request(
    f: CertFacts, now_offset: int, skew: int
) -> None:
    now = NOT_AFTER_MS + now_offset
    allowed = (
        f.known
        and not f.session
        and f.attested
        and not f.revoked
        and f.current_generation
        and f.latest
        and now < f.not_after_ms
        and abs(skew) <= SESSION_SKEW_MS
    )
    assert (decide(f, now + skew, now) == "issue") == allowed


@given(facts, now_offsets, skews)
def test_each_refusal_names_the_first_case_of_the_table_that_applies(f: CertFacts, now_offset: int, skew: int) -> None:
    now = NOT_AFTER_MS + now_offset
    verdict = decide(f, now + skew, now)
    cases = [
        (not f.known, "unknown"),
        (f.session, "session-certificate"),
        (not f.attested, "not-tpm"),
        (f.revoked, "revoked"),
        (not f.current_generation, "old-identity"),
        (not f.latest, "not-latest"),
        (now >= f.not_after_ms, "expired"),
        (abs(skew) > SESSION_SKEW_MS, "stale-timestamp"),
        (True, "issue"),
    ]
    assert verdict == next(v for applies, v in cases if applies)


@given(facts, now_offsets, st.integers(0, 3 * DAY_MS))
def test_time_never_lets_a_refused_certificate_in(f: CertFacts, now_offset: int, later: int) -> None:
    """With a timely request each time, a certificate refused at one time is refused at every later time."""
    now = NOT_AFTER_MS + now_offset
    if decide(f, now, now) != "issue":
        assert decide(f, now + later, now + later) != "issue"


@given(now_offsets, st.integers(0, 40 * DAY_MS))
def test_a_session_certificate_lasts_24_h_at_most_and_never_past_the_node_certificate(
    now_offset: int, left_ms: int
) -> None:
    now = NOT_AFTER_MS - left_ms + now_offset % 1000
    end = session_not_after_ms(NOT_AFTER_MS, now)
    assert end <= NOT_AFTER_MS and end - now <= SESSION_MAX_TTL_S * 1000
    assert end == NOT_AFTER_MS or end - now == SESSION_MAX_TTL_S * 1000, "the lesser of the two, exactly"


@given(facts, now_offsets, skews)
def test_a_refusal_is_one_typed_sentence_final_or_retry_as_the_table_says(
    f: CertFacts, now_offset: int, skew: int
) -> None:
    now = NOT_AFTER_MS + now_offset
    verdict = decide(f, now + skew, now)
    if verdict == "issue":
        return
    err = refusal(verdict, "n1", "ab12", f.not_after_ms, skew)
    assert "\n" not in err.message and ". " not in err.message
    retry = verdict in ("not-latest", "expired", "stale-timestamp")
    assert isinstance(err, Conflict) == retry, "the node retries these, and takes the others as final"
    assert isinstance(err, Unauthenticated) != retry
    if verdict == "revoked":
        assert type(err) is CertificateRevoked and err.exit_code == 6 and "bc join --reset --yes" in err.message
    if verdict == "stale-timestamp":
        assert f"{skew / 1000:+.0f} s" in err.message and "check the node's clock" in err.message


def test_the_proof_binds_the_node_the_certificate_the_request_the_time_and_the_nonce(
    ca: CertificateAuthority,
) -> None:
    key = keys.generate_key()
    cert = ca.issue_node_cert(make_csr(key, "n1"), "n1", "node", 1, 3600)
    serial = format(cert.serial_number, "x")
    cert_der = cert.public_bytes(serialization.Encoding.DER)
    csr_der = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    nonce = bytes(range(16))
    proof = sign_session_proof(key, "n1", serial, cert_der, csr_der, 1000, nonce)
    verify_session_proof(cert, "n1", cert_der, csr_der, 1000, nonce, proof)
    assert session_proof_message("n1", serial, cert_der, csr_der, 1000, nonce).startswith(
        b"bc.v1/session-cert\nn1\n" + serial.encode() + b"\n1000\n" + nonce
    )
    other_csr = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    for node, args in [
        ("n2", (cert_der, csr_der, 1000, nonce)),
        ("n1", (cert_der, other_csr, 1000, nonce)),
        ("n1", (cert_der, csr_der, 1001, nonce)),
        ("n1", (cert_der, csr_der, 1000, bytes(16))),
        ("n1", (cert_der + b"x", csr_der, 1000, nonce)),
    ]:
        try:
            verify_session_proof(cert, node, *args, proof)
        except Unauthenticated:
            continue
        raise AssertionError(f"a proof verified for another request: {node} {args[1:]!r}")
    try:
        verify_session_proof(cert, "n1", cert_der, csr_der, 1000, b"short", proof)
    except UsageError as e:
        assert "16 bytes" in e.message
    else:
        raise AssertionError("a short nonce was accepted")
    # A renewal's or a re-join's proof by the same key is not a session certificate's, nor the other way round.
    for foreign in (sign_renew_proof(key, csr_der, 1000), sign_rejoin_proof(key, cert_der, csr_der, 1000, nonce)):
        try:
            verify_session_proof(cert, "n1", cert_der, csr_der, 1000, nonce, foreign)
        except Unauthenticated:
            continue
        raise AssertionError("another purpose's proof passed as a session certificate's")
    try:
        verify_renew_by_proof(cert, cert_der, csr_der, 1000, nonce, proof)
    except Unauthenticated:
        pass
    else:
        raise AssertionError("a session certificate's proof passed as a renewal's")


def test_a_renewal_by_proof_binds_the_certificate_and_is_not_a_renewal_over_tls(ca: CertificateAuthority) -> None:
    key = keys.generate_key()
    cert = ca.issue_node_cert(make_csr(key, "n1"), "n1", "node", 1, 3600)
    cert_der = cert.public_bytes(serialization.Encoding.DER)
    csr_der = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    nonce = bytes(16)
    proof = key.sign(renew_by_proof_message(cert_der, csr_der, 1000, nonce), ec.ECDSA(hashes.SHA256()))
    verify_renew_by_proof(cert, cert_der, csr_der, 1000, nonce, proof)
    for args in [(cert_der + b"x", csr_der, 1000, nonce), (cert_der, csr_der, 1000, bytes(range(16)))]:
        try:
            verify_renew_by_proof(cert, *args, proof)
        except Unauthenticated:
            continue
        raise AssertionError("a renewal by proof verified for another request")
    try:
        verify_renew_proof(cert, csr_der, 1000, proof)
    except Unauthenticated:
        pass
    else:
        raise AssertionError("a renewal by proof passed as a renewal over TLS")


def test_a_session_certificate_names_the_node_and_its_node_certificate_and_openssl_verifies_it(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    node_cert = ca.issue_node_cert(
        make_csr(keys.generate_key(), "n1"), "n1", "node", 3, 3600, ak_uri="urn:bc:tpm-ak:" + "ab" * 32
    )
    serial = format(node_cert.serial_number, "x")
    end = node_cert.not_valid_after_utc.timestamp() - 600
    session = ca.issue_node_cert(
        make_csr(keys.generate_key(), "n1"), "n1", "node", 3, SESSION_MAX_TTL_S, session_of=serial, not_after=end
    )
    assert session_of(session) == serial and session_of(node_cert) is None
    assert ak_uri_of(session) is None, "the session key is not the TPM's: the certificate names no AK"
    peer = peer_identity(session, ca.certificate)
    assert (peer.kind, peer.name, peer.role, peer.identity_generation) == ("node", "n1", "node", 3)
    assert session.not_valid_after_utc.timestamp() <= end
    (tmp_path / "ca.pem").write_bytes(ca.ca_pem)
    (tmp_path / "s.pem").write_bytes(keys.cert_to_pem(session))
    r = subprocess.run(
        ["openssl", "verify", "-purpose", "sslclient", "-CAfile", tmp_path / "ca.pem", tmp_path / "s.pem"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
