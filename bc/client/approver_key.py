"""An approver's private key, read from its one file on the approver's own machine (`bc approve keygen`).

`bc approve sign|reject` and the TUI's approvals screen both sign with it, so both read it the same way:
a file others can read is refused, since a key that leaked is not a person's key.
"""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.errors import UsageError
from bc.runtime.local_files import read_local_file


def load_approver_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """The approver's key, refusing a file others can read: a key that leaked is not a person's key."""
    try:
        st = path.stat()
    except OSError as e:
        raise UsageError(f"cannot read the key file {path}: {e.strerror}") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise UsageError(
            f"the key file {path} can be read by others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 {path}"
        )
    try:
        key = serialization.load_pem_private_key(read_local_file(path, "the key file"), password=None)
    except (ValueError, TypeError):
        raise UsageError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"{path} is not an Ed25519 approver key (make one with `bc approve keygen`)")
    return key


def public_raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    """The key's public half as its 32 raw bytes: what a key id is computed from (`bc.pki.quorum.key_id`)."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
