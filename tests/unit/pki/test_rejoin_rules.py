"""The re-join rule (`bc.pki.rejoin.decide`) over every case, and the proof's bytes.

Hypothesis draws what the store could know about a presented certificate and
the store's time; the properties are the table of the module docstring.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import CertificateRevoked, RejoinTooLate, Unauthenticated, UsageError
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.rejoin import (
    REJOIN_WINDOW_S,
    CertFacts,
    decide,
    refusal,
    rejoin_proof_message,
    sign_rejoin_proof,
    verify_rejoin_proof,
)
from bc.pki.renewal import sign_renew_proof

WINDOW_MS = REJOIN_WINDOW_S * 1000
NOT_AFTER_MS = 1_800_000_000_000

facts = st.builds(
    CertFacts,
    known=st.booleans(),
    revoked=st.booleans(),
    not_after_ms=st.just(NOT_AFTER_MS),
    current_generation=st.booleans(),
    latest=st.booleans(),
)
# Times around the two edges that matter: the expiry, and 7 days after it.
offsets = st.one_of(
    st.integers(-10 * WINDOW_MS, 10 * WINDOW_MS),
    st.integers(-2, 2),
    st.integers(WINDOW_MS - 2, WINDOW_MS + 2),
)


@given(facts, offsets)
def test_a_rejoin_is_allowed_exactly_for_the_latest_unrevoked_certificate_within_7_days_of_its_expiry(
    f: CertFacts, offset: int
) -> None:
    allowed = f.known and not f.revoked and f.current_generation and f.latest and 0 <= offset <= WINDOW_MS
    assert (decide(f, NOT_AFTER_MS + offset) == "rejoin") == allowed


@given(facts, offsets)
def test_each_refusal_names_its_case(f: CertFacts, offset: int) -> None:
    verdict = decide(f, NOT_AFTER_MS + offset)
    if not f.known:
        assert verdict == "unknown"
    elif f.revoked:
        assert verdict == "revoked", "a revoked certificate is refused as revoked, however long ago it expired"
    elif not f.current_generation:
        assert verdict == "old-identity"
    elif not f.latest:
        assert verdict == "not-latest"
    elif offset < 0:
        assert verdict == "not-expired"
    elif offset > WINDOW_MS:
        assert verdict == "too-late"


@given(facts, offsets, st.integers(0, 20 * WINDOW_MS))
def test_time_only_closes_the_window(f: CertFacts, offset: int, later: int) -> None:
    """Once refused as too late or for what the certificate is, a later time never lets it in."""
    before, after = decide(f, NOT_AFTER_MS + offset), decide(f, NOT_AFTER_MS + offset + later)
    if before not in ("rejoin", "not-expired"):
        assert after == before
    if before == "rejoin":
        assert after in ("rejoin", "too-late")


@given(facts, offsets)
def test_a_refusal_is_one_typed_sentence_with_its_exit_code(f: CertFacts, offset: int) -> None:
    verdict = decide(f, NOT_AFTER_MS + offset)
    if verdict == "rejoin":
        return
    err = refusal(verdict, "n1", "ab12", f.not_after_ms)
    assert "\n" not in err.message and err.message.count(". ") == 0
    expected = {
        "revoked": CertificateRevoked,
        "too-late": RejoinTooLate,
        "not-expired": UsageError,
    }.get(verdict, Unauthenticated)
    assert type(err) is expected
    if verdict in ("revoked", "too-late"):
        # The two cases an operator meets: a new token, said the same way, each with its own reason.
        assert err.exit_code == 6 and "bc join --reset --yes" in err.message
        assert ("revoked" in err.message) == (verdict == "revoked")
        assert ("more than 7 days ago" in err.message) == (verdict == "too-late")


def test_the_proof_binds_the_certificate_the_request_the_time_and_the_nonce(ca: CertificateAuthority) -> None:
    key = keys.generate_key()
    cert = ca.issue_node_cert(make_csr(key, "n1"), "n1", "node", 1, 3600)
    cert_der = cert.public_bytes(serialization.Encoding.DER)
    csr_der = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    nonce = bytes(range(16))
    proof = sign_rejoin_proof(key, cert_der, csr_der, 1000, nonce)
    verify_rejoin_proof(cert, cert_der, csr_der, 1000, nonce, proof)
    other_csr = make_csr(keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    for args in [
        (cert_der, other_csr, 1000, nonce),
        (cert_der, csr_der, 1001, nonce),
        (cert_der, csr_der, 1000, bytes(16)),
        (cert_der + b"x", csr_der, 1000, nonce),
    ]:
        try:
            verify_rejoin_proof(cert, *args, proof)
        except Unauthenticated:
            continue
        raise AssertionError(f"a proof verified for another request: {args[1:]!r}")
    try:
        verify_rejoin_proof(cert, cert_der, csr_der, 1000, b"short", proof)
    except UsageError as e:
        assert "16 bytes" in e.message
    else:
        raise AssertionError("a short nonce was accepted")
    assert rejoin_proof_message(cert_der, csr_der, 1000, nonce).startswith(b"bc.v1/rejoin\n1000\n")
    # A renewal proof by the same key is not a re-join proof.
    try:
        verify_rejoin_proof(cert, cert_der, csr_der, 1000, nonce, sign_renew_proof(key, csr_der, 1000))
    except Unauthenticated:
        pass
    else:
        raise AssertionError("a renewal proof passed as a re-join proof")
