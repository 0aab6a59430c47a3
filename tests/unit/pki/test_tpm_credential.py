"""bc.pki.tpm_credential: TPM2 MakeCredential in pure code, checked against the TPM's side of it.

`activate` below is TPM2_ActivateCredential as Part 1 §24 describes it, done with the EK's private half in
software. It is first shown to recover what `tpm2_makecredential -T none` (tpm2-tools, no TPM) sealed, and our
`protect` to produce byte for byte the blob tpm2-tools made from the same seed; Hypothesis then shows that what
`make_credential` seals opens for the name it was made for and for no other. tests/integration/test_tpm_helper.py
activates it in a real (software) TPM.
"""

from __future__ import annotations

import hashlib
import hmac
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from bc.pki import tpm_credential as tc

EK = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=b"IDENTITY\0")


class IntegrityFailed(Exception):
    pass


def _sized(data: bytes) -> tuple[bytes, bytes]:
    n = struct.unpack(">H", data[:2])[0]
    assert len(data) >= 2 + n
    return data[2 : 2 + n], data[2 + n :]


def unseal(secret: bytes) -> bytes:
    body, rest = _sized(secret)
    assert rest == b""
    return EK.decrypt(body, OAEP)


def activate(name: bytes, id_object: bytes, secret: bytes) -> bytes:
    """TPM2_ActivateCredential in software: the seed from the EK, the outer HMAC checked, the credential out."""
    seed = unseal(secret)
    inner, rest = _sized(id_object)
    assert rest == b""
    outer, enc_identity = _sized(inner)
    hmac_key = tc.kdfa(seed, b"INTEGRITY", b"", b"", 256)
    if not hmac.compare_digest(outer, hmac.new(hmac_key, enc_identity + name, hashlib.sha256).digest()):
        raise IntegrityFailed("the outer HMAC does not match: another name or another EK")
    sym_key = tc.kdfa(seed, b"STORAGE", name, b"", 128)
    credential, rest = _sized(tc.aes_cfb(sym_key, enc_identity, decrypt=True))
    assert rest == b""
    return credential


def name_of(area: bytes) -> bytes:
    return b"\x00\x0b" + hashlib.sha256(area).digest()


@pytest.mark.skipif(shutil.which("tpm2_makecredential") is None, reason="needs tpm2-tools (tpm2_makecredential)")
def test_tpm2_tools_makecredential_opens_here_and_protect_makes_its_very_bytes_from_its_seed(tmp_path: Path) -> None:
    pem = EK.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "ek.pem").write_bytes(pem)
    (tmp_path / "secret").write_bytes(b"0123456789abcdef0123456789abcdef")
    name = name_of(b"an attestation key's public area")
    subprocess.run(
        ["tpm2_makecredential", "-T", "none", "-u", "ek.pem", "-G", "rsa", "-s", "secret", "-n", name.hex(),
         "-o", "cred.out"],
        cwd=tmp_path, check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    blob = (tmp_path / "cred.out").read_bytes()
    assert struct.unpack(">II", blob[:8]) == (0xBADCC0DE, 1)  # agent.tpm writes the same header to activate
    id_body, rest = _sized(blob[8:])
    id_object = tc.tpm2b(id_body)
    secret = rest
    assert activate(name, id_object, secret) == b"0123456789abcdef0123456789abcdef"
    assert tc.protect(unseal(secret), name, b"0123456789abcdef0123456789abcdef") == id_object
    with pytest.raises(IntegrityFailed):
        activate(name_of(b"another key"), id_object, secret)


@given(
    st.binary(min_size=1, max_size=64),
    st.binary(min_size=1, max_size=64),
    st.binary(min_size=1, max_size=tc.MAX_CREDENTIAL),
    st.binary(min_size=tc.SEED_BYTES, max_size=tc.SEED_BYTES),
)
@settings(max_examples=60, deadline=None)
def test_a_credential_opens_for_the_name_it_was_made_for_and_no_other(
    area: bytes, other: bytes, credential: bytes, seed: bytes
) -> None:
    id_object, secret = tc.make_credential(EK.public_key(), name_of(area), credential, seed)
    assert activate(name_of(area), id_object, secret) == credential
    if other != area:
        with pytest.raises(IntegrityFailed):
            activate(name_of(other), id_object, secret)


def test_another_eks_private_half_cannot_open_the_seed() -> None:
    _, secret = tc.make_credential(EK.public_key(), name_of(b"ak"), b"c" * 32, b"s" * 32)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(ValueError):
        other.decrypt(_sized(secret)[0], OAEP)


def test_kdfa_is_sp800_108_counter_mode_with_the_nul_after_the_label() -> None:
    first = hmac.new(b"k", b"\0\0\0\x01STORAGE\0uv\0\0\0\x80", hashlib.sha256).digest()
    assert tc.kdfa(b"k", b"STORAGE", b"u", b"v", 128) == first[:16]
    one = hmac.new(b"k", b"\0\0\0\x01L\0\0\0\x01\x80", hashlib.sha256).digest()
    two = hmac.new(b"k", b"\0\0\0\x02L\0\0\0\x01\x80", hashlib.sha256).digest()
    assert tc.kdfa(b"k", b"L", b"", b"", 384) == one + two[:16]


def test_a_credential_or_seed_outside_their_sizes_is_refused() -> None:
    with pytest.raises(ValueError, match="credential"):
        tc.make_credential(EK.public_key(), name_of(b"ak"), b"c" * 33, b"s" * 32)
    with pytest.raises(ValueError, match="seed"):
        tc.make_credential(EK.public_key(), name_of(b"ak"), b"c" * 32, b"s" * 16)
