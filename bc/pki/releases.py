"""Release signatures: what `bc release publish` signs and what a node verifies before a swap.

A release key is an Ed25519 key (a PKCS#8 PEM file, 0600, kept by whoever
builds releases; `bc release key add --generate` makes one). It signs one
statement per release:

    b"bc.v1/release\\n" + version + "\\n" + sha256 (lowercase hex) + "\\n" + size

The sequence is not signed: `bc serve` assigns it at publish, and it reaches a
node inside a worker-signed command or spec. A node trusts the release keys
its trust bundle carries, and takes a new one only under a command-signing
root's own signature: the whole bundle's, or the key's endorsement

    b"bc.v1/release-key-root\n" + raw public key

(`endorse`), which travels with the key in the worker-signed bundle, so the
root can sign it on the operator's machine (`bc release key add --root-key`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.errors import UsageError
from bc.pki.keys import write_file_atomic
from bc.protocol.pb import kinds_pb2

VERSION_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
MAX_SIZE = 1 << 31


class BadRelease(Exception):
    """A release whose fields, digest or signature do not hold; the message is one sentence."""


def statement(version: str, sha256: str, size: int) -> bytes:
    return f"bc.v1/release\n{version}\n{sha256}\n{size}".encode()


def key_id(public_key: bytes) -> str:
    return "sha256:" + hashlib.sha256(public_key).hexdigest()


def check_fields(version: str, sha256: str, size: int) -> None:
    """BadRelease for a version, digest or size that could not name a release."""
    if not VERSION_RE.fullmatch(version):
        raise BadRelease(f"{version!r} is not a release version (letters, digits, . + _ -, at most 64)")
    if not SHA256_RE.fullmatch(sha256):
        raise BadRelease("the sha256 is not 64 lowercase hex digits")
    if not 0 < size <= MAX_SIZE:
        raise BadRelease(f"a release is 1 byte to 2 GiB, not {size}")


def sign(key: ed25519.Ed25519PrivateKey, version: str, sha256: str, size: int) -> bytes:
    check_fields(version, sha256, size)
    return key.sign(statement(version, sha256, size))


def verify(public_keys: Iterable[bytes], version: str, sha256: str, size: int, signature: bytes) -> str:
    """The key id that signed this release; BadRelease when none of `public_keys` did."""
    check_fields(version, sha256, size)
    keys = list(public_keys)
    if not keys:
        raise BadRelease("no release key is trusted here (bc release key add)")
    message = statement(version, sha256, size)
    for raw in keys:
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(signature, message)
        except (InvalidSignature, ValueError):
            continue
        return key_id(raw)
    raise BadRelease(f"the signature of release {version} does not verify under any trusted release key")


def endorsement_message(public_key: bytes) -> bytes:
    """What a command-signing root signs to trust a release key (`ReleaseKeyEndorsement.root_signature`)."""
    return b"bc.v1/release-key-root\n" + public_key


def endorse(root_key: ed25519.Ed25519PrivateKey, public_key: bytes) -> bytes:
    """The root's signature of a release key: made by bc serve holding the root, or where the file is."""
    return root_key.sign(endorsement_message(public_key))


def endorsed_by(root_public: ed25519.Ed25519PublicKey, public_key: bytes, signature: bytes) -> bool:
    try:
        root_public.verify(signature, endorsement_message(public_key))
    except InvalidSignature:
        return False
    return True


def public_bytes(key: ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey) -> bytes:
    pub = key.public_key() if isinstance(key, ed25519.Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """The release key in `path`; UsageError in one sentence when it is missing or not an Ed25519 key."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read the release key {path}: {e.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise UsageError(f"{path} is not a PEM private key") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"{path} is not an Ed25519 private key")
    return key


def load_public(path: Path) -> bytes:
    """A raw Ed25519 public key from a private or public PEM file."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    if b"PRIVATE KEY" in data:
        return public_bytes(load_key(path))
    try:
        pub = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise UsageError(f"{path} is neither an Ed25519 private nor public PEM key") from None
    if not isinstance(pub, ed25519.Ed25519PublicKey):
        raise UsageError(f"{path} is not an Ed25519 key")
    return public_bytes(pub)


def generate_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """A new release key written to `path` (0600, atomically); UsageError if the file exists."""
    if path.exists():
        raise UsageError(f"{path} exists; a release key is never overwritten")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_file_atomic(path, pem, mode=0o600)
    return key


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256 hex, size) of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


class ReleaseFields(Protocol):
    """What a release record (`ReleaseInfo`) and a `daemon` section both carry about one release."""

    version: str
    url: str
    sha256: str
    signature: bytes
    sequence: int
    size: int


def upgrade_request(r: ReleaseFields) -> kinds_pb2.DaemonUpgradeRequest:
    """The `daemon.upgrade` payload that installs release `r`."""
    return kinds_pb2.DaemonUpgradeRequest(
        version=r.version, url=r.url, sha256=r.sha256, signature=r.signature, sequence=r.sequence, size=r.size
    )
