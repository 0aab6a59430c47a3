"""Release signatures: what `bc release publish` signs and what a node verifies before a swap.

A release key is an Ed25519 key (a PKCS#8 PEM file, 0600, kept by whoever
builds releases; `bc release key add --generate` makes one). It signs one
statement per release (`Release.statement`), every field on its own line:

    bc.v2/release
    name=bc
    version=1.4.0
    sequence=7
    platform=linux-x86_64
    sha256=<64 lowercase hex>
    size=<bytes>

so no field can be moved to another release: not the sequence (a node
refuses a sequence at or below the one it runs, the rollback rule), not the
platform, not another platform's digest. No field can hold a newline, so the
statement reads one way only. The sequence is assigned at publish, one above
every earlier release of that name (`bc release publish` asks `bc serve` for
the next one, signs it, and the server stores it only if it is still the
next). Releases signed before the sequence and platform were covered
(`bc.v1/release`, version, sha256 and size only) verify nowhere: they are
published again (CHANGELOG, docs/self-update.md).

A node trusts the release keys its trust bundle carries, and takes a new one
only under a command-signing root's own signature: the whole bundle's, or the
key's endorsement

    b"bc.v1/release-key-root\n" + raw public key

(`endorse`), which travels with the key in the worker-signed bundle, so the
root can sign it on the operator's machine (`bc release key add --root-key`).
"""

from __future__ import annotations

import hashlib
import platform as _platform
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.errors import UsageError
from bc.protocol.pb import kinds_pb2
from bc.runtime.files import atomic_write

VERSION_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
PLATFORM_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
MAX_SIZE = 1 << 31
MAX_SEQUENCE = (1 << 53) - 1
DEFAULT_NAME = "bc"
"""The release name of the `bc` binary itself (`bc-VERSION-linux-ARCH`); sequences count per name."""


class BadRelease(Exception):
    """A release whose fields, digest or signature do not hold; the message is one sentence."""


def host_platform() -> str:
    """This host's release platform, as a release file names it: `linux-x86_64`, `linux-aarch64`."""
    return f"{sys.platform}-{_platform.machine()}".lower()


@dataclass(frozen=True)
class Release:
    """Every field a release's signature covers."""

    name: str
    version: str
    sequence: int
    platform: str
    sha256: str
    size: int

    def check(self) -> None:
        """BadRelease for a field that could not name a release."""
        if not NAME_RE.fullmatch(self.name):
            raise BadRelease(f"{self.name!r} is not a release name (lowercase letters, digits, . _ -, at most 64)")
        if not VERSION_RE.fullmatch(self.version):
            raise BadRelease(f"{self.version!r} is not a release version (letters, digits, . + _ -, at most 64)")
        if not self.platform or not self.sequence:
            raise BadRelease(
                f"release {self.version} names no {'platform' if not self.platform else 'sequence'}: it was signed"
                " before release signatures covered name, sequence and platform; publish it again"
            )
        if not 0 < self.sequence <= MAX_SEQUENCE:
            raise BadRelease(f"a release sequence is 1 to {MAX_SEQUENCE}, not {self.sequence}")
        if not PLATFORM_RE.fullmatch(self.platform):
            raise BadRelease(f"{self.platform!r} is not a release platform (as linux-x86_64)")
        if not SHA256_RE.fullmatch(self.sha256):
            raise BadRelease("the sha256 is not 64 lowercase hex digits")
        if not 0 < self.size <= MAX_SIZE:
            raise BadRelease(f"a release is 1 byte to 2 GiB, not {self.size}")

    def statement(self) -> bytes:
        """What the release key signs (checked fields only: none holds a newline)."""
        self.check()
        return (
            f"bc.v2/release\nname={self.name}\nversion={self.version}\nsequence={self.sequence}\n"
            f"platform={self.platform}\nsha256={self.sha256}\nsize={self.size}"
        ).encode()

    def describe(self) -> str:
        return f"release {self.name} {self.version} (sequence {self.sequence}, {self.platform})"


def key_id(public_key: bytes) -> str:
    return "sha256:" + hashlib.sha256(public_key).hexdigest()


def sign(key: ed25519.Ed25519PrivateKey, release: Release) -> bytes:
    return key.sign(release.statement())


def verify(public_keys: Iterable[bytes], release: Release, signature: bytes) -> str:
    """The key id that signed exactly `release`; BadRelease when none of `public_keys` did."""
    message = release.statement()
    keys = list(public_keys)
    if not keys:
        raise BadRelease("no release key is trusted here (bc release key add)")
    for raw in keys:
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(signature, message)
        except (InvalidSignature, ValueError):
            continue
        return key_id(raw)
    raise BadRelease(
        f"the signature of {release.describe()} does not verify under any trusted release key: it must cover"
        " name, version, sequence, platform, sha256 and size (a release signed before they were covered is"
        " published again)"
    )


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
    atomic_write(path, pem, mode=0o600)
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
    """What a release record (`ReleaseInfo`), a `daemon` section and a `daemon.upgrade` all carry."""

    name: str
    version: str
    url: str
    sha256: str
    signature: bytes
    sequence: int
    size: int
    platform: str


def release_of(r: ReleaseFields) -> Release:
    """The signed fields of a record, a section or a payload (an empty name is the `bc` binary's)."""
    return Release(r.name or DEFAULT_NAME, r.version, r.sequence, r.platform, r.sha256, r.size)


def upgrade_request(r: ReleaseFields) -> kinds_pb2.DaemonUpgradeRequest:
    """The `daemon.upgrade` payload that installs release `r`."""
    return kinds_pb2.DaemonUpgradeRequest(
        name=r.name,
        version=r.version,
        url=r.url,
        sha256=r.sha256,
        signature=r.signature,
        sequence=r.sequence,
        size=r.size,
        platform=r.platform,
    )
