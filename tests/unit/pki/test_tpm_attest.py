"""`bc.pki.tpm_attest` reads TPM structures a node sends: whatever the bytes, the answer is the key or a
one-sentence `Unauthenticated`, never another exception (the server parses them before it trusts them).

The structures are built by hand (tests/soft_ak.py), as TPM 2.0 Part 2 lays them out;
tests/integration/test_tpm_swtpm.py checks the same code against what a real (software) TPM produces.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import Unauthenticated
from bc.pki.tpm_attest import (
    FIXED_TPM,
    SENSITIVE_DATA_ORIGIN,
    TpmCertification,
    certified_name,
    check_tpm_key,
    parse_public,
    verify_certified_key,
)
from tests.soft_ak import ATTRS, certify

KEY = ec.generate_private_key(ec.SECP256R1())
AK = ec.generate_private_key(ec.SECP256R1())


def certification(key: ec.EllipticCurvePublicKey = KEY.public_key(), attrs: int = ATTRS) -> TpmCertification:
    return certify(AK, key, attrs)


def test_a_well_formed_certification_gives_the_key() -> None:
    c = certification()
    assert verify_certified_key(AK.public_key(), c.key_public, c.attest, c.signature) == KEY.public_key()
    assert parse_public(c.key_public).name == certified_name(c.attest)


def test_a_key_the_tpm_could_export_or_did_not_make_is_refused() -> None:
    for attrs in (ATTRS & ~FIXED_TPM, ATTRS & ~SENSITIVE_DATA_ORIGIN, ATTRS | 0x00010000):
        with pytest.raises(Unauthenticated, match="not a signing key the TPM generated"):
            check_tpm_key(certification(attrs=attrs), KEY.public_key())


def test_a_certification_of_another_key_than_the_csrs_is_refused() -> None:
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(Unauthenticated, match="not the certificate request's key"):
        check_tpm_key(certification(), other)


@given(st.data())
def test_any_corruption_is_a_sentence_never_a_crash(data: st.DataObject) -> None:
    c = certification()
    field = data.draw(st.sampled_from(["ak_spki_der", "key_public", "attest", "signature"]))
    value = getattr(c, field)
    how = data.draw(st.sampled_from(["cut", "flip", "random"]))
    if how == "cut":
        value = value[: data.draw(st.integers(0, max(len(value) - 1, 0)))]
    elif how == "flip":
        i = data.draw(st.integers(0, len(value) - 1))
        value = value[:i] + bytes([value[i] ^ data.draw(st.integers(1, 255))]) + value[i + 1 :]
    else:
        value = data.draw(st.binary(max_size=300))
    broken = TpmCertification(**{**c.__dict__, field: value})
    try:
        check_tpm_key(broken, KEY.public_key())
    except Unauthenticated as e:
        assert "\n" not in e.message
    for parse in (parse_public, certified_name):
        try:
            parse(value)
        except Unauthenticated:
            pass


def test_an_ak_that_is_not_p256_is_refused() -> None:
    c = certification()
    rsa_like = ec.generate_private_key(ec.SECP384R1()).public_key()
    der = rsa_like.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(Unauthenticated, match="not a P-256 key"):
        check_tpm_key(TpmCertification(der, c.key_public, c.attest, c.signature), KEY.public_key())
