"""Session certificates: the rule that says whether a TPM identity's certificate may certify a session key.

A node that joined with `--attestor tpm` holds its node key in the TPM, and grpcio's TLS (BoringSSL,
bundled) takes a client key only as PEM bytes: the key that never leaves the TPM can never be the
session's TLS key. So at start, and at 60 % of the last one's life, the agent makes a P-256 **session
key** in memory (never written) and asks `Join.SessionCert` to certify it, with a proof by the TPM key:
an ECDSA-SHA256 signature over::

    b"bc.v1/session-cert\\n" + node_id + b"\\n" + serial (hex) + b"\\n" + ascii(timestamp_ms) + b"\\n"
        + nonce + SHA-256(cert_der) + SHA-256(csr_der)

* the `bc.v1/session-cert` prefix keeps it apart from a renewal, a re-join and anything else the key signs;
* the node id and the serial say what is asked for in words a log can show, the two hashes bind the proof
  to that certificate and that request (it cannot be paired with another key);
* the timestamp is accepted within 5 minutes of the store's clock (`SESSION_SKEW_MS`), the nonce (16 fresh
  bytes) makes every proof distinct.

The session certificate names the node as its node certificate does (`urn:bc:node:`, role, identity
generation) plus `urn:bc:session-of:<serial of the node certificate>`, and no attestation key. It lasts the
lesser of 24 h and what the node certificate has left (`session_not_after_ms`), and is stored against that
certificate (`node_certs.session_of`), so that revoking the node revokes it too. It opens sessions and signs
the results the agent reports; it certifies nothing: a session certificate is refused by `Join.Renew`,
`Join.Rejoin` and `Join.SessionCert` (a stolen session key dies with its day).

`decide` is the whole rule over what the store holds, pure. Its order is the order of the table: the first
that applies is the answer. The refusals marked *retry* are ones the node outgrows by itself (its renewal
makes a newer certificate, its re-join a fresh one, its clock is set); they travel as `Conflict`, and the
others as `Unauthenticated`, which the agent takes as final.

    unknown              the serial is not in node_certs, or names another node          refused
    session-certificate  the certificate is itself a session certificate                 refused
    not-tpm              the certificate names no TPM attestation key (a file key)       refused: TLS takes that key
    revoked              the certificate was revoked                                     new token: bc join --reset
    old-identity         a later join replaced the identity generation                  new token: bc join --reset
    not-latest           a newer certificate of this generation exists                  retry (renew, then ask)
    expired              the certificate has expired                                    retry (re-join, then ask)
    stale-timestamp      the timestamp is more than 5 min from the store's clock        retry (check the clock)
    issue                otherwise                                                       a session certificate
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

from bc.errors import BcError, CertificateRevoked, Conflict, Unauthenticated, UsageError

SESSION_PROOF_DOMAIN = b"bc.v1/session-cert\n"
SESSION_OF_PREFIX = "urn:bc:session-of:"
SESSION_SKEW_MS = 5 * 60_000
SESSION_MAX_TTL_S = 24 * 3600
NONCE_BYTES = 16

Verdict = Literal[
    "unknown",
    "session-certificate",
    "not-tpm",
    "revoked",
    "old-identity",
    "not-latest",
    "expired",
    "stale-timestamp",
    "issue",
]

RESET_HINT = "join again with a new token: bc join --reset --yes, then bc join"


@dataclass(frozen=True)
class CertFacts:
    """What the store knows of the certificate a session-certificate request presents (times: ms, store time)."""

    known: bool  # a row in node_certs for this serial and this node
    session: bool  # that row is itself a session certificate
    attested: bool  # the certificate names a TPM attestation key
    revoked: bool
    not_after_ms: int
    current_generation: bool  # the certificate's identity generation is the node's current one
    latest: bool  # no later node certificate (session certificates aside) of the node and generation exists


def decide(facts: CertFacts, timestamp_ms: int, now_ms: int, skew_ms: int = SESSION_SKEW_MS) -> Verdict:
    """Whether `facts`' certificate may certify a session key at `now_ms` (the table in the module docstring)."""
    if not facts.known:
        return "unknown"
    if facts.session:
        return "session-certificate"
    if not facts.attested:
        return "not-tpm"
    if facts.revoked:
        return "revoked"
    if not facts.current_generation:
        return "old-identity"
    if not facts.latest:
        return "not-latest"
    if now_ms >= facts.not_after_ms:
        return "expired"
    if abs(timestamp_ms - now_ms) > skew_ms:
        return "stale-timestamp"
    return "issue"


def session_not_after_ms(node_not_after_ms: int, now_ms: int, max_ttl_s: int = SESSION_MAX_TTL_S) -> int:
    """When a session certificate issued at `now_ms` ends: in 24 h, or when the node certificate does if sooner."""
    return min(now_ms + max_ttl_s * 1000, node_not_after_ms)


def refusal(verdict: Verdict, node_id: str, serial: str, not_after_ms: int, off_ms: int = 0) -> BcError:
    """The one sentence (and typed error) for a verdict other than "issue"; `off_ms`: the timestamp's offset."""
    when = datetime.fromtimestamp(not_after_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    cert = f"certificate {serial} of node {node_id}"
    if verdict == "unknown":
        return Unauthenticated(f"{cert} is not a certificate this server issued to that node")
    if verdict == "session-certificate":
        return Unauthenticated(f"{cert} is a session certificate, which certifies no other key")
    if verdict == "not-tpm":
        return Unauthenticated(
            f"{cert} names no TPM attestation key: its key is in a file, which the session's TLS uses itself;"
            " session certificates are for keys a TPM holds"
        )
    if verdict == "revoked":
        return CertificateRevoked(f"{cert} was revoked, so it gets no session certificate; {RESET_HINT}")
    if verdict == "old-identity":
        return Unauthenticated(f"{cert} belongs to an older identity of the node; {RESET_HINT}")
    if verdict == "not-latest":
        return Conflict(
            f"{cert} is not the node's latest certificate; a session certificate is asked for with the latest one"
        )
    if verdict == "expired":
        return Conflict(f"{cert} expired at {when}; the node re-joins first (Join.Rejoin), then asks again")
    if verdict == "stale-timestamp":
        return Conflict(
            f"the session certificate request's timestamp is {off_ms / 1000:+.0f} s from the server's clock"
            f" (at most ±{SESSION_SKEW_MS // 1000} s); check the node's clock"
        )
    raise ValueError(f"{verdict!r} is not a refusal")


def session_proof_message(
    node_id: str, serial: str, cert_der: bytes, csr_der: bytes, timestamp_ms: int, nonce: bytes
) -> bytes:
    """The exact bytes the node certificate's key signs (see the module docstring)."""
    return (
        SESSION_PROOF_DOMAIN
        + node_id.encode("ascii")
        + b"\n"
        + serial.encode("ascii")
        + b"\n"
        + str(int(timestamp_ms)).encode("ascii")
        + b"\n"
        + nonce
        + hashlib.sha256(cert_der).digest()
        + hashlib.sha256(csr_der).digest()
    )


def check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_BYTES:
        raise UsageError(f"the session certificate request's nonce must be {NONCE_BYTES} bytes, not {len(nonce)}")


def verify_session_proof(
    cert: x509.Certificate,
    node_id: str,
    cert_der: bytes,
    csr_der: bytes,
    timestamp_ms: int,
    nonce: bytes,
    proof: bytes,
) -> None:
    """Raise `Unauthenticated` unless `proof` is `cert`'s key asking for this session key for `node_id`."""
    check_nonce(nonce)
    pub = cert.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise Unauthenticated("the node certificate's key is not an ECDSA key")
    message = session_proof_message(node_id, format(cert.serial_number, "x"), cert_der, csr_der, timestamp_ms, nonce)
    try:
        pub.verify(proof, message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise Unauthenticated(
            "the session certificate request's proof was not made by the node certificate's key"
        ) from None


def sign_session_proof(
    key: ec.EllipticCurvePrivateKey,
    node_id: str,
    serial: str,
    cert_der: bytes,
    csr_der: bytes,
    timestamp_ms: int,
    nonce: bytes,
) -> bytes:
    """The proof (DER ECDSA-SHA256) by a key `cryptography` holds (tests; the agent signs in the TPM)."""
    message = session_proof_message(node_id, serial, cert_der, csr_der, timestamp_ms, nonce)
    return key.sign(message, ec.ECDSA(hashes.SHA256()))


def session_of(cert: x509.Certificate) -> str | None:
    """The serial of the node certificate a session certificate was issued against, or None for any other."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(SESSION_OF_PREFIX):
            return uri.removeprefix(SESSION_OF_PREFIX)
    return None


def session_of_uri(serial: str) -> str:
    return SESSION_OF_PREFIX + serial
