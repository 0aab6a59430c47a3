"""Release signatures: a release verifies only under a trusted key, with exactly the name, version, sequence,
platform, digest and size it was signed with; a field moved from another release, or a signature of the old
statement (version, digest and size only), verifies nowhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.errors import UsageError
from bc.pki import releases
from bc.pki.releases import Release

KEY = ed25519.Ed25519PrivateKey.generate()
OTHER = ed25519.Ed25519PrivateKey.generate()
PUB = releases.public_bytes(KEY)
SHA = "ab" * 32
R = Release("bc", "1.4.0", 7, "linux-x86_64", SHA, 1234)


def test_a_signed_release_verifies_and_names_its_key() -> None:
    sig = releases.sign(KEY, R)
    assert releases.verify([releases.public_bytes(OTHER), PUB], R, sig) == releases.key_id(PUB)


def test_the_statement_names_every_field_on_its_own_line() -> None:
    assert R.statement() == (
        b"bc.v2/release\nname=bc\nversion=1.4.0\nsequence=7\nplatform=linux-x86_64\nsha256="
        + SHA.encode()
        + b"\nsize=1234"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"name": "bc-beta"},
        {"version": "1.4.1"},
        {"sequence": 8},
        {"sequence": 6},
        {"platform": "linux-aarch64"},
        {"sha256": "cd" * 32},
        {"size": 1235},
        {"platform": "linux-aarch64", "sha256": "cd" * 32, "size": 999},  # another platform's build, whole
    ],
    ids=lambda c: "+".join(c),
)
def test_any_other_field_breaks_the_signature(change: dict[str, object]) -> None:
    sig = releases.sign(KEY, R)
    with pytest.raises(releases.BadRelease, match="does not verify under any trusted release key"):
        releases.verify([PUB], dataclasses.replace(R, **change), sig)  # type: ignore[arg-type]


def test_a_signature_of_the_old_statement_verifies_nowhere() -> None:
    old = KEY.sign(f"bc.v1/release\n{R.version}\n{R.sha256}\n{R.size}".encode())
    with pytest.raises(releases.BadRelease, match="does not verify"):
        releases.verify([PUB], R, old)


def test_a_record_without_platform_or_sequence_says_to_publish_again() -> None:
    for change in ({"platform": ""}, {"sequence": 0}):
        with pytest.raises(releases.BadRelease, match=r"signed before .* publish it again"):
            releases.verify([PUB], dataclasses.replace(R, **change), b"x" * 64)  # type: ignore[arg-type]


def test_an_untrusted_key_or_no_key_is_refused() -> None:
    sig = releases.sign(OTHER, R)
    with pytest.raises(releases.BadRelease, match="does not verify"):
        releases.verify([PUB], R, sig)
    with pytest.raises(releases.BadRelease, match="no release key is trusted"):
        releases.verify([], R, sig)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"version": "1.4.0\nx"}, "not a release version"),
        ({"version": "1.4.0\n"}, "not a release version"),  # `$` would let the newline through: fullmatch
        ({"version": "-rf"}, "not a release version"),
        ({"name": "bc\nversion=9"}, "not a release name"),
        ({"name": "BC"}, "not a release name"),
        ({"platform": "linux-x86_64\nsha256=0"}, "not a release platform"),
        ({"sequence": -1}, "sequence is 1 to"),
        ({"sequence": 1 << 53}, "sequence is 1 to"),
        ({"sha256": SHA.upper()}, "64 lowercase hex"),
        ({"size": 0}, "1 byte to 2 GiB"),
    ],
)
def test_fields_that_cannot_name_a_release(change: dict[str, object], match: str) -> None:
    with pytest.raises(releases.BadRelease, match=match):
        releases.sign(KEY, dataclasses.replace(R, **change))  # type: ignore[arg-type]


def test_an_empty_name_is_the_bc_binary() -> None:
    class Fields:
        name, version, url, sha256, signature, sequence, size, platform = (
            "",
            "1.4.0",
            "https://x/y",
            SHA,
            b"",
            7,
            1234,
            "linux-x86_64",
        )

    assert releases.release_of(Fields()) == R


def test_this_host_has_a_release_platform() -> None:
    assert releases.PLATFORM_RE.fullmatch(releases.host_platform())


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
