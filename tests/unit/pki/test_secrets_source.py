"""The randomness seams of the PKI: serials from the one Random, secret material from a `Secrets`.

What an operator could observe: a certificate's serial, a token's id, a CA's key and name. From one seed
(the simulator's), two runs make the same ones; from the OS, two installs never do.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st

from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import P256_ORDER, SeededSecrets, SystemSecrets, ed25519_key, os_seeded_random, p256_key
from bc.pki.signing import SigningKeys
from bc.testing import virtual_clock

NOW = 1_800_000_000.0


def public_der(key: object) -> bytes:
    return key.public_key().public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


# -- serials ------------------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=2**64))
def test_a_serial_is_positive_and_fits_twenty_octets(seed: int) -> None:
    n = keys.serial_number(random.Random(seed))
    assert 0 < n < 2**159


def test_a_serial_never_is_zero_even_when_the_random_draws_zero() -> None:
    class Zeroes(random.Random):
        def __init__(self) -> None:
            super().__init__(0)
            self.draws = 0

        def getrandbits(self, k: int) -> int:
            self.draws += 1
            return 0 if self.draws == 1 else 5

    assert keys.serial_number(Zeroes()) == 5


def test_every_certificate_serial_comes_from_the_injected_random(tmp_path: Path) -> None:
    clock = virtual_clock(NOW)
    rng = random.Random(42)
    ca = CertificateAuthority.create(clock, rng, SystemSecrets())
    node = ca.issue_node_cert(make_csr(keys.generate_key(), "n1"), "n1", "node", 1)
    again = random.Random(42)
    assert ca.certificate.serial_number == keys.serial_number(again)
    assert node.serial_number == keys.serial_number(again)
    sk = SigningKeys.create(tmp_path, clock, random.Random(9), SystemSecrets())
    expected = random.Random(9)
    assert sk.root.serial_number == keys.serial_number(expected)
    assert sk.worker.cert.serial_number == keys.serial_number(expected)


def test_a_token_id_and_its_root_serial_come_from_the_random_and_its_secret_from_secrets() -> None:
    clock = virtual_clock(NOW)
    fp = "sha256:" + "ab" * 32
    a = tokens.create_token(fp, 600, clock, random.Random(3), SeededSecrets(1))
    b = tokens.create_token(fp, 600, clock, random.Random(3), SeededSecrets(2))
    c = tokens.create_token(fp, 600, clock, random.Random(4), SeededSecrets(1))
    assert re.fullmatch(r"[0-9a-f]{12}", a.token_id)
    assert a.token_id == b.token_id != c.token_id  # the id is the Random's
    assert a.secret_hash != b.secret_hash and a.secret_hash == c.secret_hash  # the secret is the Secrets'
    assert a.token != c.token


def test_the_join_leaf_serial_is_derived_from_its_own_key() -> None:
    clock = virtual_clock(NOW)
    new = tokens.create_token("sha256:" + "cd" * 32, 600, clock, random.Random(1), SystemSecrets())
    parsed = tokens.parse_token(new.token)
    serials = set()
    for _ in range(3):
        key_pem, cert_pem = tokens.join_client_credentials(parsed, clock)
        cert, key = keys.load_cert_pem(cert_pem), keys.load_key_pem(key_pem)
        assert 0 < cert.serial_number < 2**159
        serials.add(cert.serial_number)
        assert public_der(cert) == public_der(key)
    assert len(serials) == 3  # a fresh key each time, so a fresh serial


# -- secret material ----------------------------------------------------------------------------


def test_system_secrets_are_fresh_each_time() -> None:
    s = SystemSecrets()
    assert len(s.token_bytes(32)) == 32 and s.token_bytes(32) != s.token_bytes(32)
    assert re.fullmatch(r"[0-9a-f]{8}", s.token_hex(4))
    assert p256_key(s).private_numbers() != p256_key(s).private_numbers()


def test_seeded_secrets_replay_from_their_seed() -> None:
    a, b, other = SeededSecrets(7), SeededSecrets(7), SeededSecrets(8)
    assert a.token_bytes(48) == b.token_bytes(48) != other.token_bytes(48)
    assert a.token_hex(4) == b.token_hex(4)
    assert public_der(p256_key(a)) == public_der(p256_key(b))
    assert public_der(ed25519_key(a)) == public_der(ed25519_key(b))


@given(st.binary(min_size=48, max_size=48))
def test_a_p256_scalar_is_always_in_range(raw: bytes) -> None:
    class Fixed:
        def token_bytes(self, n: int) -> bytes:
            return raw[:n]

        def token_hex(self, n: int) -> str:
            return raw[:n].hex()

    d = p256_key(Fixed()).private_numbers().private_value
    assert 1 <= d < P256_ORDER


def test_a_ca_made_from_one_seed_has_the_same_key_name_and_serial() -> None:
    """Under the simulator: the CA's identity replays (its ECDSA self-signature does not need to)."""
    clock = virtual_clock(NOW)
    one = CertificateAuthority.create(clock, random.Random(5), SeededSecrets(5))
    two = CertificateAuthority.create(clock, random.Random(5), SeededSecrets(5))
    assert one.certificate.subject == two.certificate.subject
    assert one.certificate.serial_number == two.certificate.serial_number
    assert public_der(one.certificate) == public_der(two.certificate)
    three = CertificateAuthority.create(clock, random.Random(5), SystemSecrets())
    assert public_der(three.certificate) != public_der(one.certificate)


def test_worker_keys_from_one_seed_have_the_same_key_id(tmp_path: Path) -> None:
    """Ed25519 signatures are deterministic, so a seeded install's worker certificate (and its key id, which
    events carry) replays byte for byte."""
    clock = virtual_clock(NOW)
    one = SigningKeys.create(tmp_path / "a", clock, random.Random(5), SeededSecrets(5))
    two = SigningKeys.create(tmp_path / "b", clock, random.Random(5), SeededSecrets(5))
    assert one.worker.key_id == two.worker.key_id and one.root_pem == two.root_pem


def test_the_production_random_is_seeded_from_the_os() -> None:
    a, b = os_seeded_random(), os_seeded_random()
    assert isinstance(a, random.Random)
    assert [a.getrandbits(64) for _ in range(4)] != [b.getrandbits(64) for _ in range(4)]
