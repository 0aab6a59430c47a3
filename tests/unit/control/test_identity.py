"""Join tokens against the store: one use, an expiry, and refusals that change nothing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from bc.control.base.bus import Bus
from bc.control.signing.signer import NullSigner
from bc.control.trust import identity
from bc.errors import Unauthenticated, UsageError
from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import LoopClock
from bc.store import Store
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


async def join(
    store: Store,
    bus: Bus,
    ca: CertificateAuthority,
    token: str,
    csr: bytes | None = None,
    *,
    proof: bytes | None = None,
) -> identity.Joined:
    """Join as `bc join` does: the token's proof over this CSR, unless the test brings its own proof."""
    parsed = tokens.parse_token(token)
    csr = csr or csr_der()
    if proof is None:
        proof = tokens.join_proof(parsed.secret, parsed.token_id, csr)
    return await identity.join(store, bus, SIGNER, ca, parsed.token_id, csr, "host", proof=proof)


async def test_a_token_joins_once(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 3600, rng=RNG, secrets=SECRETS)
    joined = await join(store, bus, ca, tok.token)
    assert joined.node_id == "n1" and joined.identity_generation == 1
    with pytest.raises(Unauthenticated, match="already been used"):
        await join(store, bus, ca, tok.token)
    async with store.transaction() as tx:
        node = await nodes_sql.get(tx, "n1")
    assert node is not None and node["generation"] == 1  # the first, empty spec


async def test_an_expired_token_is_refused_and_changes_nothing(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 60, rng=RNG, secrets=SECRETS)
    await advance(61)
    with pytest.raises(Unauthenticated, match="expired"):
        await join(store, bus, ca, tok.token)
    async with store.transaction() as tx:
        assert await nodes_sql.get(tx, "n1") is None
        row = await id_sql.get_token(tx, tokens.parse_token(tok.token).token_id)
    assert row is not None and row["used_at_ms"] is None


async def test_an_unknown_token_is_refused(store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority) -> None:
    with pytest.raises(Unauthenticated, match="unknown"):
        await identity.join(store, bus, SIGNER, ca, "000000000000", csr_der(), "host", proof=b"x")


async def test_a_proof_over_another_csr_or_by_another_tokens_key_is_refused_and_burns_nothing(
    store: Store, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 3600, rng=RNG, secrets=SECRETS)
    other = await identity.create_token(store, bus, ca, clock, "n2", "node", 3600, rng=RNG, secrets=SECRETS)
    parsed, other_secret = tokens.parse_token(tok.token), tokens.parse_token(other.token).secret
    mine, theirs = csr_der(), csr_der()
    wrong = [
        tokens.join_proof(parsed.secret, parsed.token_id, theirs),  # the right key, over another CSR
        tokens.join_proof(other_secret, parsed.token_id, mine),  # another token's key, over this CSR
        tokens.join_proof(other_secret, other.token_id, mine),  # another token's whole proof
        b"",
    ]
    for proof in wrong:
        with pytest.raises(Unauthenticated, match="secret does not match"):
            await join(store, bus, ca, tok.token, mine, proof=proof)
    async with store.transaction() as tx:
        assert await nodes_sql.get(tx, "n1") is None
        row = await id_sql.get_token(tx, parsed.token_id)
    assert row is not None and row["used_at_ms"] is None
    assert (await join(store, bus, ca, tok.token, mine)).node_id == "n1"  # the genuine proof still joins


async def test_a_wrong_proof_for_a_used_token_hears_the_secret_not_the_state(
    store: Store, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 3600, rng=RNG, secrets=SECRETS)
    await join(store, bus, ca, tok.token)
    with pytest.raises(Unauthenticated, match="secret does not match"):
        await join(store, bus, ca, tok.token, proof=b"\x30\x00")


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
        joined = await join(store, bus, ca, tok.token)
        assert joined.identity_generation == expected
