"""The secret broker's cryptography on its own: the at-rest box and the JWE to a one-time key."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.pki import secret_jwe
from bc.pki.secret_box import KEY_FILE, SealedElsewhere, SecretBox
from bc.pki.secrets_source import SeededSecrets, SystemSecrets


def test_the_key_is_made_once_beside_the_ca_owner_only(tmp_path: Path) -> None:
    box = SecretBox.load_or_create(tmp_path / "pki", SystemSecrets())
    path = tmp_path / "pki" / KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(path.read_bytes()) == 32
    again = SecretBox.load_or_create(tmp_path / "pki", SystemSecrets())
    assert again.key_id == box.key_id
    sealed = box.seal("a", 1, b"v")
    assert again.open("a", 1, sealed, box.key_id) == b"v"


@given(st.binary(min_size=1, max_size=256), st.text(min_size=1, max_size=20), st.integers(1, 1000))
def test_a_sealed_value_opens_only_as_itself(value: bytes, name: str, version: int) -> None:
    box = SecretBox(b"k" * 32, SeededSecrets(7))
    sealed = box.seal(name, version, value)
    assert value not in sealed or len(value) < 4  # ciphertext (a short value may recur by chance)
    assert box.open(name, version, sealed, box.key_id) == value
    with pytest.raises(SealedElsewhere):
        box.open(name + "x", version, sealed, box.key_id)  # moved to another name
    with pytest.raises(SealedElsewhere):
        box.open(name, version + 1, sealed, box.key_id)  # or another version
    with pytest.raises(SealedElsewhere, match="sealed under key"):
        SecretBox(b"j" * 32, SeededSecrets(7)).open(name, version, sealed, box.key_id)


def test_an_answer_opens_only_with_its_own_request_key() -> None:
    key, other = secret_jwe.OneTimeKey(), secret_jwe.OneTimeKey()
    token = secret_jwe.seal_answer(key.public_jwk, b"headers", name="n", version=3, request_id="r1")
    assert key.open(token, name="n", request_id="r1") == (b"headers", 3)
    assert json.loads(key.public_jwk).keys() == {"crv", "kty", "x", "y"}  # the public half only
    for bad in (
        lambda: other.open(token, name="n", request_id="r1"),  # another key (a gateway's)
        lambda: key.open(token, name="m", request_id="r1"),  # another secret
        lambda: key.open(token, name="n", request_id="r2"),  # another request (a replayed answer)
        lambda: key.open(token[:-4] + "AAAA", name="n", request_id="r1"),  # a tampered tag
    ):
        with pytest.raises(secret_jwe.BadSecretAnswer):
            bad()


def test_a_request_key_must_be_a_public_p256_jwk() -> None:
    private = secret_jwe.OneTimeKey()._key.as_dict(private=True)
    for text in ("not json", json.dumps({"kty": "oct", "k": "AA"}), json.dumps(private)):
        with pytest.raises(ValueError):
            secret_jwe.parse_public_jwk(text)
