"""`identity.renew` against the store on the virtual loop's clock: what is issued, recorded, refused and published."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bc.control.base.bus import Bus
from bc.control.signing.signer import NullSigner
from bc.control.trust import identity
from bc.errors import Unauthenticated, UsageError
from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.renewal import sign_renew_proof
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import LoopClock
from bc.store import events as events_sql
from bc.store import identity as id_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner
RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()


@pytest.fixture
def ca(tmp_path: Path, clock: LoopClock) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "pki", clock, RNG, SECRETS)[0]


async def joined(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock, ttl_s: int = 3600
) -> tuple[keys.PrivateKey, x509.Certificate]:
    tok = await identity.create_token(store, bus, ca, clock, "n1", "node", 3600, rng=RNG, secrets=SECRETS)
    key = keys.generate_key()
    der = make_csr(key, "n1").public_bytes(serialization.Encoding.DER)
    parsed = tokens.parse_token(tok.token)
    proof = tokens.join_proof(parsed.secret, parsed.token_id, der)
    j = await identity.join(store, bus, SIGNER, ca, parsed.token_id, der, "host", proof=proof, ttl_s=ttl_s)
    return key, keys.load_cert_pem(j.cert_pem)


def request(key: keys.PrivateKey, clock: LoopClock, new_key: keys.PrivateKey | None = None) -> tuple[bytes, int, bytes]:
    der = make_csr(new_key or keys.generate_key(), "n1").public_bytes(serialization.Encoding.DER)
    ts = round(clock.now() * 1000)
    return der, ts, sign_renew_proof(key, der, ts)


async def events(store: InlineSqliteStore, prefix: str) -> list[dict[str, object]]:
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 1000, type_prefix=prefix)
    return [json.loads(str(r["data"])) for r in rows]


async def test_a_renewal_records_a_certificate_for_the_new_key_and_publishes_it(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    key, cert = await joined(store, bus, ca, clock, ttl_s=20)
    new_key = keys.generate_key()
    await advance(12)
    renewed = await identity.renew(store, bus, ca, cert, *request(key, clock, new_key), ttl_s=20)
    new = keys.load_cert_pem(renewed.cert_pem)
    assert new.public_key() == new_key.public_key()
    assert new.not_valid_after_utc.timestamp() == pytest.approx(clock.now() + 20)
    async with store.transaction(write=False) as tx:
        row = await id_sql.get_cert(tx, renewed.serial)
    assert row is not None and row["identity_generation"] == 1 and row["not_after_ms"] == renewed.not_after_ms
    [ev] = await events(store, "node.cert.renewed")
    assert ev == {
        "serial": renewed.serial,
        "not_after_ms": renewed.not_after_ms,
        "previous_serial": f"{cert.serial_number:x}",
    }


async def test_the_lifetime_is_capped_at_24_h(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    key, cert = await joined(store, bus, ca, clock)
    renewed = await identity.renew(store, bus, ca, cert, *request(key, clock), ttl_s=10 * 24 * 3600)
    assert renewed.not_after_ms == round(clock.now() * 1000) + 24 * 3600 * 1000


async def test_an_expired_certificate_is_refused_and_published(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    key, cert = await joined(store, bus, ca, clock, ttl_s=60)
    await advance(61)
    with pytest.raises(Unauthenticated, match="expired"):
        await identity.renew(store, bus, ca, cert, *request(key, clock))
    assert [e["reason"] for e in await events(store, "security.renew.refused")] == ["renew:expired"]
    assert await events(store, "node.cert.renewed") == []


async def test_a_certificate_the_store_does_not_know_is_refused(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    await joined(store, bus, ca, clock)
    stray_key = keys.generate_key()
    stray = ca.issue_node_cert(make_csr(stray_key, "n1"), "n1", "node", 1, 3600)  # never recorded
    with pytest.raises(Unauthenticated, match="not a certificate of node n1"):
        await identity.renew(store, bus, ca, stray, *request(stray_key, clock))
    assert [e["reason"] for e in await events(store, "security.renew.refused")] == ["renew:unknown-certificate"]


async def test_a_bad_csr_after_a_good_proof_is_a_usage_error(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    key, cert = await joined(store, bus, ca, clock)
    ts = round(clock.now() * 1000)
    with pytest.raises(UsageError, match="does not parse"):
        await identity.renew(store, bus, ca, cert, b"junk", ts, sign_renew_proof(key, b"junk", ts))
    assert [e["reason"] for e in await events(store, "security.renew.refused")] == ["renew:bad-csr"]


async def test_an_operator_certificate_cannot_renew(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    op_key = keys.generate_key()
    op = ca.issue_operator_cert("local", op_key)
    with pytest.raises(Unauthenticated, match="node certificate"):
        await identity.renew(store, bus, ca, op, *request(op_key, clock))
    assert await events(store, "security.renew.") == []


async def test_a_proof_by_another_key_is_refused_quietly(
    store: InlineSqliteStore, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    _, cert = await joined(store, bus, ca, clock)
    with pytest.raises(Unauthenticated, match="proof of possession"):
        await identity.renew(store, bus, ca, cert, *request(keys.generate_key(), clock))
    assert await events(store, "security.renew.") == []
