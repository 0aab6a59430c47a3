"""What a TPM says about a key, read and checked without a TPM: pure, for the node and the server alike.

A node that joins with `--attestor tpm` holds its node key inside the TPM
(`agent.tpm`) and names its attestation key (AK) in its certificate as
`urn:bc:tpm-ak:<hex SHA-256 of the AK's SubjectPublicKeyInfo>` (`ak_uri`). The AK is a restricted
signing key derived from the endorsement seed, so it survives a `TPM2_Clear` (which replaces the owner
seed) but not another TPM or a changed endorsement seed. A next key proves it lives in the same TPM
by a `TPM2_Certify` the AK signs: a TPMS_ATTEST of type ATTEST_CERTIFY naming the next key's TPM
name, which is its name algorithm followed by the hash of its public area (TPMT_PUBLIC). Checking it:

1. the AK's ECDSA-SHA256 signature over the TPMS_ATTEST bytes (`-f plain` from tpm2-tools: DER);
2. the attestation is TPM-generated (magic `TPM_GENERATED_VALUE`) and of type ATTEST_CERTIFY;
3. the certified name is the name of the public area the node sent, and that area is a P-256
   signing key the TPM generated and will never export (fixedTPM, fixedParent, sensitiveDataOrigin,
   sign; not restricted, not decrypt);
4. the public key in that area is the key the request is about (the caller compares it).

The structures are big-endian and laid out as in TPM 2.0 Part 2; only what these checks read is parsed.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bc.errors import Unauthenticated

AK_URI_PREFIX = "urn:bc:tpm-ak:"

TPM_GENERATED_VALUE = 0xFF544347
TPM_ST_ATTEST_CERTIFY = 0x8017
TPM_ALG_ECC = 0x0023
TPM_ALG_SHA256 = 0x000B
TPM_ALG_NULL = 0x0010
TPM_ECC_NIST_P256 = 0x0003

FIXED_TPM = 0x00000002
FIXED_PARENT = 0x00000010
SENSITIVE_DATA_ORIGIN = 0x00000020
RESTRICTED = 0x00010000
DECRYPT = 0x00020000
SIGN = 0x00040000


@dataclass(frozen=True)
class TpmPublic:
    """A parsed TPMT_PUBLIC of an ECC key."""

    area: bytes  # the TPMT_PUBLIC bytes, as hashed into the name
    name_alg: int
    attributes: int
    key: ec.EllipticCurvePublicKey

    @property
    def tpm2b(self) -> bytes:
        """The TPM2B_PUBLIC this area came in (its size, then the area)."""
        return struct.pack(">H", len(self.area)) + self.area

    @property
    def name(self) -> bytes:
        """The TPM name: the name algorithm (2 bytes) then the SHA-256 of the public area."""
        return struct.pack(">H", self.name_alg) + hashlib.sha256(self.area).digest()


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise Unauthenticated(f"the {self.what} is cut short")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u16(self) -> int:
        return int(struct.unpack(">H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def sized(self) -> bytes:
        return self.take(self.u16())


def parse_public(tpm2b_public: bytes) -> TpmPublic:
    """A TPM2B_PUBLIC (what `tpm2_readpublic -o` writes) of a P-256 key; `Unauthenticated` for anything else."""
    outer = _Reader(tpm2b_public, "TPM public area")
    area = outer.sized()
    if outer.pos != len(tpm2b_public):
        raise Unauthenticated("the TPM public area has trailing bytes")
    r = _Reader(area, "TPM public area")
    if r.u16() != TPM_ALG_ECC:
        raise Unauthenticated("the TPM key is not an ECC key")
    name_alg = r.u16()
    if name_alg != TPM_ALG_SHA256:
        raise Unauthenticated("the TPM key's name algorithm is not SHA-256")
    attributes = r.u32()
    r.sized()  # authPolicy
    if r.u16() != TPM_ALG_NULL:  # symmetric: a signing key has none
        r.take(4)
    if r.u16() != TPM_ALG_NULL:  # scheme, then its hash
        r.u16()
    if r.u16() != TPM_ECC_NIST_P256:
        raise Unauthenticated("the TPM key is not on the P-256 curve")
    if r.u16() != TPM_ALG_NULL:  # kdf
        r.u16()
    x, y = r.sized(), r.sized()
    if r.pos != len(area) or len(x) != 32 or len(y) != 32:
        raise Unauthenticated("the TPM key's point is not a P-256 point")
    try:
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + x + y)
    except ValueError:
        raise Unauthenticated("the TPM key's point is not on the P-256 curve") from None
    return TpmPublic(area, name_alg, attributes, key)


def certified_name(attest: bytes) -> bytes:
    """The name a TPMS_ATTEST of type ATTEST_CERTIFY certifies; `Unauthenticated` for any other structure."""
    r = _Reader(attest, "TPM attestation")
    if r.u32() != TPM_GENERATED_VALUE:
        raise Unauthenticated("the TPM attestation was not generated by a TPM")
    if r.u16() != TPM_ST_ATTEST_CERTIFY:
        raise Unauthenticated("the TPM attestation is not a key certification")
    r.sized()  # qualifiedSigner
    r.sized()  # extraData
    r.take(8 + 4 + 4 + 1)  # clockInfo
    r.take(8)  # firmwareVersion
    name = r.sized()
    r.sized()  # qualifiedName
    if r.pos != len(attest):
        raise Unauthenticated("the TPM attestation has trailing bytes")
    return name


def spki(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def ak_uri(ak: ec.EllipticCurvePublicKey) -> str:
    """The SAN URI a certificate names its node's AK by."""
    return AK_URI_PREFIX + hashlib.sha256(spki(ak)).hexdigest()


def verify_certified_key(
    ak: ec.EllipticCurvePublicKey, tpm2b_public: bytes, attest: bytes, signature: bytes
) -> ec.EllipticCurvePublicKey:
    """The key the AK certifies as its TPM's own non-exportable signing key (checks 1-3 above), or
    `Unauthenticated` in one sentence."""
    try:
        ak.verify(signature, attest, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise Unauthenticated("the key certification is not signed by the attestation key") from None
    public = parse_public(tpm2b_public)
    if certified_name(attest) != public.name:
        raise Unauthenticated("the attestation key certifies another key than the one sent")
    need = FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN | SIGN
    if public.attributes & need != need or public.attributes & (RESTRICTED | DECRYPT):
        raise Unauthenticated(
            "the certified key is not a signing key the TPM generated and keeps (fixedTPM, fixedParent,"
            " sensitiveDataOrigin, sign)"
        )
    return public.key


@dataclass(frozen=True)
class TpmCertification:
    """What a node sends to show its CSR's key lives in its TPM (the wire's `TpmCertification`)."""

    ak_spki_der: bytes
    key_public: bytes
    attest: bytes
    signature: bytes


def ak_uri_of(cert: x509.Certificate) -> str | None:
    """The AK a node certificate names, or None for a node that joined without `--attestor tpm`."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    named = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(AK_URI_PREFIX)]
    return named[0] if named else None


def check_tpm_key(certification: TpmCertification, csr_key: object, named_ak_uri: str | None = None) -> str:
    """The AK URI to name in the certificate, once `certification` shows the CSR's key lives in the TPM of
    that AK (and, with `named_ak_uri`, that the AK is the one the current certificate names); else
    `Unauthenticated` in one sentence."""
    try:
        ak = serialization.load_der_public_key(certification.ak_spki_der)
    except (ValueError, UnsupportedAlgorithm):
        raise Unauthenticated("the TPM attestation key does not parse") from None
    if not isinstance(ak, ec.EllipticCurvePublicKey) or not isinstance(ak.curve, ec.SECP256R1):
        raise Unauthenticated("the TPM attestation key is not a P-256 key")
    uri = ak_uri(ak)
    if named_ak_uri is not None and uri != named_ak_uri:
        raise Unauthenticated(
            "the TPM attestation key is not the one the certificate names (another TPM, or its endorsement seed"
            " changed); join again: bc join --reset --yes, then bc join"
        )
    key = verify_certified_key(ak, certification.key_public, certification.attest, certification.signature)
    if not isinstance(csr_key, ec.EllipticCurvePublicKey) or spki(key) != spki(csr_key):
        raise Unauthenticated("the key the TPM attestation key certifies is not the certificate request's key")
    return uri
