"""Join tokens against the store: one use, an expiry, and refusals that change nothing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from bc.clock import LoopClock
from bc.control import identity
from bc.control.bus import Bus
from bc.control.signer import NullSigner
from bc.errors import Unauthenticated, UsageError
from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.store import identity as id_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner
RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


@pytest.fixture
def ca(tmp_path: Path, clock: LoopClock) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "pki", clock, RNG, SECRETS)[0]


def csr_der() -> bytes:
    return make_csr(keys.generate_key(), "x").public_bytes(serialization.Encoding.DER)


async def test_a_token_joins_once(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 3600, rng=RNG, secrets=SECRETS)
    parsed = tokens.parse_token(tok.token)
    joined = await identity.join(store, bus, SIGNER, ca, parsed.token_id, csr_der(), "host")
    assert joined.node_id == "n1" and joined.identity_generation == 1
    with pytest.raises(Unauthenticated, match="already been used"):
        await identity.join(store, bus, SIGNER, ca, parsed.token_id, csr_der(), "host")
    async with store.transaction() as tx:
        node = await nodes_sql.get(tx, "n1")
    assert node is not None and node["generation"] == 1  # the first, empty spec


async def test_an_expired_token_is_refused_and_changes_nothing(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 60, rng=RNG, secrets=SECRETS)
    await advance(61)
    with pytest.raises(Unauthenticated, match="expired"):
        await identity.join(store, bus, SIGNER, ca, tokens.parse_token(tok.token).token_id, csr_der(), "host")
    async with store.transaction() as tx:
        assert await nodes_sql.get(tx, "n1") is None
        row = await id_sql.get_token(tx, tokens.parse_token(tok.token).token_id)
    assert row is not None and row["used_at_ms"] is None


async def test_an_unknown_token_is_refused(store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority) -> None:
    with pytest.raises(Unauthenticated, match="unknown"):
        await identity.join(store, bus, SIGNER, ca, "000000000000", csr_der(), "host")


@pytest.mark.parametrize(
    ("node_id", "role", "ttl"),
    [("Bad Id!", "node", 3600), ("n1", "king", 3600), ("n1", "node", 10), ("n1", "node", 8 * 86400)],
)
async def test_bad_token_requests(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock, node_id: str, role: str, ttl: float
) -> None:
    with pytest.raises(UsageError):
        await identity.create_token(store, bus, ca, clock, node_id, role, ttl, rng=RNG, secrets=SECRETS)
    async with store.transaction() as tx:
        assert await tx.fetchval("SELECT COUNT(*) FROM join_tokens") == 0


async def test_a_second_token_for_a_node_is_a_new_identity_generation(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    for expected in (1, 2):
        tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 3600, rng=RNG, secrets=SECRETS)
        joined = await identity.join(store, bus, SIGNER, ca, tokens.parse_token(tok.token).token_id, csr_der(), "h")
        assert joined.identity_generation == expected
