"""Re-join after expiry: the rule that says whether an expired certificate's key may still get a new one.

A node whose certificate expired while it was offline (a powered-off host, a
long maintenance) cannot renew: `Join.Renew` needs a TLS handshake with that
certificate, and the handshake refuses an expired one. Within `REJOIN_WINDOW_S`
(7 days) of the expiry it may instead call `Join.Rejoin` under a join-root leaf
(which proves nothing), with the expired certificate in the request and a proof
by the key that certificate names. It keeps its node id, identity generation,
labels and journal, as a renewal does. The proof is an ECDSA-SHA256 signature
by that key over::

    b"bc.v1/rejoin\\n" + ascii(timestamp_ms) + b"\\n" + nonce + SHA-256(cert_der) + SHA-256(csr_der)

* the `bc.v1/rejoin` prefix keeps it apart from a renewal proof and anything else the key signs;
* the timestamp is accepted within 60 s of the store clock (`bc.pki.renewal.PROOF_SKEW_MS`), the
  nonce (16 fresh bytes) makes every proof distinct;
* the two hashes bind the proof to that certificate and that request, so it cannot be paired with
  another key.

A replayed request gains nothing: a re-join issues a newer certificate of the same identity
generation, and only the *latest* certificate of its generation may re-join (`decide`), so the same
expired certificate never re-joins twice, and the new certificate certifies the CSR's key, which only
the node holds.

`decide` is the whole rule, pure, shared by the server (which is authoritative and checks every case)
and the agent (which uses it to choose between Renew and Rejoin). The order of its checks is the order
of the table below: the first that applies is the answer.

    unknown       the serial is not in node_certs, or names another node      refused
    revoked       the certificate was revoked                                 new token: bc join --reset --yes
    old-identity  a later join replaced the identity generation               refused (that join holds the node)
    not-latest    a newer certificate of this generation exists              refused (the node holds the newer one)
    not-expired   still valid: renew over TLS instead                        use Renew
    too-late      expired more than 7 days ago                               new token: bc join --reset --yes
    rejoin        expired within the last 7 days                             a certificate for the CSR's key
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from bc.errors import BcError, CertificateRevoked, RejoinTooLate, Unauthenticated, UsageError

REJOIN_WINDOW_S = 7 * 24 * 3600
REJOIN_PROOF_DOMAIN = b"bc.v1/rejoin\n"
NONCE_BYTES = 16

Verdict = Literal["unknown", "revoked", "old-identity", "not-latest", "not-expired", "too-late", "rejoin"]

RESET_HINT = "join again with a new token: bc join --reset --yes, then bc join"


@dataclass(frozen=True)
class CertFacts:
    """What the store knows about the certificate a re-join presents (all times in ms, store time)."""

    known: bool  # a row in node_certs for this serial and this node
    revoked: bool
    not_after_ms: int
    current_generation: bool  # the certificate's identity generation is the node's current one
    latest: bool  # no later certificate of the same node and generation exists


def decide(facts: CertFacts, now_ms: int, window_s: int = REJOIN_WINDOW_S) -> Verdict:
    """Whether `facts`' certificate may re-join at `now_ms` (see the table in the module docstring)."""
    if not facts.known:
        return "unknown"
    if facts.revoked:
        return "revoked"
    if not facts.current_generation:
        return "old-identity"
    if not facts.latest:
        return "not-latest"
    if now_ms < facts.not_after_ms:
        return "not-expired"
    if now_ms - facts.not_after_ms > window_s * 1000:
        return "too-late"
    return "rejoin"


def refusal(verdict: Verdict, node_id: str, serial: str, not_after_ms: int) -> BcError:
    """The one sentence (and typed error) for a verdict other than "rejoin"."""
    expired = datetime.fromtimestamp(not_after_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    cert = f"certificate {serial} of node {node_id}"
    if verdict == "revoked":
        return CertificateRevoked(f"{cert} was revoked, so the node cannot re-join with its key; {RESET_HINT}")
    if verdict == "too-late":
        return RejoinTooLate(
            f"{cert} expired at {expired}, more than 7 days ago, so the node cannot re-join with its key; {RESET_HINT}"
        )
    if verdict == "not-expired":
        return UsageError(f"{cert} has not expired (until {expired}); renew it with Join.Renew instead")
    if verdict == "not-latest":
        return Unauthenticated(f"{cert} is not the node's latest certificate; only the latest one re-joins")
    if verdict == "old-identity":
        return Unauthenticated(f"{cert} belongs to an older identity of the node; {RESET_HINT}")
    if verdict == "unknown":
        return Unauthenticated(f"{cert} is not a certificate this server issued to that node")
    raise ValueError(f"{verdict!r} is not a refusal")


def rejoin_proof_message(cert_der: bytes, csr_der: bytes, timestamp_ms: int, nonce: bytes) -> bytes:
    """The exact bytes the expired certificate's key signs (see the module docstring)."""
    return (
        REJOIN_PROOF_DOMAIN
        + str(int(timestamp_ms)).encode("ascii")
        + b"\n"
        + nonce
        + hashlib.sha256(cert_der).digest()
        + hashlib.sha256(csr_der).digest()
    )


def check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_BYTES:
        raise UsageError(f"the re-join's nonce must be {NONCE_BYTES} bytes, not {len(nonce)}")


def verify_rejoin_proof(
    cert: x509.Certificate, cert_der: bytes, csr_der: bytes, timestamp_ms: int, nonce: bytes, proof: bytes
) -> None:
    """Raise `Unauthenticated` unless `proof` is `cert`'s key signing this request."""
    check_nonce(nonce)
    pub = cert.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise Unauthenticated("the expired certificate's key is not an ECDSA key")
    try:
        pub.verify(proof, rejoin_proof_message(cert_der, csr_der, timestamp_ms, nonce), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise Unauthenticated(
            "the re-join's proof of possession was not made by the expired certificate's key"
        ) from None


def sign_rejoin_proof(
    key: ec.EllipticCurvePrivateKey, cert_der: bytes, csr_der: bytes, timestamp_ms: int, nonce: bytes
) -> bytes:
    """The proof (DER ECDSA-SHA256) that the holder of `key` asks to re-join with this request."""
    return key.sign(rejoin_proof_message(cert_der, csr_der, timestamp_ms, nonce), ec.ECDSA(hashes.SHA256()))
