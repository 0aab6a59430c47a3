"""A CSR signed by a key this process cannot hold: a TPM's (`agent.tpm`), through a signing callback.

`cryptography` signs CSRs only with a private key object it holds, so this builds the PKCS#10 request
(RFC 2986) itself: the CertificationRequestInfo (version 0, the subject, the key's
SubjectPublicKeyInfo, no attributes) is DER-encoded here, the callback signs it (ECDSA-SHA256, DER),
and the result parses and verifies with `cryptography` like any other CSR (the test checks that).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import Name, NameAttribute
from cryptography.x509.oid import NameOID

# ecdsa-with-SHA256, 1.2.840.10045.4.3.2
_ECDSA_SHA256 = bytes.fromhex("06082a8648ce3d040302")


def _der(tag: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes([tag, n]) + body
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + body


def request_info(public_key: ec.EllipticCurvePublicKey, node_id: str) -> bytes:
    """The DER CertificationRequestInfo the key signs (subject `node:<id>`, as `bc.pki.identity.make_csr`)."""
    subject = Name([NameAttribute(NameOID.COMMON_NAME, f"node:{node_id}")]).public_bytes()
    spki = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _der(0x30, _der(0x02, b"\x00") + subject + spki + _der(0xA0, b""))


async def make_remote_csr(
    public_key: ec.EllipticCurvePublicKey, node_id: str, sign: Callable[[bytes], Awaitable[bytes]]
) -> bytes:
    """A DER CSR for `public_key`, signed by `sign` (ECDSA-SHA256 over the request info, DER signature)."""
    info = request_info(public_key, node_id)
    signature = await sign(info)
    return _der(0x30, info + _der(0x30, _ECDSA_SHA256) + _der(0x03, b"\x00" + signature))
