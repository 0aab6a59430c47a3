"""The SSH user CA: its key, OpenSSH public keys, and the short-lived user certificates it signs.

`bc ssh ca init` makes an Ed25519 key in the server's data dir
(`<data-dir>/ssh-ca/ssh_user_ca`, 0600, OpenSSH format, next to its `.pub`);
only the public half reaches nodes (the access section's `ssh_ca_keys`). A
certificate (`sign_user_cert`) is an OpenSSH user certificate built with
`cryptography`'s `SSHCertificateBuilder`: one principal `<principal>@<node>`,
a serial the control plane chose, a key id naming who asked, and a validity
window; `ssh-keygen -L` reads it (tests/unit/pki/test_ssh_pki.py).

The key file is read on each grant, never cached: a CA key moved offline
after `bc ssh ca init` makes every grant fail with one sentence.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import ssh as crypto_ssh

from bc.errors import Conflict, UsageError
from bc.protocol import ssh_lines
from bc.protocol.text_safety import unsafe_char
from bc.runtime.files import atomic_write, write_new

CA_KEY_FILE = "ssh_user_ca"
EXTENSIONS = (b"permit-pty", b"permit-port-forwarding", b"permit-agent-forwarding")
"""What a break-glass certificate permits: a terminal and forwarding; no X11, no user rc."""


@dataclass(frozen=True)
class PublicKey:
    """One OpenSSH public key: its line without the comment, and its `SHA256:` fingerprint."""

    line: str
    fingerprint: str


def parse_public_key(text: str, what: str = "the public key") -> PublicKey:
    """Exactly one OpenSSH public key (a `.pub` file's text), else UsageError with one sentence."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1:
        raise UsageError(f"{what} must hold exactly one SSH public key line, not {len(lines)}")
    why = ssh_lines.key_line_problem(lines[0])
    if why is not None:
        raise UsageError(f"{what} {why}")
    key_type, blob_text = lines[0].split()[:2]
    try:
        crypto_ssh.load_ssh_public_key(f"{key_type} {blob_text}".encode())
    except (ValueError, UnsupportedAlgorithm) as e:
        raise UsageError(f"{what} is not a usable SSH public key ({e})") from None
    return PublicKey(f"{key_type} {blob_text}", fingerprint(base64.b64decode(blob_text)))


def fingerprint(blob: bytes) -> str:
    """OpenSSH's `SHA256:` fingerprint of a key blob (base64 without padding)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def public_line(key: ed25519.Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def write_ca_key(dir: Path, key: ed25519.Ed25519PrivateKey) -> Path:
    """Write the CA key as `dir/ssh_user_ca` (0600, never over an existing one) and its `.pub`; returns its path."""
    dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return write_key_file(dir / CA_KEY_FILE, key)


def write_key_file(path: Path, key: ed25519.Ed25519PrivateKey) -> Path:
    """Write an Ed25519 key in OpenSSH format at `path` (0600, never over an existing file) and `path.pub`."""
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    try:
        write_new(path, pem)
    except FileExistsError:
        raise Conflict(f"{path} exists already; an SSH CA key is never written over a file") from None
    atomic_write(path.with_name(path.name + ".pub"), (public_line(key) + " bc-ssh-user-ca\n").encode())
    return path


def load_ca_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """The CA key from its file, which must be 0600; UsageError with one sentence otherwise."""
    try:
        st = path.stat()
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"the SSH CA key {path} is not there: no certificate can be signed with it") from None
    if st.st_mode & 0o077:
        raise UsageError(f"the SSH CA key {path} is readable by others (mode {st.st_mode & 0o777:o}); chmod 600 it")
    key = serialization.load_ssh_private_key(data, password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"the SSH CA key {path} is not an Ed25519 key")
    return key


CERTIFIABLE = (ec.EllipticCurvePublicKey, rsa.RSAPublicKey, ed25519.Ed25519PublicKey)
"""The key types an OpenSSH certificate can carry (cryptography's SSHCertPublicKeyTypes)."""


def sign_user_cert(
    ca: ed25519.Ed25519PrivateKey,
    user_key: PublicKey,
    *,
    serial: int,
    key_id: str,
    principals: list[str],
    valid_after_s: int,
    valid_before_s: int,
) -> str:
    """An OpenSSH user certificate for `user_key`, one line (`ssh-ed25519-cert-v01@openssh.com AAAA… key_id`)."""
    public = crypto_ssh.load_ssh_public_key(user_key.line.encode())
    if not isinstance(public, CERTIFIABLE):  # DSA parses but cannot be certified (parse_public_key refuses it)
        raise ValueError(f"an SSH certificate cannot be made for a {type(public).__name__}")
    builder = (
        crypto_ssh.SSHCertificateBuilder()
        .public_key(public)
        .serial(serial)
        .type(crypto_ssh.SSHCertificateType.USER)
        .key_id(key_id.encode())
        .valid_principals([p.encode() for p in principals])
        .valid_after(valid_after_s)
        .valid_before(valid_before_s)
    )
    for ext in EXTENSIONS:
        builder = builder.add_extension(ext, b"")
    cert = builder.sign(ca)
    return cert.public_bytes().decode() + f" {key_id}"


GRANT_BATCH_KIND = "ssh.grant"


def grant_digest(principal: str, key_fingerprint: str) -> bytes:
    """The digest an `ssh.grant` batch leaf carries in place of a payload digest: sha256 of
    `"bc.v1/ssh-grant\\n" + principal + "\\n" + key fingerprint`, so the leaf
    `(node, "ssh.grant", digest)` binds the node, the principal and the user key an approver signs for."""
    if "\n" in principal or "\n" in key_fingerprint:
        raise ValueError("a principal or key fingerprint cannot contain a newline")
    return hashlib.sha256(f"bc.v1/ssh-grant\n{principal}\n{key_fingerprint}".encode()).digest()


@dataclass(frozen=True)
class CertFacts:
    """What a certificate says, read back and checked against the CA that must have signed it."""

    serial: int
    principals: list[str]
    valid_after_s: int
    valid_before_s: int
    key_line: str


def read_user_cert(text: str, ca_line: str) -> CertFacts:
    """Parse an OpenSSH user certificate and check it is signed by the CA key `ca_line`; UsageError otherwise."""
    if unsafe_char(text.strip()) is not None or len(text.strip().splitlines()) != 1:
        raise UsageError("the certificate must be one OpenSSH certificate line")
    try:
        cert = crypto_ssh.load_ssh_public_identity(text.strip().encode())
    except (ValueError, UnsupportedAlgorithm) as e:
        raise UsageError(f"the certificate does not parse ({e})") from None
    if not isinstance(cert, crypto_ssh.SSHCertificate) or cert.type != crypto_ssh.SSHCertificateType.USER:
        raise UsageError("that is not an OpenSSH user certificate")
    ca_blob = base64.b64decode(ca_line.split()[1])
    signer = cert.signature_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    if base64.b64decode(signer.split()[1]) != ca_blob:
        raise UsageError("the certificate is not signed by this cluster's SSH CA")
    try:
        cert.verify_cert_signature()
    except Exception:  # cryptography raises InvalidSignature (or a key-specific error)
        raise UsageError("the certificate's signature does not verify") from None
    key = cert.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return CertFacts(
        serial=cert.serial,
        principals=[p.decode("utf-8", "replace") for p in cert.valid_principals],
        valid_after_s=cert.valid_after,
        valid_before_s=cert.valid_before,
        key_line=key.decode(),
    )
