"""The proof of possession a node sends with `Join.Renew`.

A renewal asks the CA to certify a new key (the CSR's) for the identity the
caller's current certificate names. The CSR's own signature proves the new
key; the proof proves the *current* one, so that nothing but the holder of
the current key can move the identity to another key (a gateway or anything
else that merely relays frames cannot mint certificates).

The proof is an ECDSA-SHA256 signature by the current key over::

    b"bc.v1/renew\\n" + ascii(decimal timestamp_ms) + b"\\n" + SHA-256(csr_der)   (32 raw bytes)

* The `bc.v1/renew` prefix separates it from anything else the node key may
  ever sign (attested results, TLS handshakes sign with their own context),
  so a signature made for one purpose cannot be replayed as another.
* The timestamp bounds replay: the server accepts it only within
  `PROOF_SKEW_MS` (60 s) of its store clock, either way, to tolerate clock
  skew between the node and the control plane.
* Hashing the CSR binds the proof to that exact request, so a proof cannot
  be paired with somebody else's key.

**By proof.** A key the TPM holds cannot make a TLS handshake (grpcio's TLS takes
a key only as bytes), so a TPM identity renews with the certificate in the request
(`RenewRequest.cert_der`) under a leaf of the install's join root, which proves
nothing, and the proof carries what TLS would have bound, as a re-join's does
(`bc.pki.rejoin`)::

    b"bc.v1/renew-by-proof\\n" + ascii(timestamp_ms) + b"\\n" + nonce + SHA-256(cert_der) + SHA-256(csr_der)

Everything else is a renewal's: the same checks, refusals (`renew:…`) and events.
A replayed request within the 60 s gains nothing: it certifies the same CSR key,
which only the node holds.
"""

from __future__ import annotations

import hashlib

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from bc.errors import Unauthenticated, UsageError

RENEW_PROOF_DOMAIN = b"bc.v1/renew\n"
RENEW_BY_PROOF_DOMAIN = b"bc.v1/renew-by-proof\n"
NONCE_BYTES = 16
PROOF_SKEW_MS = 60_000


def renew_proof_message(csr_der: bytes, timestamp_ms: int) -> bytes:
    """The exact bytes the current key signs (see the module docstring)."""
    return RENEW_PROOF_DOMAIN + str(int(timestamp_ms)).encode("ascii") + b"\n" + hashlib.sha256(csr_der).digest()


def sign_renew_proof(key: ec.EllipticCurvePrivateKey, csr_der: bytes, timestamp_ms: int) -> bytes:
    """The proof (a DER ECDSA-SHA256 signature) that the holder of `key` asks for this CSR at this time."""
    return key.sign(renew_proof_message(csr_der, timestamp_ms), ec.ECDSA(hashes.SHA256()))


def verify_renew_proof(
    cert: x509.Certificate, csr_der: bytes, timestamp_ms: int, proof: bytes, *, now_ms: int | None = None
) -> None:
    """Raise `Unauthenticated` unless `proof` is the key of `cert` signing this CSR and timestamp.

    With `now_ms`, also refuse a timestamp more than 60 s from it. The server
    checks the two apart (`check_proof_timestamp`) so it knows when the
    caller has proved its key, and only then publishes a refusal.
    """
    pub = cert.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise Unauthenticated("the current certificate's key is not an ECDSA key")
    try:
        pub.verify(proof, renew_proof_message(csr_der, timestamp_ms), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise Unauthenticated(
            "the renewal's proof of possession was not made by the current certificate's key"
        ) from None
    if now_ms is not None:
        check_proof_timestamp(timestamp_ms, now_ms)


def renew_by_proof_message(cert_der: bytes, csr_der: bytes, timestamp_ms: int, nonce: bytes) -> bytes:
    """The exact bytes a renewal by proof signs: the renewed certificate in it, since TLS does not bind it."""
    return (
        RENEW_BY_PROOF_DOMAIN
        + str(int(timestamp_ms)).encode("ascii")
        + b"\n"
        + nonce
        + hashlib.sha256(cert_der).digest()
        + hashlib.sha256(csr_der).digest()
    )


def verify_renew_by_proof(
    cert: x509.Certificate, cert_der: bytes, csr_der: bytes, timestamp_ms: int, nonce: bytes, proof: bytes
) -> None:
    """Raise `Unauthenticated` (`UsageError` for a malformed nonce) unless `proof` is `cert`'s key asking to
    renew it with this CSR."""
    if len(nonce) != NONCE_BYTES:
        raise UsageError(f"the renewal's nonce must be {NONCE_BYTES} bytes, not {len(nonce)}")
    pub = cert.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise Unauthenticated("the renewed certificate's key is not an ECDSA key")
    try:
        pub.verify(proof, renew_by_proof_message(cert_der, csr_der, timestamp_ms, nonce), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise Unauthenticated(
            "the renewal's proof of possession was not made by the renewed certificate's key"
        ) from None


def check_proof_timestamp(timestamp_ms: int, now_ms: int, what: str = "renewal") -> None:
    """Raise `Unauthenticated` when the proof's time is more than 60 s from `now_ms` (either way)."""
    off_ms = timestamp_ms - now_ms
    if abs(off_ms) > PROOF_SKEW_MS:
        raise Unauthenticated(
            f"the {what}'s timestamp is {off_ms / 1000:+.0f} s from the server's clock (at most ±60 s);"
            " check the node's clock"
        )
