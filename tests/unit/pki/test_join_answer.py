"""The CA's signature over a join's answer: good for exactly this CSR, certificate and bundle, by this CA."""

from __future__ import annotations

from pathlib import Path

import pytest

from bc.pki import join_answer
from bc.pki.ca import CertificateAuthority
from bc.seams.clock import LoopClock
from tests.unit.pki.conftest import RNG, SECRETS

CSR, CERT, TRUST = b"csr-der", b"-----BEGIN CERTIFICATE-----\n", b"\x0a\x03pem"


def test_the_ca_signature_verifies_against_the_ca_certificate(ca: CertificateAuthority) -> None:
    sig = ca.sign_join_answer(CSR, CERT, TRUST)
    assert join_answer.verify_answer(ca.certificate, CSR, CERT, TRUST, sig)


@pytest.mark.parametrize("part", [0, 1, 2])
def test_any_changed_part_breaks_it(ca: CertificateAuthority, part: int) -> None:
    sig = ca.sign_join_answer(CSR, CERT, TRUST)
    parts = [CSR, CERT, TRUST]
    parts[part] += b"x"
    assert not join_answer.verify_answer(ca.certificate, parts[0], parts[1], parts[2], sig)


def test_another_ca_or_a_mangled_signature_does_not_verify(
    ca: CertificateAuthority, tmp_path: Path, clock: LoopClock
) -> None:
    other, _ = CertificateAuthority.load_or_create(tmp_path / "other", clock, RNG, SECRETS)
    sig = other.sign_join_answer(CSR, CERT, TRUST)
    assert not join_answer.verify_answer(ca.certificate, CSR, CERT, TRUST, sig)
    assert not join_answer.verify_answer(ca.certificate, CSR, CERT, TRUST, b"\x30\x00")
    assert not join_answer.verify_answer(ca.certificate, CSR, CERT, TRUST, b"")


def test_parts_are_hashed_apart_so_bytes_cannot_move_between_them() -> None:
    assert join_answer.answer_message(b"ab", b"c", b"") != join_answer.answer_message(b"a", b"bc", b"")


def test_the_ssh_ca_keys_are_covered_and_none_reads_as_before(ca: CertificateAuthority) -> None:
    keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA install-ca"]
    sig = ca.sign_join_answer(CSR, CERT, TRUST, keys)
    assert join_answer.verify_answer(ca.certificate, CSR, CERT, TRUST, sig, keys)
    assert not join_answer.verify_answer(ca.certificate, CSR, CERT, TRUST, sig, [*keys, "ssh-ed25519 AAAA thief"])
    assert not join_answer.verify_answer(ca.certificate, CSR, CERT, TRUST, sig, ["ssh-ed25519 AAAA thief"])
    # Stripped by a gateway: the signature no longer holds, so the node keeps nothing of the answer.
    assert not join_answer.verify_answer(ca.certificate, CSR, CERT, TRUST, sig)
    assert join_answer.answer_message(CSR, CERT, TRUST, []) == join_answer.answer_message(CSR, CERT, TRUST)
