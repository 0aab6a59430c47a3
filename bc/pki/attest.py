"""Attested results and reports: what a node signs with its own key, and how it is checked.

The node key is the P-256 key of its TLS certificate, so the control plane
verifies against the certificates it issued (`node_certs`), never against
anything a gateway says. Messages are domain-separated:

* a command result: ``b"bc.v1/command-result\\n" + id + b"\\n" + STATE + b"\\n" + hex(sha256(result))``
  (STATE is the CommandState enum name, e.g. ``COMMAND_SUCCEEDED``);
* an allocation report: ``b"bc.v1/allocation-report\\n" + body`` (a serialized AllocationReport,
  which names the node, the allocation, the kind and the generation).

Signatures are DER ECDSA-SHA256.
"""

from __future__ import annotations

import hashlib

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec


def result_message(command_id: str, state_name: str, result: bytes) -> bytes:
    digest = hashlib.sha256(result).hexdigest()
    return b"bc.v1/command-result\n" + command_id.encode() + b"\n" + state_name.encode() + b"\n" + digest.encode()


def report_message(body: bytes) -> bytes:
    return b"bc.v1/allocation-report\n" + body


def sign(key: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    return key.sign(message, ec.ECDSA(hashes.SHA256()))


def verify(public_key: ec.EllipticCurvePublicKey, message: bytes, signature: bytes) -> bool:
    if not signature:
        return False
    try:
        public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def verify_by_any(certs: list[x509.Certificate], message: bytes, signature: bytes) -> bool:
    """True if one of the node's certificates' keys made the signature (a renewal rotates the key)."""
    for cert in certs:
        pub = cert.public_key()
        if isinstance(pub, ec.EllipticCurvePublicKey) and verify(pub, message, signature):
            return True
    return False
