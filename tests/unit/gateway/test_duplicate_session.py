"""Two machines sharing one identity: takeovers of an open session from another boot, and the quarantine."""

from __future__ import annotations

import json
import random

import pytest
from cryptography.hazmat.primitives import serialization
from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.commands.queue import EnqueueRequest, enqueue
from bc.control.signing.signer import NullSigner
from bc.errors import Unauthenticated
from bc.gateway.hello import DUPLICATE_LIMIT, DUPLICATE_WINDOW_MS, HelloResult, hello_transaction
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import PeerIdentity, make_csr, peer_identity
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import session_pb2
from bc.seams.clock import LoopClock
from bc.store import Row
from bc.store import commands as cmd_sql
from bc.store import events as events_sql
from bc.store import identity as id_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance

pytestmark = pytest.mark.usefixtures("gateway_lease")  # hello_transaction routes as gw-1

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner
RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

NODE = "n1"
GW = "gw-1"
TAKEOVER = "security.node.duplicate-session"
QUARANTINED = "security.node.quarantined"


@pytest.fixture
def ca(clock: LoopClock) -> CertificateAuthority:
    return CertificateAuthority.create(clock, RNG, SECRETS)


async def add_cert(
    store: InlineSqliteStore, ca: CertificateAuthority, node_id: str = NODE, identity_generation: int = 1
) -> PeerIdentity:
    cert = ca.issue_node_cert(make_csr(keys.generate_key(), node_id), node_id, "node", identity_generation)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await id_sql.insert_cert(
            tx,
            serial=format(cert.serial_number, "x"),
            node_id=node_id,
            identity_generation=identity_generation,
            cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
            issued_at_ms=now_ms,
            not_after_ms=int(cert.not_valid_after_utc.timestamp() * 1000),
        )
    return peer_identity(cert, ca.certificate)


@pytest.fixture
async def peer(store: InlineSqliteStore, ca: CertificateAuthority) -> PeerIdentity:
    """Node n1, joined: its row and one live certificate."""
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await nodes_sql.ensure(tx, NODE, "node", now_ms)
    return await add_cert(store, ca)


def hello(boot_id: str, incarnation_id: str = "", journal_id: str = "j-1") -> session_pb2.Hello:
    return session_pb2.Hello(
        node_id=NODE, boot_id=boot_id, journal_id=journal_id, incarnation_id=incarnation_id or f"inc-{boot_id}"
    )


async def say_hello(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity, boot_id: str, incarnation_id: str = ""
) -> HelloResult:
    return await hello_transaction(store, bus, SIGNER, GW, peer, hello(boot_id, incarnation_id))


async def close(store: InlineSqliteStore, epoch: int) -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        assert await nodes_sql.close_session(tx, NODE, epoch, now_ms)


async def events(store: InlineSqliteStore, type_: str) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return [e for e in await events_sql.list_events(tx, 0, 10_000, type_) if e["type"] == type_]


async def cert_row(store: InlineSqliteStore, serial: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await id_sql.get_cert(tx, serial)
    assert row is not None
    return row


def test_the_limits_are_three_takeovers_in_ten_minutes() -> None:
    assert (DUPLICATE_LIMIT, DUPLICATE_WINDOW_MS) == (3, 600_000)


async def test_a_first_hello_is_no_takeover(store: InlineSqliteStore, bus: Bus, peer: PeerIdentity) -> None:
    res = await say_hello(store, bus, peer, "boot-a")
    assert not res.quarantined and res.epoch == 1
    assert await events(store, TAKEOVER) == []


async def test_a_hello_from_another_boot_while_the_session_is_open_is_a_takeover(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity
) -> None:
    await say_hello(store, bus, peer, "boot-a", "inc-a")
    res = await say_hello(store, bus, peer, "boot-b", "inc-b")
    assert not res.quarantined and res.epoch == 2
    [ev] = await events(store, TAKEOVER)
    assert ev["subject"] == NODE and ev["at_ms"] == await store.now_ms()
    assert json.loads(ev["data"]) == {
        "serial": peer.serial,
        "previous_boot_id": "boot-a",
        "boot_id": "boot-b",
        "previous_incarnation_id": "inc-a",
        "incarnation_id": "inc-b",
        "epoch": 2,
    }
    assert (await cert_row(store, peer.serial))["revoked_at_ms"] is None
    # The newer session routes the node.
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, NODE)
    assert row is not None and row["boot_id"] == "boot-b" and row["session_epoch"] == 2


async def test_an_agent_restart_on_the_same_boot_is_no_takeover(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity
) -> None:
    for i in range(DUPLICATE_LIMIT * 3):
        res = await say_hello(store, bus, peer, "boot-a", f"inc-{i}")
        assert not res.quarantined
    assert await events(store, TAKEOVER) == []
    assert (await cert_row(store, peer.serial))["revoked_at_ms"] is None


async def test_a_new_boot_after_the_session_closed_is_a_reboot_not_a_takeover(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity
) -> None:
    for i in range(DUPLICATE_LIMIT * 3):
        res = await say_hello(store, bus, peer, f"boot-{i}")
        assert not res.quarantined
        await close(store, res.epoch)
    assert await events(store, TAKEOVER) == []
    assert await events(store, QUARANTINED) == []


async def test_the_fourth_takeover_in_ten_minutes_quarantines_the_identity(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity, ca: CertificateAuthority, clock: LoopClock
) -> None:
    renewed = await add_cert(store, ca)  # the node's other live certificate (a renewal): it goes too
    await say_hello(store, bus, peer, "boot-a")
    results = []
    for boot in ["boot-b", "boot-a", "boot-b"]:  # two machines taking the session from each other
        await advance(60)
        results.append(await say_hello(store, bus, peer, boot))
    assert [r.quarantined for r in results] == [False, False, False]
    assert len(await events(store, TAKEOVER)) == DUPLICATE_LIMIT
    assert await events(store, QUARANTINED) == []

    await advance(60)
    fourth = await say_hello(store, bus, peer, "boot-a")
    now_ms = await store.now_ms()
    assert fourth.quarantined and fourth.replay == [] and fourth.ack == []
    assert len(await events(store, TAKEOVER)) == DUPLICATE_LIMIT + 1
    [q] = await events(store, QUARANTINED)
    assert q["subject"] == NODE
    data = json.loads(q["data"])
    assert data["reason"] == "duplicate-identity" and data["takeovers"] == DUPLICATE_LIMIT + 1
    assert sorted(data["serials"]) == sorted([peer.serial, renewed.serial])
    for serial in (peer.serial, renewed.serial):
        row = await cert_row(store, serial)
        assert (row["revoked_at_ms"], row["revoke_reason"]) == (now_ms, "duplicate-identity")
    # Both clones are out: the next Hello with that identity is refused.
    for boot in ("boot-a", "boot-b"):
        with pytest.raises(Unauthenticated, match="revoked"):
            await say_hello(store, bus, peer, boot)
    with pytest.raises(Unauthenticated, match="revoked"):
        await say_hello(store, bus, renewed, "boot-b")


async def test_a_quarantine_replays_no_commands(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity, clock: LoopClock
) -> None:
    first = await say_hello(store, bus, peer, "boot-a")
    row = await enqueue(store, bus, SIGNER, EnqueueRequest(NODE, "inventory.refresh", any_pb2.Any()), random.Random(1))
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        assert await cmd_sql.mark_dispatched(tx, str(row["id"]), NODE, first.epoch, now_ms)
    res = await say_hello(store, bus, peer, "boot-b")
    assert res.replay == [str(row["id"])]  # an ordinary takeover still resumes the node's commands
    for boot in ("boot-a", "boot-b"):
        assert not (await say_hello(store, bus, peer, boot)).quarantined
    res = await say_hello(store, bus, peer, "boot-a")
    assert res.quarantined and res.replay == []


async def test_takeovers_older_than_ten_minutes_do_not_count(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity, clock: LoopClock
) -> None:
    boots = ["boot-a", "boot-b"]
    await say_hello(store, bus, peer, "boot-a")
    for i in range(DUPLICATE_LIMIT):
        assert not (await say_hello(store, bus, peer, boots[(i + 1) % 2])).quarantined
    await advance(DUPLICATE_WINDOW_MS / 1000 + 0.001)
    # Three more takeovers: with the old three out of the window they are the 1st, 2nd and 3rd.
    for i in range(DUPLICATE_LIMIT):
        assert not (await say_hello(store, bus, peer, boots[i % 2])).quarantined
    assert await events(store, QUARANTINED) == []
    assert (await cert_row(store, peer.serial))["revoked_at_ms"] is None
    # A fourth within this window trips it.
    assert (await say_hello(store, bus, peer, boots[DUPLICATE_LIMIT % 2])).quarantined


async def test_the_window_slides(store: InlineSqliteStore, bus: Bus, peer: PeerIdentity, clock: LoopClock) -> None:
    """Takeovers at 0, 4, 8 and 11 minutes: at 11 the one at 0 has left the window; at 12 four are in it."""
    boots = ["boot-b", "boot-a"]
    await say_hello(store, bus, peer, "boot-a")
    outcomes, prev = [], 0
    for i, minute in enumerate([0, 4, 8, 11, 12]):
        await advance((minute - prev) * 60)
        prev = minute
        outcomes.append((await say_hello(store, bus, peer, boots[i % 2])).quarantined)
    assert outcomes == [False, False, False, False, True]


async def test_a_takeover_exactly_ten_minutes_old_still_counts(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity, clock: LoopClock
) -> None:
    boots = ["boot-b", "boot-a"]
    await say_hello(store, bus, peer, "boot-a")
    outcomes, prev = [], 0
    for i, minute in enumerate([0, 1, 2, 10]):
        await advance((minute - prev) * 60)
        prev = minute
        outcomes.append((await say_hello(store, bus, peer, boots[i % 2])).quarantined)
    assert outcomes == [False, False, False, True]


async def test_takeovers_are_counted_per_node(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity, ca: CertificateAuthority
) -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await nodes_sql.ensure(tx, "n2", "node", now_ms)
    peer2 = await add_cert(store, ca, "n2")

    async def hello2(boot: str) -> HelloResult:
        h = session_pb2.Hello(node_id="n2", boot_id=boot, journal_id="j", incarnation_id=boot)
        return await hello_transaction(store, bus, SIGNER, GW, peer2, h)

    await say_hello(store, bus, peer, "boot-a")
    await hello2("x")
    for i in range(DUPLICATE_LIMIT):
        await say_hello(store, bus, peer, ["boot-b", "boot-a"][i % 2])
        assert not (await hello2(["y", "x"][i % 2])).quarantined
    assert await events(store, QUARANTINED) == []


async def test_takeovers_before_a_rejoin_do_not_count_against_the_new_identity(
    store: InlineSqliteStore, bus: Bus, peer: PeerIdentity, ca: CertificateAuthority, clock: LoopClock
) -> None:
    """After a quarantine the operator re-joins the real machine (a new identity generation, a new certificate).

    The count is of `security.node.duplicate-session` events by node name only, so the old identity's
    takeovers still fill the window: the re-joined node's *first* takeover within 10 minutes of the
    quarantine (e.g. a quick reboot while its session still looked open) quarantines it again at once,
    where the rule says the 4th.
    """
    await say_hello(store, bus, peer, "boot-a")
    for boot in ["boot-b", "boot-a", "boot-b", "boot-a"]:
        res = await say_hello(store, bus, peer, boot)
    assert res.quarantined
    await close(store, res.epoch)  # the revocation feed ends the clones' session

    await advance(60)
    async with store.transaction() as tx:
        idgen = await id_sql.bump_identity_generation(tx, NODE)
    rejoined = await add_cert(store, ca, identity_generation=idgen)
    assert not (await say_hello(store, bus, rejoined, "boot-c")).quarantined
    await advance(60)
    res = await say_hello(store, bus, rejoined, "boot-d")  # one takeover for this identity
    assert not res.quarantined
