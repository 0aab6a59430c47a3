"""A ramdisk's short identity on the store's clock: a `--role ramdisk` token gives a certificate of at most 2 h,
and no renewal (or re-join) carries the identity past 2 h after its join.

The store runs on the virtual loop's clock (`advance`), so hours pass in no time; SQLite and PostgreSQL both.
"""

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
from bc.errors import Unauthenticated
from bc.pki import keys, tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr
from bc.pki.renewal import sign_renew_proof
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import LoopClock
from bc.store import Store
from bc.store import events as events_sql
from bc.testing import advance

RNG = random.Random(3)
SECRETS = SystemSecrets()
HOUR = 3600


@pytest.fixture
def ca(tmp_path: Path, clock: LoopClock) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "pki", clock, RNG, SECRETS)[0]


async def join(
    store: Store, bus: Bus, ca: CertificateAuthority, clock: LoopClock, role: str
) -> tuple[keys.PrivateKey, x509.Certificate]:
    tok = await identity.create_token(store, bus, ca, clock, "r1", role, 3600, rng=RNG, secrets=SECRETS)
    key = keys.generate_key()
    der = make_csr(key, "r1").public_bytes(serialization.Encoding.DER)
    parsed = tokens.parse_token(tok.token)
    proof = tokens.join_proof(parsed.secret, parsed.token_id, der)
    j = await identity.join(store, bus, NullSigner(), ca, parsed.token_id, der, "pxe-host", proof=proof)
    return key, keys.load_cert_pem(j.cert_pem)


async def renew(
    store: Store, bus: Bus, ca: CertificateAuthority, clock: LoopClock, key: keys.PrivateKey, cert: x509.Certificate
) -> tuple[keys.PrivateKey, x509.Certificate, int]:
    new_key = keys.generate_key()
    der = make_csr(new_key, "r1").public_bytes(serialization.Encoding.DER)
    ts = round(clock.now() * 1000)
    renewed = await identity.renew(store, bus, ca, cert, der, ts, sign_renew_proof(key, der, ts))
    return new_key, keys.load_cert_pem(renewed.cert_pem), renewed.not_after_ms


async def test_a_ramdisk_token_gives_a_certificate_of_at_most_2_h(
    store: Store, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    _, cert = await join(store, bus, ca, clock, "ramdisk")
    assert cert.not_valid_after_utc.timestamp() == pytest.approx(await store.now_ms() / 1000 + 2 * HOUR, abs=1)
    _, node_cert = await join(store, bus, ca, clock, "node")  # the same CA, a node: a day
    assert node_cert.not_valid_after_utc.timestamp() == pytest.approx(clock.now() + 24 * HOUR, abs=1)


async def test_renewals_never_carry_a_ramdisk_past_2_h_after_its_join(
    store: Store, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    key, cert = await join(store, bus, ca, clock, "ramdisk")
    end = await store.now_ms() + 2 * HOUR * 1000
    await advance(0.6 * 2 * HOUR)  # where the agent renews: 60 % of the life
    key, cert, not_after_ms = await renew(store, bus, ca, clock, key, cert)
    assert not_after_ms == pytest.approx(end, abs=1000), "the renewal reached past the join's 2 h"
    await advance(0.9 * (end / 1000 - clock.now()))
    key, cert, again = await renew(store, bus, ca, clock, key, cert)
    assert again == pytest.approx(end, abs=1000)
    await advance(end / 1000 - clock.now() - 30)  # 30 s left: nothing worth issuing
    with pytest.raises(Unauthenticated, match="not renewed past that; join again with a new token"):
        await renew(store, bus, ca, clock, key, cert)
    async with store.transaction(write=False) as tx:
        refused = await events_sql.list_events(tx, 0, 100, type_prefix="security.renew.refused")
    assert [json.loads(str(r["data"]))["reason"] for r in refused] == ["renew:ramdisk-lifetime"]


async def test_a_node_renews_for_a_day_each_time(
    store: Store, bus: Bus, ca: CertificateAuthority, clock: LoopClock
) -> None:
    key, cert = await join(store, bus, ca, clock, "node")
    await advance(20 * HOUR)
    _, _, not_after_ms = await renew(store, bus, ca, clock, key, cert)
    assert not_after_ms == pytest.approx(await store.now_ms() + 24 * HOUR * 1000, abs=1000)
