"""Taking the command-signing root key off the `bc serve` host: export it to a file, then remove it.

`export_root` copies `<pki>/signing/root.key` to a new file (0600; an existing
file is never overwritten). `remove_root` deletes the data dir's copy only
once the file named as the export holds that same key, so the root cannot be
lost by a typo. Afterwards the server keeps signing with its worker key; the
trust bundle is signed by the worker, and what needs the root is done on the
operator's machine with the exported file (`--root-key FILE`), the root key
never sent anywhere:

* `bc pki rotate --root-key FILE`: `issue_worker_with` makes the new worker
  key and its certificate here; the server installs it only if it chains to
  its root (`bc.pki.signing.check_issued_worker`).
* `bc approvers add|remove|threshold|allowance --root-key FILE`:
  `sign_quorum_step` signs the change's step (the two settings digests) that
  the server previewed; nodes take the change in a worker-signed bundle only
  with it (`agent.trust.quorum_path`), and it still needs k approvals.

* `bc release key add --root-key FILE`: `bc.pki.releases.endorse` signs the
  new release key; nodes take it from the worker-signed bundle with that
  signature (`agent.trust.release_keys_path`).

`load_root_key` refuses, in one sentence, a file that is unreadable, readable
by other users (group or world bits set), not a key, or another install's root
(checked against the root certificate the server reports).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.errors import UsageError
from bc.pki import keys
from bc.pki import quorum as q
from bc.pki.secrets_source import Secrets
from bc.pki.signing import ROOT_KEY, SigningKeys, issue_worker
from bc.protocol.pb import common_pb2
from bc.runtime.files import write_new
from bc.seams.clock import Clock


def root_key_path(data_dir: Path) -> Path:
    return data_dir / "pki" / "signing" / ROOT_KEY


def _read_root(path: Path) -> bytes:
    if not SigningKeys.exists(path.parent.parent):
        raise UsageError(f"{path.parent.parent.parent} holds no command-signing keys (is it bc serve's data dir?)")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"the root key is not in {path.parent}: it was removed or is kept elsewhere") from None


def export_root(data_dir: Path, out: Path) -> None:
    """Write the root key to `out` (0600), a new file."""
    data = _read_root(root_key_path(data_dir))
    try:
        write_new(out, data)
    except FileExistsError:
        raise UsageError(f"{out} already exists; choose a new file for the export") from None
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror}") from None


def remove_root(data_dir: Path, exported: Path) -> None:
    """Delete the data dir's root key once `exported` holds the same key."""
    path = root_key_path(data_dir)
    data = _read_root(path)
    try:
        copy = exported.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read the export {exported} ({e.strerror}); export the root first") from None
    if copy != data:
        raise UsageError(f"{exported} does not hold this install's root key; nothing was removed")
    path.unlink()


def load_root_key(path: Path, root_cert_pem: str) -> ed25519.Ed25519PrivateKey:
    """The root key in `path`, if it is the root of the certificate the server reports; else one sentence."""
    if not root_cert_pem:
        raise UsageError("command signing is off on this server: there is no command-signing root to use")
    try:
        mode = path.stat().st_mode & 0o777
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read the root key file {path} ({e.strerror}); nothing changed") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise UsageError(
            f"{path} does not hold a private key (pass the file `bc pki root export` wrote); nothing changed"
        ) from None
    root = x509.load_pem_x509_certificate(root_cert_pem.encode())
    if not isinstance(key, ed25519.Ed25519PrivateKey) or key.public_key() != root.public_key():
        raise UsageError(
            f"{path} does not hold this install's command-signing root key ({keys.fingerprint(root)[:19]}…);"
            " nothing changed"
        )
    if mode & 0o077:
        # Whoever else can read it can sign worker keys, quorum steps and release keys: as ssh refuses a key.
        raise UsageError(
            f"the root key file {path} is readable by other users (mode {mode:04o}); chmod 600 it; nothing changed"
        )
    return key


class _At:
    """A clock stopped at the server's time: the new certificate's validity is the server's, not this host's."""

    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # nothing here waits; the protocol's sleep, on the running loop


def issue_worker_with(
    root_key: ed25519.Ed25519PrivateKey, root_cert_pem: str, server_now: float, rng: random.Random, secrets: Secrets
) -> tuple[bytes, bytes]:
    """A new worker key and its certificate under the root (PEM, PEM), made here: what `bc pki rotate
    --root-key` sends the server, valid from `server_now` (the server's clock)."""
    root = x509.load_pem_x509_certificate(root_cert_pem.encode())
    clock: Clock = _At(server_now)
    key, cert = issue_worker(root_key, root, clock, rng, secrets)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, keys.cert_to_pem(cert)


def sign_quorum_step(
    root_key: ed25519.Ed25519PrivateKey, frm: common_pb2.QuorumSettings, to: common_pb2.QuorumSettings
) -> bytes:
    """The root's signature of the step frm → to (`QuorumChange.root_signature`), digests computed here."""
    return root_key.sign(q.root_change_message(q.settings_digest(frm), q.settings_digest(to)))
