"""P-256 keys and certificates to and from PEM, written to disk safely.

Private keys are written atomically (a temporary file in the same directory,
fsynced, then renamed) with mode 0600 from the moment they exist, so a crash
leaves either the old key or the new one and never a readable half. A
directory we create for them is 0700.

`fingerprint()` is the one way we name a certificate: "sha256:" and the
lowercase hex SHA-256 of its DER. Join tokens pin the CA by it.

Certificate serials come from the injected Random (`serial_number`), like every
other id: a serial must be unique under its issuer, not secret (what an
unpredictable serial once guarded against, a chosen-prefix collision, needs a
broken hash, and we sign with SHA-256 and Ed25519).
"""

from __future__ import annotations

import hashlib
import os
import random
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bc.errors import UsageError
from bc.runtime.files import atomic_write

PrivateKey = ec.EllipticCurvePrivateKey
PublicKey = ec.EllipticCurvePublicKey


def generate_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 private key from OpenSSL's CSPRNG: for keys made by a client (the CLI, a node).

    The control plane makes its keys through `bc.pki.secrets_source`, so the simulator can replay them.
    """
    return ec.generate_private_key(ec.SECP256R1())


SERIAL_BITS = 159
"""RFC 5280 allows 20 octets, and a serial must be positive: 159 random bits, never 0."""


def serial_number(rng: random.Random) -> int:
    while True:
        n = rng.getrandbits(SERIAL_BITS)
        if n:
            return n


def is_p256(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> bool:
    return isinstance(key.curve, ec.SECP256R1)


def key_to_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM: what grpcio takes, and what `openssl` reads."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_key_pem(data: bytes) -> ec.EllipticCurvePrivateKey:
    """Parse a PEM private key, refusing anything but P-256 (grpcio would refuse it later, less clearly)."""
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise UsageError(f"the private key is not a readable unencrypted PEM key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not is_p256(key):
        raise UsageError("the private key is not an ECDSA P-256 key")
    return key


def cert_to_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def load_cert_pem(data: bytes) -> x509.Certificate:
    """Parse the first certificate of a PEM blob."""
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as e:
        raise UsageError(f"the certificate is not a readable PEM certificate: {e}") from None


def fingerprint(cert: x509.Certificate) -> str:
    """ "sha256:" + lowercase hex SHA-256 of the certificate's DER encoding."""
    der = cert.public_bytes(serialization.Encoding.DER)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def utc(ts: float) -> datetime:
    """Epoch seconds (from an injected `Clock`) to the aware datetime `cryptography` wants."""
    return datetime.fromtimestamp(ts, tz=UTC)


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write `key` as PEM to `path` atomically, mode 0600; create the parent 0700 if missing."""
    atomic_write(path, key_to_pem(key), mode=0o600)


PRIVATE_MODE = 0o600
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def make_private_sqlite(path: Path) -> None:
    """Create the SQLite file `path` 0600 if missing, and narrow it and its side files to 0600. Blocking.

    The umask and the directory's mode do not matter: the file is fchmod'ed after it is opened, and SQLite
    creates `-wal`/`-shm` with its database file's mode, so a store or journal never leaks to other users.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_MODE)  # masked by the umask: fchmod below
    try:
        os.fchmod(fd, PRIVATE_MODE)
    finally:
        os.close(fd)
    for suffix in SQLITE_SIDE_FILES:
        try:
            os.chmod(f"{path}{suffix}", PRIVATE_MODE)
        except FileNotFoundError:
            pass
