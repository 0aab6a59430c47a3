"""Where secret material and the process's one Random come from: the OS in production, a seed under the simulator.

Two kinds of randomness, kept apart on purpose (ARCHITECTURE.md §3):

* **Ids, serials and jitter** (ULIDs, batch and token ids, certificate serials,
  back-off) come from one `random.Random`, passed down from `bc serve`,
  `bc node` or `bc sim`. They must be unique, not unguessable: a run replays
  bit for bit from its seed. Production seeds that Random from the OS once,
  here (`os_seeded_random`), and nowhere else.
* **Secret material** — join-token secrets, the CA's, the command-signing
  root's and worker's private keys, the server's TLS key — must stay
  unguessable even to someone who watched every id. It is drawn through a
  `Secrets`: `SystemSecrets` reads `secrets` (the OS CSPRNG); `SeededSecrets`
  derives the same kinds of bytes from a seed, so that the simulator replays
  them too. A `SeededSecrets` in a real server would hand every key to whoever
  knows the seed: only `bc.testing` and the simulator make one.

Private keys are made from these bytes as well (`p256_key`, `ed25519_key`), so
one seam covers them: a P-256 scalar from 48 bytes reduced mod n-1, plus 1
(FIPS 186-5 A.2.1, the way `tokens.derive_token_key` derives a token key), and
an Ed25519 key from its 32-byte seed (RFC 8032).
"""

from __future__ import annotations

import random
import secrets
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric import ec, ed25519

P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
"""The order n of the P-256 group (SEC 2, secp256r1)."""


class Secrets(Protocol):
    def token_bytes(self, n: int) -> bytes: ...

    def token_hex(self, n: int) -> str: ...


class SystemSecrets:
    """The OS CSPRNG, through `secrets`: what every production process uses."""

    def token_bytes(self, n: int) -> bytes:
        return secrets.token_bytes(n)

    def token_hex(self, n: int) -> str:
        return secrets.token_hex(n)


class SeededSecrets:
    """Secret material derived from a seed, for the simulator and tests only: the seed is every key."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def token_bytes(self, n: int) -> bytes:
        return self._rng.randbytes(n)

    def token_hex(self, n: int) -> str:
        return self.token_bytes(n).hex()


def os_seeded_random() -> random.Random:
    """The production Random: seeded from the OS once, at the start of `bc serve` (and `bc node`)."""
    return random.Random(secrets.randbits(128))


def p256_key(source: Secrets) -> ec.EllipticCurvePrivateKey:
    """A P-256 private key from 48 secret bytes (128 bits beyond the order make the modular bias negligible)."""
    d = int.from_bytes(source.token_bytes(48), "big") % (P256_ORDER - 1) + 1
    return ec.derive_private_key(d, ec.SECP256R1())


def ed25519_key(source: Secrets) -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.from_private_bytes(source.token_bytes(32))
