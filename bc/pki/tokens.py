"""One-time join tokens: `bc1.<token_id>.<secret>.<pin>`.

* token_id: 12 lowercase hex characters, the public name (stored, logged).
* secret: 32 random bytes, base64url without padding (43 characters). The
  server stores only "sha256:<hex>" of it.
* pin: the raw SHA-256 of the CA certificate, base64url without padding; a
  joining node trusts only a server whose presented chain holds that CA
  (`bc.pki.discovery`). The whole token is one 104-character line.

How a node proves it holds the secret without sending it: the secret
deterministically derives a P-256 "token key" (`derive_token_key`). At token
creation the server stores the public half, as a self-signed certificate
(`token_root_cert`, in `join_tokens.root_cert_pem`); the node derives the same
key and signs a proof (`join_proof`) over the token id and the SHA-256 of its
CSR, which the Join handler checks against the stored key
(`verify_join_proof`). The proof is bound to the CSR, so it cannot be moved to
another request for another key.

The TLS layer does not know about tokens. A joining node has no certificate
from the cluster CA yet, so it presents a short-lived leaf under the install's
one join root (`join_root_cert`): a P-256 key derived by HKDF from the CA
fingerprint (the token's pin), public to anyone who knows that fingerprint.
Every process computes the same root from the CA certificate, byte for byte,
and trusts it beside the CA, so the server's TLS configuration changes only
when the CA does, never per token. That root grants nothing: every handler
but Join requires a certificate the cluster CA signed
(`bc.pki.identity.peer_identity`), and Join requires the proof.

Base64 is parsed canonically (re-encoding must give the same text), so no two
distinct strings parse to the same token.

The token id and the token certificate's serial come from the injected
Random (they are public names); the secret from the injected `Secrets`. The
node's join leaf is made on the node, for a key made there, so its serial is
derived from that key (`_leaf_serial`): the node needs no Random for a
certificate that lives ten minutes and proves nothing by itself. The join
root's serial is derived from the CA fingerprint, and its signature is
deterministic (RFC 6979), so the root is the same bytes everywhere.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bc.errors import UsageError
from bc.pki import keys
from bc.pki.secrets_source import P256_ORDER, Secrets
from bc.seams.clock import Clock

PREFIX = "bc1"
SECRET_BYTES = 32
JOIN_LEAF_LIFETIME_S = 600
BACKDATE_S = 60

_TOKEN_ID = re.compile(r"[0-9a-f]{12}")
_B64_32 = re.compile(r"[A-Za-z0-9_-]{43}")
_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")
_KEY_INFO = b"bc join token key v1"
_JOIN_ROOT_INFO = b"bc join root key v1"
_JOIN_ROOT_SERIAL = b"bc join root serial v1\x00"
_PROOF_DOMAIN = b"bc join proof v1\x00"
JOIN_ROOT_NAME = "bc join"
# Fixed, so that every process makes the same root: the CA's lifetime bounds it in practice.
_JOIN_ROOT_NOT_BEFORE = datetime(2000, 1, 1, tzinfo=UTC)
_JOIN_ROOT_NOT_AFTER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


@dataclass
class ParsedToken:
    token_id: str
    secret: bytes
    ca_pin: str  # "sha256:<hex>", as `keys.fingerprint` writes it


@dataclass
class NewToken:
    token: str  # shown to the operator once, never stored
    token_id: str
    secret_hash: str  # "sha256:<hex>" of the secret
    root_cert_pem: bytes
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64_32(text: str, what: str) -> bytes:
    if not _B64_32.fullmatch(text):
        raise UsageError(f"the join token is malformed: the {what} is not 43 base64url characters")
    data = base64.urlsafe_b64decode(text + "=")
    if _b64(data) != text:
        raise UsageError(f"the join token is malformed: the {what} is not canonical base64url")
    return data


def format_token(token_id: str, secret: bytes, ca_pin: str) -> str:
    """The one-line text form; `parse_token` is its inverse."""
    if not _TOKEN_ID.fullmatch(token_id) or len(secret) != SECRET_BYTES or not _FINGERPRINT.fullmatch(ca_pin):
        raise UsageError("a join token needs a 12-hex-character id, a 32-byte secret and a sha256:<hex> pin")
    pin = bytes.fromhex(ca_pin.removeprefix("sha256:"))
    return f"{PREFIX}.{token_id}.{_b64(secret)}.{_b64(pin)}"


def parse_token(text: str) -> ParsedToken:
    """Parse a pasted token; anything off is a `UsageError` that says what."""
    parts = text.strip().split(".")
    if len(parts) != 4:
        raise UsageError(f"the join token is malformed: expected 4 dot-separated parts, got {len(parts)}")
    prefix, token_id, secret_text, pin_text = parts
    if prefix != PREFIX:
        raise UsageError(f"the join token is malformed: it must start with {PREFIX!r}.")
    if not _TOKEN_ID.fullmatch(token_id):
        raise UsageError("the join token is malformed: the token id is not 12 lowercase hex characters")
    secret = _unb64_32(secret_text, "secret")
    pin = _unb64_32(pin_text, "CA pin")
    return ParsedToken(token_id=token_id, secret=secret, ca_pin="sha256:" + pin.hex())


def hash_secret(secret: bytes) -> str:
    return "sha256:" + hashlib.sha256(secret).hexdigest()


def secret_matches(secret: bytes, secret_hash: str) -> bool:
    """Whether `secret` hashes to the stored `secret_hash`, compared in constant time."""
    return hmac.compare_digest(hash_secret(secret).encode(), secret_hash.encode())


def _derive_p256(ikm: bytes, info: bytes) -> ec.EllipticCurvePrivateKey:
    """A P-256 key from HKDF-SHA256 (48 bytes, mod n-1, +1).

    48 bytes (128 bits more than the order) make the modular bias negligible,
    as FIPS 186-5 A.2.1 does.
    """
    okm = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=info).derive(ikm)
    d = int.from_bytes(okm, "big") % (P256_ORDER - 1) + 1
    return ec.derive_private_key(d, ec.SECP256R1())


def derive_token_key(secret: bytes) -> ec.EllipticCurvePrivateKey:
    """The P-256 key both ends derive from the token's secret: what signs the join proof."""
    return _derive_p256(secret, _KEY_INFO)


def join_root_key(ca_fingerprint: str) -> ec.EllipticCurvePrivateKey:
    """The install's join-root key, from the CA fingerprint alone: public, and meant to be."""
    if not _FINGERPRINT.fullmatch(ca_fingerprint):
        raise UsageError(f"the CA fingerprint {ca_fingerprint!r} is not of the form sha256:<64 hex>")
    return _derive_p256(ca_fingerprint.encode("ascii"), _JOIN_ROOT_INFO)


def _join_root_name() -> x509.Name:
    # The leaf's issuer name must equal the root's subject byte for byte; both come from here.
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, JOIN_ROOT_NAME)])


def _ca_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


@lru_cache(maxsize=8)
def join_root_cert(ca_fingerprint: str) -> x509.Certificate:
    """The install's one join root, the same bytes in every process: TLS trusts it beside the CA.

    Fixed validity window, serial from the fingerprint, deterministic ECDSA (RFC 6979).
    """
    key = join_root_key(ca_fingerprint)
    pub = key.public_key()
    digest = hashlib.sha256(_JOIN_ROOT_SERIAL + ca_fingerprint.encode("ascii")).digest()
    return (
        x509.CertificateBuilder()
        .subject_name(_join_root_name())
        .issuer_name(_join_root_name())
        .public_key(pub)
        .serial_number((int.from_bytes(digest[:20], "big") >> 1) or 1)
        .not_valid_before(_JOIN_ROOT_NOT_BEFORE)
        .not_valid_after(_JOIN_ROOT_NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_ca_key_usage(), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
        .sign(key, hashes.SHA256(), ecdsa_deterministic=True)
    )


def join_root_pem(ca_fingerprint: str) -> bytes:
    return keys.cert_to_pem(join_root_cert(ca_fingerprint))


def token_root_cert(
    token_id: str, key: ec.EllipticCurvePrivateKey, not_after: float, clock: Clock, rng: random.Random
) -> x509.Certificate:
    """The token key's public half as a self-signed certificate, valid until the token expires.

    Stored (`join_tokens.root_cert_pem`) for the Join handler to check the proof with; no TLS
    configuration holds it.
    """
    pub = key.public_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"bc join token {token_id}")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pub)
        .serial_number(keys.serial_number(rng))
        .not_valid_before(keys.utc(clock.now() - BACKDATE_S))
        .not_valid_after(keys.utc(not_after))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_ca_key_usage(), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
        .sign(key, hashes.SHA256())
    )


def create_token(ca_fingerprint: str, ttl_s: float, clock: Clock, rng: random.Random, secrets: Secrets) -> NewToken:
    """A new token pinning `ca_fingerprint`; the caller stores everything but `token`."""
    if not _FINGERPRINT.fullmatch(ca_fingerprint):
        raise UsageError(f"the CA fingerprint {ca_fingerprint!r} is not of the form sha256:<64 hex>")
    if ttl_s <= 0:
        raise UsageError(f"a join token's lifetime must be positive, got {ttl_s} s")
    token_id = f"{rng.getrandbits(48):012x}"
    secret = secrets.token_bytes(SECRET_BYTES)
    expires_at = clock.now() + ttl_s
    # The token's validity is decided by the store, not by this certificate's dates.
    root = token_root_cert(token_id, derive_token_key(secret), expires_at, clock, rng)
    return NewToken(
        token=format_token(token_id, secret, ca_fingerprint),
        token_id=token_id,
        secret_hash=hash_secret(secret),
        root_cert_pem=keys.cert_to_pem(root),
        expires_at=expires_at,
    )


def _leaf_serial(key: ec.EllipticCurvePrivateKey) -> int:
    """159 bits of the SHA-256 of the public key, never 0: unique per key, as a serial must be per issuer."""
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return (int.from_bytes(hashlib.sha256(der).digest()[:20], "big") >> 1) or 1


def join_client_credentials(parsed: ParsedToken, clock: Clock) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM) for the Join call's TLS: an ephemeral key under the install's join root.

    The root's key comes from the token's CA pin, so the node needs no copy of
    the root: the leaf names the root's subject as issuer and is signed by the
    derived key, which is all chain building needs. The leaf proves nothing
    about the token; `join_proof` in the request does.
    """
    return _join_leaf(parsed.ca_pin, f"join:{parsed.token_id}", clock)


def rejoin_client_credentials(ca_fingerprint: str, node_id: str, clock: Clock) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM) for a Rejoin call's TLS: a leaf under the join root, as a join's, naming
    `rejoin:<node id>`. It proves nothing; the expired certificate's key proves the re-join (`bc.pki.rejoin`)."""
    return _join_leaf(ca_fingerprint, f"rejoin:{node_id}", clock)


def _join_leaf(ca_fingerprint: str, common_name: str, clock: Clock) -> tuple[bytes, bytes]:
    root_key = join_root_key(ca_fingerprint)
    leaf_key = keys.generate_key()
    now = clock.now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(_join_root_name())
        .public_key(leaf_key.public_key())
        .serial_number(_leaf_serial(leaf_key))
        .not_valid_before(keys.utc(now - BACKDATE_S))
        .not_valid_after(keys.utc(now + JOIN_LEAF_LIFETIME_S))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()), critical=False)
        .sign(root_key, hashes.SHA256())
    )
    return keys.key_to_pem(leaf_key), keys.cert_to_pem(cert)


def _proof_message(token_id: str, csr_der: bytes) -> bytes:
    # The token id is 12 hex characters, so the separator only makes the framing plain to read.
    return _PROOF_DOMAIN + token_id.encode("ascii") + b"\x00" + hashlib.sha256(csr_der).digest()


def join_proof(secret: bytes, token_id: str, csr_der: bytes) -> bytes:
    """The token key's ECDSA signature over the token id and this CSR: `JoinRequest.token_proof`.

    Deterministic (RFC 6979): the same request gives the same bytes, on the node and in the simulations.
    """
    algorithm = ec.ECDSA(hashes.SHA256(), deterministic_signing=True)
    return derive_token_key(secret).sign(_proof_message(token_id, csr_der), algorithm)


def verify_join_proof(root_cert_pem: bytes, token_id: str, csr_der: bytes, proof: bytes) -> bool:
    """Whether `proof` is the stored token key's signature over `token_id` and `csr_der`."""
    pub = x509.load_pem_x509_certificate(root_cert_pem).public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        return False
    try:
        pub.verify(proof, _proof_message(token_id, csr_der), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True
