"""One-time join tokens: `bc1.<token_id>.<secret>.<pin>`.

* token_id: 12 lowercase hex characters, the public name (stored, logged).
* secret: 32 random bytes, base64url without padding (43 characters). The
  server stores only "sha256:<hex>" of it.
* pin: the raw SHA-256 of the CA certificate, base64url without padding; a
  joining node trusts only a server whose presented chain holds that CA
  (`bc.pki.discovery`). The whole token is one 104-character line.

How a node proves it holds the secret without sending it before it trusts the
server: the secret deterministically derives a P-256 "token key". At token
creation the server makes a self-signed root for that key
(`token_root_cert`) and trusts it for client authentication until the token
is used or expires. The node derives the same key, signs a short-lived leaf
for a fresh ephemeral key (`join_client_credentials`), and presents it in
mutual TLS. The Join handler then checks the leaf with
`bc.pki.identity.join_leaf_identity` and may additionally ask for the
secret's hash. Anyone who can sign with the token key could equally present
a leaf claiming `node:…`; `peer_identity` refuses it because the cluster CA
did not sign it.

Base64 is parsed canonically (re-encoding must give the same text), so no two
distinct strings parse to the same token.

The token id and the root's serial come from the injected Random (they are
public names); the secret from the injected `Secrets`. The node's join leaf is
made on the node, for a key made there, so its serial is derived from that
key (`_leaf_serial`): the node needs no Random for a certificate that lives
ten minutes and is checked only against the token's root.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bc.clock import Clock
from bc.errors import UsageError
from bc.pki import keys
from bc.pki.secrets_source import P256_ORDER, Secrets

PREFIX = "bc1"
SECRET_BYTES = 32
JOIN_LEAF_LIFETIME_S = 600
BACKDATE_S = 60

_TOKEN_ID = re.compile(r"[0-9a-f]{12}")
_B64_32 = re.compile(r"[A-Za-z0-9_-]{43}")
_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")
_KEY_INFO = b"bc join token key v1"


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


def derive_token_key(secret: bytes) -> ec.EllipticCurvePrivateKey:
    """The P-256 key both ends derive from the secret (HKDF-SHA256, 48 bytes, mod n-1, +1).

    48 bytes (128 bits more than the order) make the modular bias negligible,
    as FIPS 186-5 A.2.1 does.
    """
    okm = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=_KEY_INFO).derive(secret)
    d = int.from_bytes(okm, "big") % (P256_ORDER - 1) + 1
    return ec.derive_private_key(d, ec.SECP256R1())


def _root_name(token_id: str) -> x509.Name:
    # The leaf's issuer name must equal the root's subject byte for byte; both come from here.
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"bc join token {token_id}")])


ROOT_GRACE_S = 7 * 24 * 3600


def token_root_cert(
    token_id: str, key: ec.EllipticCurvePrivateKey, not_after: float, clock: Clock, rng: random.Random
) -> x509.Certificate:
    """The self-signed root the server trusts for this token's join leaves, valid until `not_after`."""
    pub = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(_root_name(token_id))
        .issuer_name(_root_name(token_id))
        .public_key(pub)
        .serial_number(keys.serial_number(rng))
        .not_valid_before(keys.utc(clock.now() - BACKDATE_S))
        .not_valid_after(keys.utc(not_after))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
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
    # The root outlives the token by a grace period: the server keeps trusting it for TLS so that a
    # late or second use reaches the Join handler and hears "expired" or "already used" in a sentence,
    # instead of a failed handshake. The token's validity is decided by the store, not by this cert.
    root = token_root_cert(token_id, derive_token_key(secret), expires_at + ROOT_GRACE_S, clock, rng)
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
    """(key PEM, certificate PEM) for the Join call: an ephemeral key under the token's root.

    The node needs no copy of the root: the leaf names the root's subject as
    issuer and is signed by the derived key, which is all chain building needs.
    """
    token_key = derive_token_key(parsed.secret)
    leaf_key = keys.generate_key()
    now = clock.now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"join:{parsed.token_id}")]))
        .issuer_name(_root_name(parsed.token_id))
        .public_key(leaf_key.public_key())
        .serial_number(_leaf_serial(leaf_key))
        .not_valid_before(keys.utc(now - BACKDATE_S))
        .not_valid_after(keys.utc(now + JOIN_LEAF_LIFETIME_S))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(token_key.public_key()), critical=False)
        .sign(token_key, hashes.SHA256())
    )
    return keys.key_to_pem(leaf_key), keys.cert_to_pem(cert)
