"""Attested results and reports: the node's P-256 key signs, the control plane checks against issued certificates."""

from __future__ import annotations

import hashlib
import random

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from hypothesis import given
from hypothesis import strategies as st

from bc.pki import attest, keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.pki.signing import create_root
from bc.protocol.pb import session_pb2
from bc.testing import virtual_clock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

NOW = 1_800_000_000.0
CLOCK = virtual_clock(NOW)
CA = CertificateAuthority.create(CLOCK, RNG, SECRETS)
# Generated once: ECDSA keys and certificates are reused across Hypothesis examples.
KEY_1 = keys.generate_key()
KEY_2 = keys.generate_key()
OTHER = keys.generate_key()
STATES = [
    session_pb2.CommandState.Name(s)
    for s in (
        session_pb2.COMMAND_SUCCEEDED,
        session_pb2.COMMAND_FAILED,
        session_pb2.COMMAND_REJECTED,
        session_pb2.COMMAND_CANCELLED,
    )
]


def node_cert(key: ec.EllipticCurvePrivateKey, node_id: str = "n1") -> x509.Certificate:
    return CA.issue_node_cert(make_csr(key, node_id), node_id, "node", 1)


CERT_1 = node_cert(KEY_1)
CERT_2 = node_cert(KEY_2)  # the same node after a renewal: a new key
OTHER_CERT = node_cert(OTHER, "n2")


# -- the messages --------------------------------------------------------------------------------


def test_the_result_message_binds_id_state_and_the_result_digest() -> None:
    msg = attest.result_message("c-1", "COMMAND_SUCCEEDED", b'{"ok":true}')
    digest = hashlib.sha256(b'{"ok":true}').hexdigest()
    assert msg == b"bc.v1/command-result\nc-1\nCOMMAND_SUCCEEDED\n" + digest.encode()


def test_an_empty_result_still_has_a_digest() -> None:
    assert attest.result_message("c", "COMMAND_FAILED", b"").endswith(hashlib.sha256(b"").hexdigest().encode())


def test_the_report_message_is_the_body_behind_its_own_prefix() -> None:
    assert attest.report_message(b"\x01\x02") == b"bc.v1/allocation-report\n\x01\x02"


@given(
    a=st.tuples(st.text(max_size=12), st.sampled_from(STATES), st.binary(max_size=16)),
    b=st.tuples(st.text(max_size=12), st.sampled_from(STATES), st.binary(max_size=16)),
)
def test_distinct_results_have_distinct_messages(a: tuple[str, str, bytes], b: tuple[str, str, bytes]) -> None:
    if a != b:
        assert attest.result_message(*a) != attest.result_message(*b)


@given(body=st.binary(max_size=64), cid=st.text(max_size=12), state=st.sampled_from(STATES), res=st.binary(max_size=8))
def test_a_report_message_never_equals_a_result_message(body: bytes, cid: str, state: str, res: bytes) -> None:
    assert attest.report_message(body) != attest.result_message(cid, state, res)


# -- sign and verify -----------------------------------------------------------------------------


def test_a_signature_is_der_ecdsa_sha256_by_the_node_key() -> None:
    msg = attest.result_message("c-1", "COMMAND_SUCCEEDED", b"r")
    sig = attest.sign(KEY_1, msg)
    KEY_1.public_key().verify(sig, msg, ec.ECDSA(hashes.SHA256()))  # raises if it does not hold
    assert attest.verify(KEY_1.public_key(), msg, sig)


@given(cid=st.text(max_size=16), state=st.sampled_from(STATES), result=st.binary(max_size=32))
def test_a_result_signed_by_the_node_verifies_and_any_other_result_does_not(
    cid: str, state: str, result: bytes
) -> None:
    msg = attest.result_message(cid, state, result)
    sig = attest.sign(KEY_1, msg)
    assert attest.verify(KEY_1.public_key(), msg, sig)
    assert not attest.verify(KEY_1.public_key(), attest.result_message(cid, state, result + b"\x00"), sig)
    assert not attest.verify(KEY_1.public_key(), attest.result_message(cid + "x", state, result), sig)
    other_state = next(s for s in STATES if s != state)
    assert not attest.verify(KEY_1.public_key(), attest.result_message(cid, other_state, result), sig)


def test_another_key_does_not_verify() -> None:
    msg = attest.report_message(b"body")
    assert not attest.verify(OTHER.public_key(), msg, attest.sign(KEY_1, msg))


@pytest.mark.parametrize("sig", [b"", b"\x00", b"\x30\x06\x02\x01\x01\x02\x01\x01", b"not der at all" * 5])
def test_an_empty_or_malformed_signature_is_false_not_an_exception(sig: bytes) -> None:
    assert attest.verify(KEY_1.public_key(), attest.report_message(b"body"), sig) is False


def test_a_result_signature_is_not_a_report_signature() -> None:
    """Domain separation: what the node signed as a result cannot be replayed as a report."""
    result_msg = attest.result_message("c-1", "COMMAND_SUCCEEDED", b"r")
    sig = attest.sign(KEY_1, result_msg)
    assert not attest.verify(KEY_1.public_key(), attest.report_message(result_msg), sig)


# -- verify_by_any -------------------------------------------------------------------------------


def test_verify_by_any_accepts_a_signature_by_any_of_the_node_certificates() -> None:
    """A result signed just before a renewal still counts after it."""
    msg = attest.result_message("c-1", "COMMAND_SUCCEEDED", b"r")
    old_sig, new_sig = attest.sign(KEY_1, msg), attest.sign(KEY_2, msg)
    assert attest.verify_by_any([CERT_2, CERT_1], msg, old_sig)
    assert attest.verify_by_any([CERT_2, CERT_1], msg, new_sig)
    assert attest.verify_by_any([CERT_1], msg, old_sig)
    assert not attest.verify_by_any([CERT_2], msg, old_sig)


def test_verify_by_any_is_false_without_certificates_or_with_another_nodes() -> None:
    msg = attest.report_message(b"body")
    sig = attest.sign(KEY_1, msg)
    assert not attest.verify_by_any([], msg, sig)
    assert not attest.verify_by_any([OTHER_CERT], msg, sig)
    assert not attest.verify_by_any([CERT_1], msg, b"")
    assert not attest.verify_by_any([CERT_1], attest.report_message(b"bodY"), sig)


def test_verify_by_any_skips_certificates_whose_key_is_not_ecdsa() -> None:
    _, ed_root = create_root(CLOCK, RNG, SECRETS)
    assert isinstance(ed_root.public_key(), ed25519.Ed25519PublicKey)
    msg = attest.report_message(b"body")
    sig = attest.sign(KEY_1, msg)
    assert attest.verify_by_any([ed_root, CERT_1], msg, sig)
    assert not attest.verify_by_any([ed_root], msg, sig)
