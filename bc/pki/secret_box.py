"""Secrets at rest: AES-256-GCM under a key that lives beside the CA, never in the store.

The key is 32 bytes in `<data-dir>/pki/secrets.key` (mode 0600, made on first use from the process's
`Secrets`), so a copy of the store (a dump, a backup, `bc store copy`) holds only ciphertext, and a
process without the CA directory (a gateway or worker) cannot open a secret. Each value is sealed with
a fresh 12-byte nonce and authenticated with its name and version as associated data, so a row moved to
another name or version, or edited, does not open. `key_id` (the first 16 hex digits of the key's
SHA-256) is stored beside each sealed value: a store opened with another key says so in one sentence
instead of failing to decrypt.

Blocking (file I/O): `SecretBox.load_or_create` is called once at start, off the event loop.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bc.errors import Conflict, UsageError
from bc.pki.secrets_source import Secrets
from bc.runtime.files import atomic_write

KEY_FILE = "secrets.key"
KEY_BYTES = 32
NONCE_BYTES = 12


class SealedElsewhere(Conflict):
    """A value sealed under another at-rest key than this server's (the CA directory was replaced)."""


def associated_data(name: str, version: int) -> bytes:
    return b"bc.v1/secret\n" + name.encode() + b"\n" + str(version).encode()


class SecretBox:
    def __init__(self, key: bytes, secrets: Secrets) -> None:
        if len(key) != KEY_BYTES:
            raise UsageError(f"the secrets key must be {KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)
        self._secrets = secrets
        self.key_id = hashlib.sha256(key).hexdigest()[:16]

    @classmethod
    def load_or_create(cls, pki_dir: Path, secrets: Secrets) -> SecretBox:
        """The key in `pki_dir/secrets.key`, made (0600) if there is none. Blocking."""
        path = Path(pki_dir) / KEY_FILE
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            key = secrets.token_bytes(KEY_BYTES)
            atomic_write(path, key, mode=0o600)
        return cls(key, secrets)

    def seal(self, name: str, version: int, value: bytes) -> bytes:
        nonce = self._secrets.token_bytes(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, value, associated_data(name, version))

    def open(self, name: str, version: int, sealed: bytes, key_id: str) -> bytes:
        if key_id != self.key_id:
            raise SealedElsewhere(
                f"secret {name!r} version {version} is sealed under key {key_id}, and this server's key is "
                f"{self.key_id}: restore the secrets.key that was beside the CA, or set the secret again"
            )
        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated_data(name, version))
        except InvalidTag:
            raise SealedElsewhere(
                f"secret {name!r} version {version} does not open under this server's key: the stored row "
                "was changed; set the secret again"
            ) from None
