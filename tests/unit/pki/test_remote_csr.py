"""`bc.pki.remote_csr`: a CSR signed through a callback (a TPM's key) parses and verifies as any other."""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from bc.pki import attest
from bc.pki.remote_csr import make_remote_csr


async def test_a_csr_signed_outside_cryptography_parses_and_verifies() -> None:
    key = ec.generate_private_key(ec.SECP256R1())

    async def sign(message: bytes) -> bytes:
        return attest.sign(key, message)

    csr = x509.load_der_x509_csr(await make_remote_csr(key.public_key(), "n1", sign))
    assert csr.is_signature_valid and csr.public_key() == key.public_key()
    assert csr.subject.rfc4514_string() == "CN=node:n1"


async def test_a_signature_by_another_key_does_not_verify() -> None:
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    async def sign(message: bytes) -> bytes:
        return attest.sign(other, message)

    assert not x509.load_der_x509_csr(await make_remote_csr(key.public_key(), "n1", sign)).is_signature_valid
