"""A TPM's attestation key played in software: the structures a TPM's `TPM2_Certify` makes, built by hand.

`bc.pki.tpm_attest` checks an attestation key's (AK's) word that a key lives in the same TPM; these builders
make that word for a key `cryptography` holds, signed by an AK `cryptography` holds, laid out as TPM 2.0
Part 2 says. A server without EK CA roots cannot tell them from a TPM's (it takes the AK on the token's word:
docs/node-security.md), which is what lets the suites run a TPM identity's server side without a TPM (a server
with roots refuses such an AK: tests/integration/test_tpm_activation.py); tests/integration/test_tpm_swtpm.py
does the same against a real (software) TPM.
"""

from __future__ import annotations

import hashlib
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from bc.pki.tpm_attest import FIXED_PARENT, FIXED_TPM, SENSITIVE_DATA_ORIGIN, SIGN, TpmCertification, spki

ATTRS = FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN | SIGN | 0x40 | 0x400


def _b(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


def tpm2b_public(key: ec.EllipticCurvePublicKey, attrs: int = ATTRS) -> bytes:
    """The TPM2B_PUBLIC of a P-256 ECDSA signing key with these object attributes."""
    n = key.public_numbers()
    area = (
        struct.pack(">HHI", 0x0023, 0x000B, attrs)
        + _b(b"")  # authPolicy
        + struct.pack(">H", 0x0010)  # symmetric: null
        + struct.pack(">HH", 0x0018, 0x000B)  # ECDSA, SHA-256
        + struct.pack(">H", 0x0003)  # NIST P-256
        + struct.pack(">H", 0x0010)  # kdf: null
        + _b(n.x.to_bytes(32, "big"))
        + _b(n.y.to_bytes(32, "big"))
    )
    return _b(area)


def attest_for(public: bytes) -> bytes:
    """A TPMS_ATTEST of type ATTEST_CERTIFY naming the object whose TPM2B_PUBLIC is `public`."""
    area = public[2:]
    name = struct.pack(">H", 0x000B) + hashlib.sha256(area).digest()
    return (
        struct.pack(">IH", 0xFF544347, 0x8017)
        + _b(b"\x00\x0b" + bytes(32))  # qualifiedSigner
        + _b(b"")  # extraData
        + bytes(17)  # clockInfo
        + bytes(8)  # firmwareVersion
        + _b(name)
        + _b(name)  # qualifiedName (not checked)
    )


def certify(ak: ec.EllipticCurvePrivateKey, key: ec.EllipticCurvePublicKey, attrs: int = ATTRS) -> TpmCertification:
    """`ak`'s certification that `key` lives in its TPM (deterministic: the same bytes each call)."""
    public = tpm2b_public(key, attrs)
    attest = attest_for(public)
    signature = ak.sign(attest, ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    return TpmCertification(spki(ak.public_key()), public, attest, signature)
