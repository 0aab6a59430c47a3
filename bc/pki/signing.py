"""Signed intent: command-signing roots, worker keys, and the envelopes they sign.

A command-signing root (Ed25519, self-signed X.509) certifies worker keys
(Ed25519, X.509, CN `bc-worker:<name>`). A worker key signs every command body
(purpose `command`), every DesiredState body (purpose `desired-state`) and the
trust bundle it hands to nodes (purpose `trust-bundle`). The node holds the
roots (its trust bundle) and verifies each envelope against them; the gateway
relays the stored bytes and the worker's certificate, and holds no key.

What is signed is domain-separated so that a signature for one purpose can
never be replayed as another:

    b"bc.v1/envelope\\n" + purpose + b"\\n" + body

`key_id` names the worker certificate ("sha256:" + hex of its DER), so a
verifier can cache the chain check per worker and a reader can tell which key
signed a stored row.

Rotation (`bc pki rotate`) issues a new worker key under the same root (or,
with the root kept in a file, installs one the operator's CLI issued with it:
`check_issued_worker`); the caller re-signs the stored current specs and pending commands so no signature
outlives its key.

Keys (and the root's name suffix) come from the injected `Secrets`, serials
from the injected Random, so a simulated run makes the same certificates
(Ed25519 signatures are deterministic) and the same worker key ids.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from bc.errors import UsageError
from bc.pki import keys
from bc.pki.secrets_source import Secrets, ed25519_key
from bc.protocol.pb import common_pb2
from bc.runtime.files import atomic_write
from bc.seams.clock import Clock

PURPOSE_COMMAND = "command"
PURPOSE_DESIRED_STATE = "desired-state"
PURPOSE_TRUST_BUNDLE = "trust-bundle"

ROOT_LIFETIME_S = 10 * 365 * 24 * 3600
WORKER_LIFETIME_S = 90 * 24 * 3600
WORKER_ROTATE_BEFORE_S = 30 * 24 * 3600  # `bc serve` rotates a worker key with less than this left
BACKDATE_S = 60

SIGNING_DIR = "signing"
ROOT_KEY, ROOT_CERT, WORKER_KEY, WORKER_CERT = "root.key", "root.crt", "worker.key", "worker.crt"


class BadSignature(Exception):
    """An envelope that does not verify; the message says why in a few words."""


def signed_message(purpose: str, body: bytes) -> bytes:
    return b"bc.v1/envelope\n" + purpose.encode() + b"\n" + body


def key_id_of(cert: x509.Certificate) -> str:
    return keys.fingerprint(cert)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ed25519_private_pem(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _load_ed25519_key(path: Path) -> ed25519.Ed25519PrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"{path} is not an Ed25519 private key")
    return key


def create_root(
    clock: Clock, rng: random.Random, secrets: Secrets
) -> tuple[ed25519.Ed25519PrivateKey, x509.Certificate]:
    key = ed25519_key(secrets)
    now = keys.utc(clock.now() - BACKDATE_S)
    name = _name(f"bc command-signing root {secrets.token_hex(4)}")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(keys.serial_number(rng))
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(seconds=ROOT_LIFETIME_S))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, False, False, False), critical=True)
        .sign(key, None)
    )
    return key, cert


def issue_worker(
    root_key: ed25519.Ed25519PrivateKey,
    root: x509.Certificate,
    clock: Clock,
    rng: random.Random,
    secrets: Secrets,
    name: str = "serve",
) -> tuple[ed25519.Ed25519PrivateKey, x509.Certificate]:
    key = ed25519_key(secrets)
    now = keys.utc(clock.now() - BACKDATE_S)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"bc-worker:{name}"))
        .issuer_name(root.subject)
        .public_key(key.public_key())
        .serial_number(keys.serial_number(rng))
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(seconds=WORKER_LIFETIME_S))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .sign(root_key, None)
    )
    return key, cert


@dataclass
class WorkerSigner:
    """A worker key and its certificate: signs bodies, never sees a node."""

    key: ed25519.Ed25519PrivateKey
    cert: x509.Certificate
    key_id: str = field(init=False)
    cert_der: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.key_id = key_id_of(self.cert)
        self.cert_der = self.cert.public_bytes(serialization.Encoding.DER)

    def sign(self, purpose: str, body: bytes) -> bytes:
        return self.key.sign(signed_message(purpose, body))

    def envelope(self, purpose: str, body: bytes) -> common_pb2.Envelope:
        return common_pb2.Envelope(
            purpose=purpose,
            body=body,
            key_id=self.key_id,
            signature=self.sign(purpose, body),
            cert_chain=[self.cert_der],
        )

    @property
    def not_after(self) -> float:
        return self.cert.not_valid_after_utc.timestamp()


class SigningKeys:
    """The server's command-signing root and current worker key, in `<pki>/signing/`.

    The root key stays on this host (a lab); a fleet can keep it offline and
    install only worker keys, which is why the two are separate files.
    """

    def __init__(self, dir: Path, root: x509.Certificate, worker: WorkerSigner) -> None:
        self.dir, self.root, self.worker = dir, root, worker

    @property
    def root_pem(self) -> bytes:
        return self.root.public_bytes(serialization.Encoding.PEM)

    @property
    def root_public_raw(self) -> bytes:
        """The root's raw Ed25519 public key (what checks its signature of a quorum change's step)."""
        pub = self.root.public_key()
        assert isinstance(pub, ed25519.Ed25519PublicKey)
        return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @staticmethod
    def exists(pki_dir: Path) -> bool:
        return (pki_dir / SIGNING_DIR / ROOT_CERT).is_file()

    @classmethod
    def load(cls, pki_dir: Path) -> SigningKeys:
        d = pki_dir / SIGNING_DIR
        try:
            root = x509.load_pem_x509_certificate((d / ROOT_CERT).read_bytes())
            worker_cert = x509.load_pem_x509_certificate((d / WORKER_CERT).read_bytes())
            worker_key = _load_ed25519_key(d / WORKER_KEY)
        except (OSError, ValueError) as e:
            raise UsageError(f"the command-signing keys in {d} are unreadable: {e}") from None
        return cls(d, root, WorkerSigner(worker_key, worker_cert))

    @classmethod
    def create(cls, pki_dir: Path, clock: Clock, rng: random.Random, secrets: Secrets) -> SigningKeys:
        d = pki_dir / SIGNING_DIR
        if (d / ROOT_CERT).exists() or (d / ROOT_KEY).exists():
            raise UsageError(f"{d} already holds a command-signing root; refusing to replace it")
        root_key, root = create_root(clock, rng, secrets)
        atomic_write(d / ROOT_KEY, _ed25519_private_pem(root_key), mode=0o600)
        atomic_write(d / ROOT_CERT, root.public_bytes(serialization.Encoding.PEM))
        signing = cls(d, root, WorkerSigner(*issue_worker(root_key, root, clock, rng, secrets)))
        signing._save_worker()
        return signing

    def root_signer(self) -> WorkerSigner | None:
        """The root key itself, when it is on this host: only it may sign a change of the quorum's settings."""
        if not (self.dir / ROOT_KEY).is_file():
            return None
        return WorkerSigner(_load_ed25519_key(self.dir / ROOT_KEY), self.root)

    def rotate_worker(self, clock: Clock, rng: random.Random, secrets: Secrets) -> WorkerSigner:
        """A new worker key under the same root; the old one signs nothing from now on."""
        if not (self.dir / ROOT_KEY).is_file():
            raise UsageError(
                f"the command-signing root key is not on this host ({self.dir / ROOT_KEY}):"
                " pass --root-key FILE (the exported root key) to bc pki rotate"
            )
        root_key = _load_ed25519_key(self.dir / ROOT_KEY)
        self.worker = WorkerSigner(*issue_worker(root_key, self.root, clock, rng, secrets))
        self._save_worker()
        return self.worker

    def install_worker(self, key_pem: bytes, cert_pem: bytes, now: float) -> WorkerSigner:
        """A worker key issued elsewhere under this root (`bc pki rotate --root-key`: the operator's machine
        holds the root); checked before anything is written, so a refusal changes nothing."""
        w = check_issued_worker(self.root, key_pem, cert_pem, now)
        self.worker = w
        self._save_worker()
        return w

    def _save_worker(self) -> None:
        atomic_write(self.dir / WORKER_KEY, _ed25519_private_pem(self.worker.key), mode=0o600)
        atomic_write(self.dir / WORKER_CERT, self.worker.cert.public_bytes(serialization.Encoding.PEM))


def check_issued_worker(root: x509.Certificate, key_pem: bytes, cert_pem: bytes, now: float) -> WorkerSigner:
    """The worker key and certificate sent for installation, if they are a worker of `root` valid at `now`;
    else a UsageError in one sentence."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise UsageError("the new worker key does not parse as a PEM private key; nothing changed") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError("the new worker key is not an Ed25519 key; nothing changed")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise UsageError("the new worker certificate does not parse; nothing changed") from None
    if cert.public_key() != key.public_key():
        raise UsageError("the new worker certificate is not for the key sent with it; nothing changed")
    if not _issued_by(cert, root):
        raise UsageError(
            "the new worker certificate was not issued by this install's command-signing root"
            f" ({key_id_of(root)[:19]}…): the root key file is another install's; nothing changed"
        )
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not _is_worker(cert) or not cn or not str(cn[0].value).startswith("bc-worker:"):
        raise UsageError("the new certificate is not a worker certificate; nothing changed")
    if not cert.not_valid_before_utc.timestamp() <= now < cert.not_valid_after_utc.timestamp() - WORKER_ROTATE_BEFORE_S:
        raise UsageError("the new worker certificate is not valid now or expires within 30 days; nothing changed")
    return WorkerSigner(key, cert)


@dataclass(frozen=True)
class _TrustedWorker:
    public_key: ed25519.Ed25519PublicKey
    not_before: float
    not_after: float


class Verifier:
    """Checks envelopes against a set of command-signing roots (a node's trust bundle).

    A worker certificate's chain is checked once and cached by key id; the
    signature is checked every time. `at` is the verifier's best estimate of
    the server's time (None skips the validity window: used when re-reading a
    spec that was verified when it arrived).
    """

    def __init__(self, root_pems: list[bytes]) -> None:
        self.listed = len(root_pems)
        self.roots: list[x509.Certificate] = []
        for pem in root_pems:
            try:
                self.roots.append(x509.load_pem_x509_certificate(pem))
            except ValueError:
                continue  # an unreadable root trusts nothing; the others still count
        self._workers: dict[str, _TrustedWorker] = {}

    @property
    def enforcing(self) -> bool:
        """Any listed root turns checking on, readable or not: a bundle of unreadable roots refuses
        everything rather than silently checking nothing."""
        return self.listed > 0

    def verify(self, env: common_pb2.Envelope, purpose: str, at: float | None) -> str:
        """Return the key id that signed `env`, or raise BadSignature."""
        if env.purpose != purpose:
            raise BadSignature(f"envelope purpose {env.purpose!r}, expected {purpose!r}")
        if not env.signature:
            raise BadSignature("unsigned")
        worker = self._worker(env)
        if at is not None and not worker.not_before <= at <= worker.not_after:
            raise BadSignature("the signing key's certificate is not valid at this time")
        try:
            worker.public_key.verify(env.signature, signed_message(purpose, env.body))
        except InvalidSignature:
            raise BadSignature("signature does not match the body") from None
        return env.key_id

    def verify_by_root(self, env: common_pb2.Envelope, purpose: str) -> bool:
        """True if a held root's own key signed `env` (naming that root as the signer)."""
        if env.purpose != purpose or not env.signature or not env.cert_chain:
            return False
        for root in self.roots:
            if root.public_bytes(serialization.Encoding.DER) != env.cert_chain[0] or key_id_of(root) != env.key_id:
                continue
            pub = root.public_key()
            if not isinstance(pub, ed25519.Ed25519PublicKey):
                return False
            try:
                pub.verify(env.signature, signed_message(purpose, env.body))
            except InvalidSignature:
                return False
            return True
        return False

    def _worker(self, env: common_pb2.Envelope) -> _TrustedWorker:
        cached = self._workers.get(env.key_id)
        if cached is not None:
            return cached
        if not env.cert_chain:
            raise BadSignature("no signer certificate")
        try:
            cert = x509.load_der_x509_certificate(env.cert_chain[0])
        except ValueError:
            raise BadSignature("unreadable signer certificate") from None
        if key_id_of(cert) != env.key_id:
            raise BadSignature("key id does not name the signer certificate")
        pub = cert.public_key()
        if not isinstance(pub, ed25519.Ed25519PublicKey):
            raise BadSignature("the signer key is not Ed25519")
        if not any(_issued_by(cert, root) for root in self.roots):
            raise BadSignature("the signer does not chain to a command-signing root")
        if not _is_worker(cert):
            raise BadSignature("the signer certificate is not a worker's (a root signs workers, not intent)")
        w = _TrustedWorker(pub, cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp())
        self._workers[env.key_id] = w
        return w


def _is_worker(cert: x509.Certificate) -> bool:
    try:
        bc_ext = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return not bc_ext.ca and ku.digital_signature


def _issued_by(cert: x509.Certificate, root: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
