from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from bc.errors import UsageError
from bc.pki import keys
from bc.pki.ca import CertificateAuthority


def test_key_pem_round_trip() -> None:
    key = keys.generate_key()
    assert isinstance(key.curve, ec.SECP256R1)
    again = keys.load_key_pem(keys.key_to_pem(key))
    assert again.private_numbers() == key.private_numbers()


def test_non_p256_keys_are_refused() -> None:
    other = ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(UsageError, match="P-256"):
        keys.load_key_pem(other)
    edkey = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(UsageError, match="P-256"):
        keys.load_key_pem(edkey)
    with pytest.raises(UsageError):
        keys.load_key_pem(b"not a key")


def test_write_private_key_is_0600_in_a_0700_dir(tmp_path: Path) -> None:
    path = tmp_path / "new" / "node.key"
    key = keys.generate_key()
    keys.write_private_key(path, key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert keys.load_key_pem(path.read_bytes()).private_numbers() == key.private_numbers()
    # Replacing keeps the mode and leaves no temporary files behind.
    keys.write_private_key(path, keys.generate_key())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["node.key"]


def test_fingerprint_is_sha256_of_der(ca: CertificateAuthority) -> None:
    der = ca.certificate.public_bytes(serialization.Encoding.DER)
    assert keys.fingerprint(ca.certificate) == "sha256:" + hashlib.sha256(der).hexdigest()
    assert keys.load_cert_pem(keys.cert_to_pem(ca.certificate)) == ca.certificate
