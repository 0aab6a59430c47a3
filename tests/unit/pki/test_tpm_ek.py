"""bc.pki.tpm_ek: the EK certificate's chain to the operator's roots, the AK's public area, and the activation's
ticket, judged without a TPM. Certificates are made here with `cryptography`; tests/integration/
test_tpm_activation.py runs the same checks against swtpm's EK certificates."""

from __future__ import annotations

import datetime
import hashlib
import re

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from bc.errors import Unauthenticated
from bc.pki import tpm_credential, tpm_ek
from bc.pki.tpm_attest import spki
from tests.soft_ak import tpm2b_public

NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
AK_ATTRS = tpm_ek.AK_ATTRIBUTES | 0x40 | 0x400


def _name(cn: str) -> x509.Name:
    """An empty `cn` is an empty subject, as EK certificates often have (the TPM is named in the SAN)."""
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])


def _cert(
    subject: str,
    key: object,
    issuer: str,
    signer: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
    *,
    ca: bool,
    not_after: datetime.datetime = NOW + 365 * DAY,
) -> x509.Certificate:
    b = (
        x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
        .public_key(key).serial_number(x509.random_serial_number())  # type: ignore[arg-type]
        .not_valid_before(NOW - 30 * DAY).not_valid_after(not_after)
    )  # fmt: skip
    if ca:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return b.sign(signer, hashes.SHA256())


ROOT_KEY = ec.generate_private_key(ec.SECP384R1())
ROOT = _cert("maker root", ROOT_KEY.public_key(), "maker root", ROOT_KEY, ca=True)
MID_KEY = ec.generate_private_key(ec.SECP256R1())
MID = _cert("maker EK CA", MID_KEY.public_key(), "maker root", ROOT_KEY, ca=True)
EK_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EK = _cert("", EK_KEY.public_key(), "maker EK CA", MID_KEY, ca=False)


def der(cert: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return cert.public_bytes(Encoding.DER)


def test_an_ek_certificate_chains_through_the_listed_intermediate_to_the_listed_root() -> None:
    key = tpm_ek.ek_public_key(der(EK), [MID, ROOT], NOW)
    assert key.public_numbers() == EK_KEY.public_key().public_numbers()


@pytest.mark.parametrize(
    ("roots", "ek", "says"),
    [
        ([ROOT], EK, "no certificate in tpm-ek-roots.pem issued"),  # the intermediate is not listed
        ([MID], EK, "no certificate in tpm-ek-roots.pem issued CN=maker EK CA"),  # nor the root
        (
            [_cert("maker EK CA", MID_KEY.public_key(), "maker root", ec.generate_private_key(ec.SECP384R1()), ca=True),
             ROOT],
            EK,
            "no certificate in tpm-ek-roots.pem issued CN=maker EK CA",
        ),  # a look-alike intermediate that the root did not sign
        ([MID, ROOT], _cert("", EK_KEY.public_key(), "maker EK CA", MID_KEY, ca=False, not_after=NOW - DAY),
         "the EK certificate (no subject) is not valid now"),
        ([MID, ROOT], _cert("", ec.generate_private_key(ec.SECP256R1()).public_key(), "maker EK CA", MID_KEY,
                            ca=False), "not an RSA key"),
    ],
)  # fmt: skip
def test_an_ek_certificate_outside_the_roots_or_not_valid_now_is_refused_saying_why(
    roots: list[x509.Certificate], ek: x509.Certificate, says: str
) -> None:
    with pytest.raises(Unauthenticated, match=re.escape(says)):
        tpm_ek.ek_public_key(der(ek), roots, NOW)


def test_an_ak_public_area_must_be_the_certifying_key_and_a_restricted_signing_key() -> None:
    ak = ec.generate_private_key(ec.SECP256R1()).public_key()
    area = tpm2b_public(ak, AK_ATTRS)
    assert tpm_ek.ak_name(area, spki(ak)) == b"\x00\x0b" + hashlib.sha256(area[2:]).digest()
    with pytest.raises(Unauthenticated, match="not the key that certified"):
        tpm_ek.ak_name(area, spki(ec.generate_private_key(ec.SECP256R1()).public_key()))
    with pytest.raises(Unauthenticated, match="not a restricted signing key"):
        tpm_ek.ak_name(tpm2b_public(ak, AK_ATTRS & ~0x00010000), spki(ak))  # not restricted: it signs anything


CA = ec.generate_private_key(ec.SECP256R1())
AK = ec.generate_private_key(ec.SECP256R1()).public_key()
FIELDS = {"token_id": "tok1", "csr_der": b"csr", "ek_der": der(EK), "ak_public": tpm2b_public(AK, AK_ATTRS)}


T0 = int(NOW.timestamp() * 1000)


def challenge(now_ms: int = T0) -> tpm_ek.Challenge:
    return tpm_ek.make_challenge(
        lambda m: CA.sign(m, ec.ECDSA(hashes.SHA256())), [MID, ROOT], now_ms,
        ak_spki_der=spki(AK), secret=b"S" * 32, seed=b"z" * 32, **FIELDS,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_challenge_opens_for_the_ak_and_its_ticket_takes_back_exactly_its_secret_for_5_minutes() -> None:
    c = challenge()
    name = tpm_ek.ak_name(FIELDS["ak_public"], spki(AK))  # type: ignore[arg-type]
    seed = EK_KEY.decrypt(c.secret[2:], tpm_credential_oaep())
    assert tpm_credential.protect(seed, name, b"S" * 32) == c.credential
    tpm_ek.check_activation(CA.public_key(), c.ticket, b"S" * 32, now_ms=T0 + 299_999, **FIELDS)  # type: ignore[arg-type]
    with pytest.raises(Unauthenticated, match="took longer than 5 minutes"):
        tpm_ek.check_activation(CA.public_key(), c.ticket, b"S" * 32, now_ms=T0 + 300_000, **FIELDS)  # type: ignore[arg-type]
    with pytest.raises(Unauthenticated, match="did not recover the activation secret"):
        tpm_ek.check_activation(CA.public_key(), c.ticket, b"T" * 32, now_ms=T0 + 1, **FIELDS)  # type: ignore[arg-type]


def tpm_credential_oaep() -> object:
    from cryptography.hazmat.primitives.asymmetric import padding

    return padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=b"IDENTITY\0")


def test_without_an_ek_certificate_there_is_no_challenge() -> None:
    with pytest.raises(Unauthenticated, match="the join sent none"):
        tpm_ek.make_challenge(
            lambda m: b"", [MID, ROOT], 0, ak_spki_der=spki(AK), secret=b"S" * 32, seed=b"z" * 32,
            **{**FIELDS, "ek_der": b""},  # type: ignore[arg-type]
        )  # fmt: skip


TICKET = challenge().ticket


@given(
    st.sampled_from(sorted(FIELDS)),
    st.integers(0, len(TICKET) - 1),
    st.integers(1, 255),
    st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_a_ticket_fits_only_its_own_request_and_no_altered_byte_passes(
    field: str, at: int, flip: int, alter_ticket: bool
) -> None:
    fields = dict(FIELDS)
    ticket = TICKET
    if alter_ticket:
        ticket = TICKET[:at] + bytes([TICKET[at] ^ flip]) + TICKET[at + 1 :]
    else:
        value = fields[field]
        fields[field] = value + "x" if isinstance(value, str) else value + b"x"  # type: ignore[operator]
    with pytest.raises(Unauthenticated):
        tpm_ek.check_activation(CA.public_key(), ticket, b"S" * 32, now_ms=T0 + 1, **fields)  # type: ignore[arg-type]


def test_a_name_the_node_sent_reaches_the_sentence_printable_and_bounded() -> None:
    stranger = ec.generate_private_key(ec.SECP256R1())
    ek = _cert("evil\nline" + "x" * 50, EK_KEY.public_key(), "A" * 60, stranger, ca=False)
    with pytest.raises(Unauthenticated) as e:
        tpm_ek.ek_public_key(der(ek), [MID, ROOT], NOW)
    assert "\n" not in e.value.message and "evil?line" in e.value.message and len(e.value.message) < 400
