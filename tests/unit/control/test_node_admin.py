"""Taking a node out: revoke its certificates, cordon it, delete it."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable

import pytest
from cryptography.hazmat.primitives import serialization
from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.capacity.reservations import ReserveRequest, on_allocation_report, release, reserve
from bc.control.commands.queue import EnqueueRequest, enqueue
from bc.control.nodes import admin as node_admin
from bc.control.signing.signer import NullSigner
from bc.errors import Conflict, NotFound, Unauthenticated, UsageError
from bc.gateway.hello import hello_transaction
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import PeerIdentity, make_csr, peer_identity
from bc.pki.secrets_source import SystemSecrets
from bc.protocol.pb import common_pb2, session_pb2
from bc.seams.clock import LoopClock
from bc.store import Row
from bc.store import events as events_sql
from bc.store import identity as id_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance

pytestmark = pytest.mark.usefixtures("gateway_lease")  # hello_transaction routes as gw-1

SIGNER = NullSigner()  # signing off, explicitly: a test of signing makes a KeySigner
RNG = random.Random(1)  # ids and serials, as the one seeded Random of a process would give them
SECRETS = SystemSecrets()

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]
Count = Callable[[str], Awaitable[int]]
AddCert = Callable[..., Awaitable[PeerIdentity]]


@pytest.fixture
def ca(clock: LoopClock) -> CertificateAuthority:
    return CertificateAuthority.create(clock, RNG, SECRETS)


@pytest.fixture
def add_cert(store: InlineSqliteStore, ca: CertificateAuthority) -> AddCert:
    """Issue a real node certificate and record it as `bc join` / renewal do; returns its identity."""

    async def add(node_id: str, identity_generation: int = 1) -> PeerIdentity:
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

    return add


async def cert(store: InlineSqliteStore, serial: str) -> Row:
    async with store.transaction(write=False) as tx:
        row = await id_sql.get_cert(tx, serial)
    assert row is not None
    return row


async def node(store: InlineSqliteStore, node_id: str) -> Row | None:
    async with store.transaction(write=False) as tx:
        return await nodes_sql.get(tx, node_id)


async def events(store: InlineSqliteStore, prefix: str) -> list[Row]:
    async with store.transaction(write=False) as tx:
        return await events_sql.list_events(tx, 0, 1000, prefix)


async def rows_of(store: InlineSqliteStore, table: str, node_id: str) -> int:
    async with store.transaction(write=False) as tx:
        return int(await tx.fetchval(f"SELECT COUNT(*) FROM {table} WHERE node_id = :n", {"n": node_id}) or 0)


def hello(boot_id: str = "boot-1") -> session_pb2.Hello:
    return session_pb2.Hello(node_id="n1", boot_id=boot_id, journal_id="j-1", incarnation_id="i-1")


# -- revoke --------------------------------------------------------------------------------------


async def test_revoke_revokes_every_live_certificate_of_the_node(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, add_cert: AddCert
) -> None:
    await add_node("n1", profile=None)
    await add_node("n2", profile=None)
    a, b = await add_cert("n1"), await add_cert("n1")
    older = await add_cert("n1", identity_generation=0)  # an earlier identity's certificate, still unrevoked
    other = await add_cert("n2")
    now_ms = await store.now_ms()

    serials = await node_admin.revoke(store, bus, "n1", "  laptop stolen \n")
    assert sorted(serials) == sorted([a.serial, b.serial, older.serial])
    for s in serials:
        row = await cert(store, s)
        assert (row["revoked_at_ms"], row["revoke_reason"]) == (now_ms, "laptop stolen")
    assert (await cert(store, other.serial))["revoked_at_ms"] is None
    [ev] = await events(store, "security.node.revoked")
    assert ev["subject"] == "n1"
    assert json.loads(ev["data"]) == {"reason": "laptop stolen", "serials": serials}


async def test_a_revoked_certificate_is_refused_at_the_next_hello(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, add_cert: AddCert
) -> None:
    await add_node("n1", profile=None)
    peer = await add_cert("n1")
    await hello_transaction(store, bus, SIGNER, "gw-1", peer, hello())
    await node_admin.revoke(store, bus, "n1", "compromised")
    with pytest.raises(Unauthenticated, match="has been revoked"):
        await hello_transaction(store, bus, SIGNER, "gw-1", peer, hello())


async def test_revoking_twice_is_not_an_error_and_changes_nothing(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, add_cert: AddCert
) -> None:
    await add_node("n1", profile=None)
    peer = await add_cert("n1")
    first = await node_admin.revoke(store, bus, "n1", "first")
    before = await cert(store, peer.serial)
    await advance(30)
    assert await node_admin.revoke(store, bus, "n1", "second") == []
    assert await cert(store, peer.serial) == before  # time and reason of the first revocation stay
    assert len(await events(store, "security.node.revoked")) == 1
    assert first == [peer.serial]


async def test_a_node_without_certificates_revokes_nothing_and_publishes_nothing(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    assert await node_admin.revoke(store, bus, "n1", "why") == []
    assert await events(store, "security.") == []


async def test_revoking_an_unknown_node_is_not_found_and_stores_nothing(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, add_cert: AddCert
) -> None:
    await add_node("n1", profile=None)
    peer = await add_cert("n1")
    with pytest.raises(NotFound, match="no node named 'ghost'"):
        await node_admin.revoke(store, bus, "ghost", "why")
    assert (await cert(store, peer.serial))["revoked_at_ms"] is None
    assert await events(store, "security.") == []


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("", "revoked by an operator"),
        ("   \t\n", "revoked by an operator"),
        ("x" * 200, "x" * 200),
        ("  " + "y" * 200 + "  ", "y" * 200),  # the limit applies after trimming
        ("clone seen in rack 4", "clone seen in rack 4"),
    ],
)
async def test_the_reason_is_trimmed_and_defaulted(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, add_cert: AddCert, given: str, stored: str
) -> None:
    await add_node("n1", profile=None)
    peer = await add_cert("n1")
    await node_admin.revoke(store, bus, "n1", given)
    assert (await cert(store, peer.serial))["revoke_reason"] == stored


@pytest.mark.parametrize("reason", ["x" * 201, "z" * 5000, " " + "é" * 201])
async def test_a_reason_longer_than_200_characters_is_refused_before_anything_changes(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, add_cert: AddCert, reason: str
) -> None:
    await add_node("n1", profile=None)
    peer = await add_cert("n1")
    with pytest.raises(UsageError, match="longer than 200 characters"):
        await node_admin.revoke(store, bus, "n1", reason)
    assert (await cert(store, peer.serial))["revoked_at_ms"] is None
    assert await events(store, "security.") == []


# -- cordon --------------------------------------------------------------------------------------


async def test_cordon_and_uncordon_publish_once_per_change(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    assert await node_admin.cordon(store, bus, "n1", True) is True
    assert (await node(store, "n1") or {}).get("cordoned") == 1
    assert await node_admin.cordon(store, bus, "n1", True) is False
    assert await node_admin.cordon(store, bus, "n1", False) is True
    assert (await node(store, "n1") or {}).get("cordoned") == 0
    assert await node_admin.cordon(store, bus, "n1", False) is False
    evs = await events(store, "node.")
    assert [(e["type"], e["subject"]) for e in evs if e["type"].endswith("cordoned")] == [
        ("node.cordoned", "n1"),
        ("node.uncordoned", "n1"),
    ]


async def test_uncordoning_a_node_that_never_was_cordoned_changes_nothing(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    assert await node_admin.cordon(store, bus, "n1", False) is False
    assert await events(store, "node.uncordoned") == []


async def test_cordoning_an_unknown_node_is_not_found(store: InlineSqliteStore, bus: Bus) -> None:
    with pytest.raises(NotFound, match="no node named 'ghost'"):
        await node_admin.cordon(store, bus, "ghost", True)
    assert await events(store, "node.") == []


async def waits(store: InlineSqliteStore, bus: Bus, req: ReserveRequest) -> str:
    """A reservation that does not fit now waits `pending`, unbooked; withdrawn at once. Its reason."""
    row = await reserve(store, bus, SIGNER, req, RNG)
    assert (row["state"], row["node_id"]) == ("pending", None)
    await release(store, bus, SIGNER, str(row["id"]))
    return str(row["reason"])


async def test_a_cordoned_node_gets_no_new_reservations(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    await node_admin.cordon(store, bus, "n1", True)
    # Issue 13: a cordoned node makes a reservation wait with that reason (it was a Conflict).
    assert await waits(store, bus, ReserveRequest(gpus=1, node_id="n1")) == "node n1 is cordoned"
    assert await waits(store, bus, ReserveRequest(gpus=1)) == "no schedulable node: node n1 is cordoned"
    await node_admin.cordon(store, bus, "n1", False)
    assert (await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), RNG))["node_id"] == "n1"


async def _placement_snapshot(store: InlineSqliteStore) -> tuple[list[Row], list[Row]]:
    async with store.transaction(write=False) as tx:
        return (
            await tx.fetchall("SELECT * FROM reservations ORDER BY id"),
            await tx.fetchall("SELECT node_id, generation, spec FROM nodes ORDER BY node_id"),
        )


async def test_a_revoked_node_is_never_placed_on_not_even_when_named(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, add_cert: AddCert
) -> None:
    await add_node("n1")
    await add_cert("n1")
    await node_admin.revoke(store, bus, "n1", "stolen")
    before = await _placement_snapshot(store)
    with pytest.raises(Conflict, match="n1 is revoked"):
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, node_id="n1"), RNG)
    with pytest.raises(Conflict, match="no node in the fleet has 1 GPU"):  # issue 13's never-fits sentence
        await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), RNG)
    assert await _placement_snapshot(store) == before


@pytest.mark.parametrize("state", ["new", "disconnected", "unreachable"])
async def test_placement_picks_only_connected_nodes(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, state: str
) -> None:
    await add_node("n1", connectivity=state)  # sorts first and has every GPU free
    await add_node("n2", profile="l4-slots-4")
    assert (await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), RNG))["node_id"] == "n2"
    # Issue 13: only n1 has six, and it is away: the reservation waits (it was a Conflict) ...
    assert await waits(store, bus, ReserveRequest(gpus=6)) == "no node with 6 free GPUs"
    # ... and named, it waits for n1 with that reason (it was placed on n1, to bind when n1 came back).
    assert await waits(store, bus, ReserveRequest(gpus=6, node_id="n1")) == f"node n1 is {state}"


async def test_a_node_with_a_live_certificate_of_its_current_identity_is_placeable(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, add_cert: AddCert
) -> None:
    await add_node("n1")
    await add_cert("n1", identity_generation=0)  # an earlier identity's certificate, then revoked
    await node_admin.revoke(store, bus, "n1", "re-joined")
    await add_cert("n1")  # the current identity's, live
    assert (await reserve(store, bus, SIGNER, ReserveRequest(gpus=1), RNG))["node_id"] == "n1"


async def test_cordoning_keeps_existing_reservations(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    r = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), RNG)
    await node_admin.cordon(store, bus, "n1", True)
    async with store.transaction(write=False) as tx:
        state = await tx.fetchval("SELECT state FROM reservations WHERE id = :id", {"id": r["id"]})
    assert state == "placed"


# -- delete --------------------------------------------------------------------------------------


async def test_delete_is_refused_unless_the_node_is_cordoned(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, add_cert: AddCert
) -> None:
    await add_node("n1", profile=None)
    peer = await add_cert("n1")
    with pytest.raises(Conflict, match="not cordoned; cordon it first: bc nodes cordon n1"):
        await node_admin.delete(store, bus, "n1")
    assert await node(store, "n1") is not None
    assert (await cert(store, peer.serial))["revoked_at_ms"] is None
    assert await events(store, "node.deleted") == []


async def test_delete_is_refused_while_a_reservation_is_live(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, add_cert: AddCert
) -> None:
    await add_node("n1")
    peer = await add_cert("n1")
    r = await reserve(store, bus, SIGNER, ReserveRequest(gpus=2, node_id="n1"), random.Random(1))
    await node_admin.cordon(store, bus, "n1", True)
    with pytest.raises(Conflict, match="still has 1 reservation"):
        await node_admin.delete(store, bus, "n1")
    # Releasing is not enough: the node has not confirmed it let go of the devices.
    await release(store, bus, SIGNER, str(r["id"]))
    with pytest.raises(Conflict, match="still has 1 reservation"):
        await node_admin.delete(store, bus, "n1")
    assert (await cert(store, peer.serial))["revoked_at_ms"] is None

    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        outcome = await on_allocation_report(tx, bus, SIGNER, "n1", "released", str(r["allocation_id"]), "", "", now_ms)
    assert outcome == "released"
    assert await node_admin.delete(store, bus, "n1") == [peer.serial]


async def test_delete_leaves_a_tombstone_that_keeps_the_history_and_revokes_its_certificates(
    store: InlineSqliteStore, bus: Bus, clock: LoopClock, add_node: AddNode, add_cert: AddCert, count: Count
) -> None:
    await add_node("n1")
    await add_node("n2")
    peer = await add_cert("n1")
    already = await add_cert("n1")
    other = await add_cert("n2")
    await node_admin.revoke(store, bus, "n1", "earlier")  # `already` and `peer` are revoked here...
    fresh = await add_cert("n1")  # ...and this one is live when the node is deleted
    await hello_transaction(
        store, bus, SIGNER, "gw-1", other, session_pb2.Hello(node_id="n2", boot_id="b", journal_id="j")
    )
    rng = random.Random(2)
    for n in ("n1", "n2"):
        await enqueue(store, bus, SIGNER, EnqueueRequest(n, "inventory.refresh", any_pb2.Any()), rng)
        r = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, node_id=n), rng)
        await release(store, bus, SIGNER, str(r["id"]))
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            await on_allocation_report(tx, bus, SIGNER, n, "released", str(r["allocation_id"]), "", "", now_ms)
            await tx.execute(
                "INSERT INTO node_events (node_id, journal_id, seq, type, body, received_at_ms)"
                " VALUES (:n, 'j', 1, 'x', NULL, :t)",
                {"n": n, "t": now_ms},
            )
            await nodes_sql.open_session(
                tx,
                node_id=n,
                gateway_id="gw-1",
                journal_id="j",
                boot_id="b",
                incarnation_id="i",
                cert_serial="",
                now_ms=now_ms,
            )
            await id_sql.insert_token(
                tx,
                token_id=f"t-{n}",
                secret_hash="h",
                node_id=n,
                role="node",
                root_cert_pem="pem",
                created_at_ms=now_ms,
                expires_at_ms=now_ms + 60_000,
            )
    await node_admin.cordon(store, bus, "n1", True)
    await advance(5)
    now_ms = await store.now_ms()

    assert await node_admin.delete(store, bus, "n1") == [fresh.serial]

    assert await node(store, "n1") is None  # every live read skips the tombstone...
    async with store.transaction(write=False) as tx:
        tomb = await nodes_sql.get(tx, "n1", include_deleted=True)  # ...which history still finds
        assert [str(r["node_id"]) for r in await nodes_sql.list_all(tx)] == ["n2"]
        assert [str(r["node_id"]) for r in await nodes_sql.list_all(tx, include_deleted=True)] == ["n1", "n2"]
    assert tomb is not None and tomb["deleted_at_ms"] == now_ms and tomb["connectivity"] == "deleted"
    # Billing and audit keep every row; the routing and the unused token go.
    for table in ("reservations", "device_bookings", "commands", "node_events"):
        assert await rows_of(store, table, "n1") >= 1, table
    for table in ("node_sessions", "join_tokens"):
        assert await rows_of(store, table, "n1") == 0, table
        assert await rows_of(store, table, "n2") >= 1, table
    async with store.transaction(write=False) as tx:
        states = [str(r["state"]) for r in await tx.fetchall("SELECT state FROM commands WHERE node_id = 'n1'")]
    assert states == ["cancelled"]  # the inventory.refresh never sent: settled node-deleted
    # The certificates stay, all revoked, as the record of who the node was.
    assert await rows_of(store, "node_certs", "n1") == 3
    assert (await cert(store, fresh.serial))["revoke_reason"] == "node deleted"
    assert (await cert(store, fresh.serial))["revoked_at_ms"] == now_ms
    assert (await cert(store, already.serial))["revoke_reason"] == "earlier"
    assert (await cert(store, peer.serial))["revoke_reason"] == "earlier"
    assert (await cert(store, other.serial))["revoked_at_ms"] is None
    assert await node(store, "n2") is not None
    [ev] = await events(store, "node.deleted")
    assert ev["subject"] == "n1" and json.loads(ev["data"]) == {"revoked_serials": [fresh.serial]}
    assert ev["at_ms"] == now_ms
    # The deleted node's certificate opens no session.
    with pytest.raises(Unauthenticated):
        await hello_transaction(store, bus, SIGNER, "gw-1", fresh, hello())


async def test_a_failed_reservation_does_not_block_delete(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    r = await reserve(store, bus, SIGNER, ReserveRequest(gpus=1, node_id="n1"), RNG)
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await on_allocation_report(tx, bus, SIGNER, "n1", "failed", str(r["allocation_id"]), "no-device", "m", now_ms)
    await node_admin.cordon(store, bus, "n1", True)
    assert await node_admin.delete(store, bus, "n1") == []
    assert await node(store, "n1") is None


async def test_deleting_an_unknown_or_deleted_node_is_not_found(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    with pytest.raises(NotFound, match="no node named 'ghost'"):
        await node_admin.delete(store, bus, "ghost")
    await add_node("n1", profile=None)
    await node_admin.cordon(store, bus, "n1", True)
    await node_admin.delete(store, bus, "n1")
    with pytest.raises(NotFound):
        await node_admin.delete(store, bus, "n1")
    assert len(await events(store, "node.deleted")) == 1


async def test_a_deleted_node_id_joins_again_and_keeps_its_history(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    await node_admin.cordon(store, bus, "n1", True)
    await node_admin.delete(store, bus, "n1")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        assert await nodes_sql.ensure(tx, "n1", "node", now_ms) is False  # the tombstone is the same node
        assert await nodes_sql.revive(tx, "n1", now_ms) is True
        assert await nodes_sql.revive(tx, "n1", now_ms) is False  # live already
    row = await node(store, "n1")
    assert row is not None and row["cordoned"] == 0 and row["connectivity"] == "new"
    assert len(await events(store, "node.deleted")) == 1
