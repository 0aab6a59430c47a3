"""A TPM's endorsement key (EK) certificate and the activation of its attestation key (AK), judged without a TPM.

On a first join with `--attestor tpm`, when the operator listed the EK CAs it trusts (`EK_ROOTS_FILE` beside the
cluster CA), the server takes the AK on the TPM's word rather than the token's:

1. the node sends the EK's certificate (from the TPM's NV index) and the AK's TPM2B_PUBLIC;
2. `ek_public_key` checks that the certificate chains, signature by signature, to a self-signed root in the
   operator's file (every intermediate must be there too), each certificate valid now, and that its key is RSA;
   `ak_name` checks the AK's public area (a restricted signing key the TPM made and keeps, the key the token's
   certification names) and gives its TPM name;
3. the server seals a fresh 32-byte secret to the EK for that name (`bc.pki.tpm_credential.make_credential`)
   and answers with it and a ticket: the CA key's signature over the request's parts, the secret's SHA-256 and
   an expiry (`ticket_message`). The server keeps nothing: the ticket is its memory, and the node learns only a
   hash of the secret;
4. the node's TPM recovers the secret (`TPM2_ActivateCredential`), which only the TPM holding that EK and an AK
   of exactly that name can do, and the node joins again with the secret and the ticket; `check_activation`
   verifies the ticket and the secret, and the join goes on as without roots.

Every refusal is one sentence saying which check failed (`Unauthenticated`).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bc.errors import Unauthenticated, UsageError
from bc.pki import tpm_attest, tpm_credential

EK_ROOTS_FILE = "tpm-ek-roots.pem"
"""Beside the CA (`<bc serve data dir>/pki/`): the EK CAs' certificates (roots and intermediates), PEM."""
TICKET_TTL_MS = 5 * 60 * 1000
SECRET_BYTES = 32
MAX_CHAIN = 5
AK_ATTRIBUTES = (
    tpm_attest.FIXED_TPM
    | tpm_attest.FIXED_PARENT
    | tpm_attest.SENSITIVE_DATA_ORIGIN
    | tpm_attest.RESTRICTED
    | tpm_attest.SIGN
)

NO_EK_CERT = (
    "this server checks a TPM's attestation key against its endorsement key certificate, and the join sent none"
    " (the TPM has no EK certificate at NV index 0x01c00002, or bc join is older than this server)"
)


def load_roots(pem: bytes, where: str) -> list[x509.Certificate]:
    """The operator's EK CA certificates; `UsageError` in one sentence when the file holds none or does not parse."""
    try:
        roots = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise UsageError(f"{where} is not a file of PEM certificates (the TPM EK CAs bc serve trusts)") from None
    return roots


def _valid_at(cert: x509.Certificate, now: datetime.datetime, what: str) -> None:
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise Unauthenticated(
            f"the TPM's endorsement key certificate does not chain to an EK CA this server trusts: {what}"
            f" ({_named(cert.subject) or 'no subject'}) is not valid now"
        )


def ek_public_key(ek_der: bytes, roots: Sequence[x509.Certificate], now: datetime.datetime) -> rsa.RSAPublicKey:
    """The EK's public key, once its certificate chains to a self-signed root among `roots` (see the module)."""
    try:
        cert = x509.load_der_x509_certificate(ek_der)
    except ValueError:
        raise Unauthenticated("the TPM's endorsement key certificate does not parse") from None
    _valid_at(cert, now, "the EK certificate")
    key = cert.public_key()
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size < 2048:
        raise Unauthenticated(
            "the TPM's endorsement key is not an RSA key of 2048 bits or more; only RSA EKs are taken"
        )
    here = cert
    for _ in range(MAX_CHAIN):
        issuer = _issuer(here, roots)
        if issuer is None:
            raise Unauthenticated(
                "the TPM's endorsement key certificate does not chain to an EK CA this server trusts: no certificate"
                f" in {EK_ROOTS_FILE} issued {_named(here.subject) or 'the EK certificate'}"
                f" (issuer {_named(here.issuer)})"
            )
        _valid_at(issuer, now, "the EK CA")
        if issuer.subject == issuer.issuer and _issuer(issuer, [issuer]) is issuer:
            return key  # a self-signed root the operator listed
        here = issuer
    raise Unauthenticated(f"the TPM's endorsement key certificate's chain is longer than {MAX_CHAIN} certificates")


def _named(name: x509.Name) -> str:
    """A name a node sent, for a sentence: printable, at most 120 characters."""
    text = "".join(c if c.isprintable() else "?" for c in name.rfc4514_string())
    return text if len(text) <= 120 else text[:117] + "..."


def _issuer(cert: x509.Certificate, pool: Sequence[x509.Certificate]) -> x509.Certificate | None:
    for candidate in pool:
        try:
            cert.verify_directly_issued_by(candidate)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return candidate
    return None


def ak_name(ak_public: bytes, ak_spki_der: bytes) -> bytes:
    """The TPM name of the AK whose TPM2B_PUBLIC is `ak_public`: it must be the key the certification named
    (`ak_spki_der`) and a restricted signing key the TPM made and will never export."""
    public = tpm_attest.parse_public(ak_public)
    if tpm_attest.spki(public.key) != ak_spki_der:
        raise Unauthenticated("the attestation key's public area is not the key that certified the node key")
    if public.attributes & AK_ATTRIBUTES != AK_ATTRIBUTES or public.attributes & tpm_attest.DECRYPT:
        raise Unauthenticated(
            "the attestation key is not a restricted signing key the TPM made and keeps (fixedTPM, fixedParent,"
            " sensitiveDataOrigin, restricted, sign)"
        )
    return public.name


@dataclass(frozen=True)
class Ticket:
    """What the server remembers of a challenge, in the node's hands: an expiry, the secret's hash, the CA's word."""

    expires_ms: int
    secret_sha256: bytes
    signature: bytes

    def dump(self) -> bytes:
        return struct.pack(">Q", self.expires_ms) + self.secret_sha256 + self.signature

    @staticmethod
    def load(data: bytes) -> Ticket:
        if len(data) < 8 + 32 + 8 or len(data) > 8 + 32 + 128:
            raise Unauthenticated("the TPM activation's ticket is not one this server gives")
        return Ticket(struct.unpack(">Q", data[:8])[0], data[8:40], data[40:])


def ticket_message(
    token_id: str, csr_der: bytes, ek_der: bytes, ak_public: bytes, expires_ms: int, secret_sha256: bytes
) -> bytes:
    """What the CA key signs in a ticket: the challenge's token, CSR, EK certificate and AK, its expiry and secret."""
    return b"".join(
        [
            b"bc.v1/tpm-activation\n",
            token_id.encode(),
            b"\n",
            str(expires_ms).encode(),
            b"\n",
            hashlib.sha256(csr_der).digest(),
            hashlib.sha256(ek_der).digest(),
            hashlib.sha256(ak_public).digest(),
            secret_sha256,
        ]
    )


def check_activation(
    ca_key: ec.EllipticCurvePublicKey,
    ticket_bytes: bytes,
    secret: bytes,
    *,
    token_id: str,
    csr_der: bytes,
    ek_der: bytes,
    ak_public: bytes,
    now_ms: int,
) -> None:
    """Refuse (one sentence) unless `ticket_bytes` is this CA's for exactly this request, unexpired, and `secret` is
    the one it sealed."""
    ticket = Ticket.load(ticket_bytes)
    message = ticket_message(token_id, csr_der, ek_der, ak_public, ticket.expires_ms, ticket.secret_sha256)
    try:
        ca_key.verify(ticket.signature, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise Unauthenticated("the TPM activation's ticket is not this server's for this join request") from None
    if ticket.expires_ms <= now_ms:
        raise Unauthenticated("the TPM activation took longer than 5 minutes; run bc join again")
    if not hmac.compare_digest(hashlib.sha256(secret).digest(), ticket.secret_sha256):
        raise Unauthenticated(
            "the TPM did not recover the activation secret: its attestation key is not in the TPM whose endorsement"
            " key certificate was sent"
        )


@dataclass(frozen=True)
class Challenge:
    credential: bytes
    secret: bytes
    ticket: bytes


def make_challenge(
    sign: Callable[[bytes], bytes],
    roots: Sequence[x509.Certificate],
    now_ms: int,
    *,
    token_id: str,
    csr_der: bytes,
    ek_der: bytes,
    ak_public: bytes,
    ak_spki_der: bytes,
    secret: bytes,
    seed: bytes,
) -> Challenge:
    """The challenge of a join whose token and AK certification were checked: `secret` sealed to the EK the
    certificate names (once it chains to `roots`) for the AK's name, and the ticket `sign` (the CA key) makes."""
    if not ek_der:
        raise Unauthenticated(NO_EK_CERT)
    if not ak_public:
        raise Unauthenticated("the join sent no attestation key public area for the TPM to activate a credential with")
    now = datetime.datetime.fromtimestamp(now_ms / 1000, datetime.UTC)
    ek = ek_public_key(ek_der, roots, now)
    name = ak_name(ak_public, ak_spki_der)
    credential, sealed = tpm_credential.make_credential(ek, name, secret, seed)
    expires_ms = now_ms + TICKET_TTL_MS
    digest = hashlib.sha256(secret).digest()
    signature = sign(ticket_message(token_id, csr_der, ek_der, ak_public, expires_ms, digest))
    return Challenge(credential, sealed, Ticket(expires_ms, digest, signature).dump())
