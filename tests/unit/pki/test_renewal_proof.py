"""The renewal's proof of possession: made by the current key, for this CSR, at about this time."""

from __future__ import annotations

import hashlib
import random

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import given, settings
from hypothesis import strategies as st

from bc.errors import Unauthenticated
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.renewal import (
    PROOF_SKEW_MS,
    check_proof_timestamp,
    renew_proof_message,
    sign_renew_proof,
    verify_renew_proof,
)
from bc.pki.secrets_source import SystemSecrets

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

NOW_MS = 1_800_000_000_000
# Generated once: key generation and signing are slow enough to matter under Hypothesis.
KEY = keys.generate_key()
OTHER_KEY = keys.generate_key()


def csr_der(key: keys.PrivateKey | None = None) -> bytes:
    return make_csr(key or keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)


def test_the_message_is_domain_separated_and_binds_time_and_csr() -> None:
    der = csr_der()
    msg = renew_proof_message(der, 1234)
    assert msg == b"bc.v1/renew\n1234\n" + hashlib.sha256(der).digest()
    assert renew_proof_message(der, 1235) != msg
    assert renew_proof_message(der + b"\x00", 1234) != msg


def test_a_proof_by_the_current_key_verifies(ca: CertificateAuthority) -> None:
    cert = ca.issue_node_cert(make_csr(KEY, "n1"), "n1", "node", 1, 3600)
    der = csr_der()
    verify_renew_proof(cert, der, NOW_MS, sign_renew_proof(KEY, der, NOW_MS), now_ms=NOW_MS)


def test_a_proof_by_another_key_fails(ca: CertificateAuthority) -> None:
    cert = ca.issue_node_cert(make_csr(KEY, "n1"), "n1", "node", 1, 3600)
    der = csr_der()
    with pytest.raises(Unauthenticated, match="not made by the current certificate's key"):
        verify_renew_proof(cert, der, NOW_MS, sign_renew_proof(OTHER_KEY, der, NOW_MS), now_ms=NOW_MS)


def test_a_proof_for_another_csr_fails(ca: CertificateAuthority) -> None:
    cert = ca.issue_node_cert(make_csr(KEY, "n1"), "n1", "node", 1, 3600)
    signed_for, sent = csr_der(), csr_der()
    with pytest.raises(Unauthenticated, match="not made by"):
        verify_renew_proof(cert, sent, NOW_MS, sign_renew_proof(KEY, signed_for, NOW_MS), now_ms=NOW_MS)


def test_a_proof_for_another_timestamp_fails(ca: CertificateAuthority) -> None:
    cert = ca.issue_node_cert(make_csr(KEY, "n1"), "n1", "node", 1, 3600)
    der = csr_der()
    with pytest.raises(Unauthenticated, match="not made by"):
        verify_renew_proof(cert, der, NOW_MS + 1, sign_renew_proof(KEY, der, NOW_MS), now_ms=NOW_MS)


def test_garbage_is_not_a_proof(ca: CertificateAuthority) -> None:
    cert = ca.issue_node_cert(make_csr(KEY, "n1"), "n1", "node", 1, 3600)
    with pytest.raises(Unauthenticated):
        verify_renew_proof(cert, csr_der(), NOW_MS, b"\x30\x00", now_ms=NOW_MS)


@pytest.mark.parametrize("off_ms", [61_000, -61_000])
def test_a_timestamp_61_s_off_fails_even_with_a_good_signature(ca: CertificateAuthority, off_ms: int) -> None:
    cert = ca.issue_node_cert(make_csr(KEY, "n1"), "n1", "node", 1, 3600)
    der = csr_der()
    ts = NOW_MS + off_ms
    verify_renew_proof(cert, der, ts, sign_renew_proof(KEY, der, ts))  # the signature alone is fine
    with pytest.raises(Unauthenticated, match="from the server's clock"):
        verify_renew_proof(cert, der, ts, sign_renew_proof(KEY, der, ts), now_ms=NOW_MS)


@given(off_ms=st.integers(min_value=-PROOF_SKEW_MS - 5_000, max_value=PROOF_SKEW_MS + 5_000))
def test_the_window_is_60_s_either_way(off_ms: int) -> None:
    if abs(off_ms) <= PROOF_SKEW_MS:
        check_proof_timestamp(NOW_MS + off_ms, NOW_MS)
    else:
        with pytest.raises(Unauthenticated):
            check_proof_timestamp(NOW_MS + off_ms, NOW_MS)


@settings(max_examples=25, deadline=None)
@given(
    off_ms=st.one_of(
        st.integers(min_value=PROOF_SKEW_MS - 2, max_value=PROOF_SKEW_MS + 2),
        st.integers(min_value=-PROOF_SKEW_MS - 2, max_value=-PROOF_SKEW_MS + 2),
    ),
    now_ms=st.integers(min_value=0, max_value=2**50),
)
def test_signed_proofs_at_the_edge(off_ms: int, now_ms: int) -> None:
    # A module-level certificate: function-scoped fixtures do not mix with @given.
    der = CSR_DER
    ts = now_ms + off_ms
    proof = sign_renew_proof(KEY, der, ts)
    if abs(off_ms) <= PROOF_SKEW_MS:
        verify_renew_proof(EDGE_CERT, der, ts, proof, now_ms=now_ms)
    else:
        with pytest.raises(Unauthenticated):
            verify_renew_proof(EDGE_CERT, der, ts, proof, now_ms=now_ms)


class _Clock:
    def now(self) -> float:
        return NOW_MS / 1000

    def monotonic(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        return None


CSR_DER = csr_der()
EDGE_CERT = CertificateAuthority.create(_Clock(), RNG, SECRETS).issue_node_cert(
    make_csr(KEY, "n1"), "n1", "node", 1, 3600
)
