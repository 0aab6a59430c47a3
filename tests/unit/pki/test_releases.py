"""Release signatures: a release verifies only under a trusted key, with its exact version, digest and size."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.errors import UsageError
from bc.pki import releases

KEY = ed25519.Ed25519PrivateKey.generate()
OTHER = ed25519.Ed25519PrivateKey.generate()
PUB = releases.public_bytes(KEY)
SHA = "ab" * 32


def test_a_signed_release_verifies_and_names_its_key() -> None:
    sig = releases.sign(KEY, "1.4.0", SHA, 1234)
    assert releases.verify([releases.public_bytes(OTHER), PUB], "1.4.0", SHA, 1234, sig) == releases.key_id(PUB)


@pytest.mark.parametrize(
    ("version", "sha", "size"), [("1.4.1", SHA, 1234), ("1.4.0", "cd" * 32, 1234), ("1.4.0", SHA, 1235)]
)
def test_any_other_field_breaks_the_signature(version: str, sha: str, size: int) -> None:
    sig = releases.sign(KEY, "1.4.0", SHA, 1234)
    with pytest.raises(releases.BadRelease, match="does not verify under any trusted release key"):
        releases.verify([PUB], version, sha, size, sig)


def test_an_untrusted_key_or_no_key_is_refused() -> None:
    sig = releases.sign(OTHER, "1.4.0", SHA, 1)
    with pytest.raises(releases.BadRelease, match="does not verify"):
        releases.verify([PUB], "1.4.0", SHA, 1, sig)
    with pytest.raises(releases.BadRelease, match="no release key is trusted"):
        releases.verify([], "1.4.0", SHA, 1, sig)


@pytest.mark.parametrize(
    ("version", "sha", "size", "match"),
    [
        ("1.4.0\nx", SHA, 1, "not a release version"),
        ("1.4.0\n", SHA, 1, "not a release version"),  # `$` would let the newline through: fullmatch
        ("-rf", SHA, 1, "not a release version"),
        ("1.4.0", SHA.upper(), 1, "64 lowercase hex"),
        ("1.4.0", SHA, 0, "1 byte to 2 GiB"),
    ],
)
def test_fields_that_cannot_name_a_release(version: str, sha: str, size: int, match: str) -> None:
    with pytest.raises(releases.BadRelease, match=match):
        releases.sign(KEY, version, sha, size)


def test_key_files(tmp_path: Path) -> None:
    path = tmp_path / "release.key"
    key = releases.generate_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert releases.public_bytes(releases.load_key(path)) == releases.public_bytes(key)
    assert releases.load_public(path) == releases.public_bytes(key)
    with pytest.raises(UsageError, match="never overwritten"):
        releases.generate_key(path)
    (tmp_path / "junk").write_text("hello")
    with pytest.raises(UsageError, match="neither an Ed25519 private nor public PEM key"):
        releases.load_public(tmp_path / "junk")
