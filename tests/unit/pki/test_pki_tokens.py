from __future__ import annotations

import random
import re
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.errors import UsageError
from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import Clock, SystemClock

RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

_TOKEN_RE = re.compile(r"bc1\.[0-9a-f]{12}\.[A-Za-z0-9_-]{43}\.[A-Za-z0-9_-]{43}")
_FP = "sha256:" + "ab" * 32


def test_token_round_trip(ca: CertificateAuthority, clock: Clock) -> None:
    new = tokens.create_token(ca.fingerprint, 3600, clock, RNG, SECRETS)
    assert _TOKEN_RE.fullmatch(new.token)
    assert len(new.token) == 104
    parsed = tokens.parse_token(f"  {new.token}\n")
    assert parsed.token_id == new.token_id
    assert parsed.ca_pin == ca.fingerprint
    assert len(parsed.secret) == 32
    assert tokens.secret_matches(parsed.secret, new.secret_hash)
    assert new.expires_at == clock.now() + 3600
    root = keys.load_cert_pem(new.root_cert_pem)
    assert root.not_valid_after_utc.timestamp() == new.expires_at
    assert root.public_key() == tokens.derive_token_key(parsed.secret).public_key()
    assert tokens.format_token(parsed.token_id, parsed.secret, parsed.ca_pin) == new.token


def test_secret_matches_only_its_own_hash() -> None:
    secret = b"\x01" * 32
    digest = tokens.hash_secret(secret)
    assert tokens.secret_matches(secret, digest)
    assert not tokens.secret_matches(b"\x02" * 32, digest)
    assert not tokens.secret_matches(secret, digest.upper())
    assert not tokens.secret_matches(secret, "")


def test_derive_token_key_is_deterministic() -> None:
    a = tokens.derive_token_key(b"s" * 32)
    b = tokens.derive_token_key(b"s" * 32)
    c = tokens.derive_token_key(b"t" * 32)
    assert a.private_numbers() == b.private_numbers()
    assert a.private_numbers() != c.private_numbers()
    assert keys.is_p256(a)


def test_the_join_root_is_the_same_bytes_from_the_same_fingerprint() -> None:
    fp2 = "sha256:" + "cd" * 32
    first = tokens.join_root_pem(_FP)
    tokens.join_root_cert.cache_clear()  # a fresh derivation, as another process makes it
    assert tokens.join_root_pem(_FP) == first
    assert tokens.join_root_pem(fp2) != first
    root = keys.load_cert_pem(first)
    assert root.subject.rfc4514_string() == "CN=bc join" == root.issuer.rfc4514_string()
    root.verify_directly_issued_by(root)
    assert root.public_key() == tokens.join_root_key(_FP).public_key()
    with pytest.raises(UsageError):
        tokens.join_root_key("sha256:xyz")


def test_a_join_leaf_chains_to_the_join_root_of_its_pin(clock: Clock) -> None:
    new = tokens.create_token(_FP, 600, clock, RNG, SECRETS)
    _, leaf_pem = tokens.join_client_credentials(tokens.parse_token(new.token), clock)
    leaf = keys.load_cert_pem(leaf_pem)
    leaf.verify_directly_issued_by(tokens.join_root_cert(_FP))
    assert leaf.subject.rfc4514_string() == f"CN=join:{new.token_id}"


def _csr(n: int) -> bytes:
    return b"csr-der-" + bytes([n]) * 40  # the proof covers the bytes' hash: no need to parse them


def test_a_join_proof_holds_only_for_its_token_and_its_csr(clock: Clock) -> None:
    new = tokens.create_token(_FP, 600, clock, RNG, SECRETS)
    other = tokens.create_token(_FP, 600, clock, RNG, SECRETS)
    secret = tokens.parse_token(new.token).secret
    proof = tokens.join_proof(secret, new.token_id, _csr(1))
    assert tokens.join_proof(secret, new.token_id, _csr(1)) == proof  # deterministic (RFC 6979)
    assert tokens.verify_join_proof(new.root_cert_pem, new.token_id, _csr(1), proof)
    assert not tokens.verify_join_proof(new.root_cert_pem, new.token_id, _csr(2), proof)  # another CSR
    assert not tokens.verify_join_proof(other.root_cert_pem, other.token_id, _csr(1), proof)  # another token
    assert not tokens.verify_join_proof(new.root_cert_pem, other.token_id, _csr(1), proof)  # another id
    by_other = tokens.join_proof(tokens.parse_token(other.token).secret, new.token_id, _csr(1))
    assert not tokens.verify_join_proof(new.root_cert_pem, new.token_id, _csr(1), by_other)  # another token's key
    assert not tokens.verify_join_proof(new.root_cert_pem, new.token_id, _csr(1), b"")
    assert not tokens.verify_join_proof(new.root_cert_pem, new.token_id, _csr(1), proof[:-1] + b"\x00")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "4 dot-separated parts"),
        ("bc1.0123456789ab.x", "4 dot-separated parts"),
        ("bc2.0123456789ab." + "A" * 43 + "." + "A" * 43, "start with"),
        ("bc1.0123456789AB." + "A" * 43 + "." + "A" * 43, "token id"),
        ("bc1.0123456789a." + "A" * 43 + "." + "A" * 43, "token id"),
        ("bc1.0123456789ab." + "A" * 42 + "." + "A" * 43, "secret"),
        ("bc1.0123456789ab." + "A" * 42 + "=." + "A" * 43, "secret"),
        ("bc1.0123456789ab." + "A" * 42 + "B." + "A" * 43, "canonical"),
        ("bc1.0123456789ab." + "A" * 43 + "." + "A" * 42 + "+", "CA pin"),
    ],
)
def test_malformed_tokens_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=f"the join token is malformed: .*{why}"):
        tokens.parse_token(text)


def test_create_token_refuses_a_bad_fingerprint(clock: Clock) -> None:
    with pytest.raises(UsageError):
        tokens.create_token("sha256:xyz", 60, clock, RNG, SECRETS)
    with pytest.raises(UsageError):
        tokens.create_token(_FP, 0, clock, RNG, SECRETS)


_TOKEN_CHARS = string.ascii_letters + string.digits + "-_.=+/ \n"


@given(st.one_of(st.text(), st.text(alphabet=_TOKEN_CHARS, min_size=90, max_size=120)))
def test_random_strings_never_parse_unless_well_formed(text: str) -> None:
    try:
        parsed = tokens.parse_token(text)
    except UsageError:
        return
    assert _TOKEN_RE.fullmatch(text.strip())
    assert tokens.format_token(parsed.token_id, parsed.secret, parsed.ca_pin) == text.strip()


# One token for the mutation property: creating a token signs a certificate, too slow to repeat per example.
_VALID = tokens.create_token(_FP, 60, SystemClock(), RNG, SECRETS).token
_ORIGINAL = tokens.parse_token(_VALID)


@given(st.integers(min_value=0, max_value=len(_VALID) - 1), st.characters(codec="utf-8"))
def test_a_one_character_mutation_fails_or_names_another_token(index: int, char: str) -> None:
    mutated = _VALID[:index] + char + _VALID[index + 1 :]
    if mutated == _VALID:
        return
    try:
        parsed = tokens.parse_token(mutated)
    except UsageError:
        return
    assert parsed != _ORIGINAL


@given(st.binary(min_size=32, max_size=32), st.text(alphabet="0123456789abcdef", min_size=12, max_size=12))
def test_format_and_parse_are_inverse(secret: bytes, token_id: str) -> None:
    text = tokens.format_token(token_id, secret, _FP)
    assert tokens.parse_token(text) == tokens.ParsedToken(token_id, secret, _FP)
