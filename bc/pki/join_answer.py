"""The CA's own signature over a join's answer (`JoinResponse.answer_signature`).

A joining node pins the CA, but every serving certificate the CA issued satisfies that pin, a gateway's
too. So the node could not tell a Join answered by an api process from one a gateway forwarded and then
rewrote: its first trust bundle (the command-signing roots, the release keys, the approvers) would be
whatever the gateway said. The api process signs the answer with the CA key, which no gateway holds,
over the CSR the node sent (an answer to another join cannot be replayed), the certificate and the
bundle, and the install's SSH CA keys (the node's baseline for its first spec); the node keeps the answer
only if the pinned CA's key verifies it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from bc.protocol.canonical import canonical_json

_DOMAIN = b"bc join answer v1\x00"


def answer_message(csr_der: bytes, cert_pem: bytes, trust: bytes, ssh_ca_keys: Sequence[str] = ()) -> bytes:
    """What the CA signs: the domain, then SHA-256 of the CSR, the certificate and the serialized bundle, and
    (only when there are any, so an answer without them reads as before) of the SSH CA keys' canonical JSON.
    An answer signed with keys does not verify without them, so a gateway can neither add nor strip one."""
    parts = [csr_der, cert_pem, trust]
    if ssh_ca_keys:
        parts.append(canonical_json(list(ssh_ca_keys)).encode())
    return _DOMAIN + b"".join(hashlib.sha256(part).digest() for part in parts)


def verify_answer(
    ca_cert: x509.Certificate,
    csr_der: bytes,
    cert_pem: bytes,
    trust: bytes,
    signature: bytes,
    ssh_ca_keys: Sequence[str] = (),
) -> bool:
    """Whether `signature` is the CA key's over this join's answer."""
    pub = ca_cert.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        return False
    try:
        pub.verify(signature, answer_message(csr_der, cert_pem, trust, ssh_ca_keys), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True
