"""The fleet listing's rows (`views.add_listed_node`, from the store's tuples) are what `node_info` makes of a
node's row read alone (`bc nodes show`'s path without the detail): the same message for every kind of node.

The listing reads its rows by position and its certificates per identity generation, a path of its own for
speed; this pins it to the one `GetNode` and a write's reply take, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import random

from google.protobuf.json_format import MessageToJson

from agent.hw.fake import FakeHardware
from bc.control.reads import queries, views
from bc.protocol.pb import admin_pb2, common_pb2
from bc.store import Store
from bc.store import health as health_sql
from bc.store import identity as identity_sql
from bc.store import jobs as jobs_sql
from bc.store import node_lifecycle as lifecycle_sql
from bc.store import nodes as nodes_sql
from bc.store import revocation as rev_sql
from bc.store.base import Tx


async def _cert(tx: Tx, node_id: str, serial: str, generation: int, not_after_ms: int) -> None:
    await identity_sql.insert_cert(
        tx,
        serial=serial,
        node_id=node_id,
        identity_generation=generation,
        cert_pem="-----BEGIN CERTIFICATE-----",
        issued_at_ms=not_after_ms - 1000,
        not_after_ms=not_after_ms,
    )


async def _session(tx: Tx, node_id: str, now_ms: int, *, inventory: str, labels: dict[str, str]) -> None:
    await nodes_sql.open_session(
        tx,
        node_id=node_id,
        gateway_id="gw-1",
        journal_id=f"j-{node_id}",
        boot_id=f"b-{node_id}",
        incarnation_id="i",
        cert_serial="",
        now_ms=now_ms,
        hello=nodes_sql.HelloColumns(
            applied_generation=1,
            applied_spec_hash="sha256:applied",
            capabilities_json=json.dumps(["inventory", "reboot"]),
            labels_json=json.dumps(labels),
            inventory_json=inventory,
            inventory_hash=f"sha256:{node_id}",
        ),
    )


KINDS = ("a-busy", "b-plain", "c-revoked", "d-rejoined", "e-new", "f-away", "g-deleted")


async def _fleet_of_every_kind(store: Store) -> common_pb2.Inventory:
    """Nodes that differ in everything a listed row shows; the busy node's inventory."""
    inv = FakeHardware("hgx-h100-8", "t", rng=random.Random(1)).inventory()
    inv.gpus[3].healthy = False
    sick = MessageToJson(inv, preserving_proto_field_name=True)
    well = MessageToJson(FakeHardware("hgx-h100-8", "t", rng=random.Random(2)).inventory())
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        for node_id in KINDS:
            await nodes_sql.ensure(tx, node_id, "site" if node_id == "b-plain" else "node", now_ms - 5000)
        # Everything at once: a sick GPU, two GPU cordons, a node cordon, a job's hold, a live certificate.
        await _session(tx, "a-busy", now_ms, inventory=sick, labels={"rack": "r1", "zone": "z1"})
        await _cert(tx, "a-busy", "s-a", 1, now_ms + 86_400_000)
        await health_sql.cordon_gpu(tx, "a-busy", inv.gpus[0].uuid, "xid 79", None, False, "health", now_ms)
        await health_sql.cordon_gpu(tx, "a-busy", inv.gpus[5].uuid, "xid 48", None, True, "health", now_ms)
        await lifecycle_sql.set_cordoned(tx, "a-busy", True)
        await jobs_sql.set_job_hold(tx, "a-busy", "dag-7")
        await nodes_sql.write_spec(tx, "a-busy", 3, "{}", "sha256:spec", b"{}", b"s" * 64)
        # Connected and schedulable: no reasons at all.
        await _session(tx, "b-plain", now_ms, inventory=well, labels={"rack": "r1", "zone": "z1"})
        await _cert(tx, "b-plain", "s-b", 1, now_ms + 3_600_000)
        # Every certificate revoked: "revoked", with the reason.
        await _session(tx, "c-revoked", now_ms, inventory=well, labels={"own": "c"})
        await _cert(tx, "c-revoked", "s-c1", 1, now_ms + 1000)
        await _cert(tx, "c-revoked", "s-c2", 1, now_ms + 2000)
        await rev_sql.revoke_node(tx, "c-revoked", "key stolen", now_ms)
        # Joined again under a new identity: its revoked certificates of generation 1 no longer count.
        await _session(tx, "d-rejoined", now_ms, inventory=well, labels={})
        await _cert(tx, "d-rejoined", "s-d1", 1, now_ms + 9_000_000)
        await rev_sql.revoke_node(tx, "d-rejoined", "reset", now_ms)
        assert await identity_sql.bump_identity_generation(tx, "d-rejoined") == 2
        await _cert(tx, "d-rejoined", "s-d2", 2, now_ms + 7_000_000)
        # "e-new" never connected: no session, no certificate, no inventory.
        await _session(tx, "f-away", now_ms - 4000, inventory=well, labels={"rack": "r2"})
        await _cert(tx, "f-away", "s-f", 1, now_ms + 1)
        await nodes_sql.mark_seen(tx, "f-away", 1, now_ms - 3000)
        await nodes_sql.set_connectivity(tx, "f-away", "disconnected", now_ms - 2000, "gone")
        await lifecycle_sql.tombstone(tx, "g-deleted", now_ms)
    return inv


async def _read_alone(store: Store, node_id: str) -> admin_pb2.NodeInfo:
    """`node_info(detail=False)` of the node's row read by itself (a tombstone too), as `node_summary` reads it."""
    now_ms = await store.now_ms()
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id, include_deleted=True)
        certs = await rev_sql.cert_state(tx, node_id)
        cordons = await health_sql.gpu_cordons(tx, node_id)
    assert row is not None
    return views.node_info(row, now_ms, detail=False, certs=certs, gpu_cordons=cordons)


async def test_each_listed_node_is_the_node_read_alone(store: Store) -> None:
    inv = await _fleet_of_every_kind(store)
    listed = (await queries.fleet(store, include_deleted=True)).nodes
    assert tuple(n.node_id for n in listed) == KINDS
    for n in listed:
        assert n == await _read_alone(store, n.node_id), n.node_id
    busy, plain, revoked, rejoined, new, away, deleted = listed
    # What each case was for, as an operator reads it.
    cordons = sorted([(inv.gpus[0].uuid, "cordoned"), (inv.gpus[5].uuid, "quarantined")])  # in uuid order
    assert list(busy.no_schedule) == [
        "cordoned",
        "job dag-7",
        f"GPU {inv.gpus[3].uuid} unhealthy",
        *(f"GPU {uuid} {how}" for uuid, how in cordons),
    ]
    assert dict(busy.labels) == {"rack": "r1", "zone": "z1"} and list(busy.capabilities) == ["inventory", "reboot"]
    assert (busy.generation, busy.applied_generation, busy.gateway_id, busy.boot_id) == (3, 1, "gw-1", "b-a-busy")
    assert list(plain.no_schedule) == [] and plain.role == "site" and plain.cert_not_after_ms > 0
    assert revoked.revoked and revoked.revoke_reason == "key stolen" and list(revoked.no_schedule) == ["revoked"]
    assert not rejoined.revoked and rejoined.revoke_reason == ""
    assert (new.state, new.gateway_id, new.session_epoch, new.last_seen_age_ms, new.cert_not_after_ms) == (
        "new",
        "",
        0,
        -1,
        0,
    )
    assert away.state == "disconnected" and away.last_seen_age_ms == 3000 and away.state_age_ms == 2000
    assert deleted.state == "deleted"


async def test_the_pages_list_what_the_one_message_lists(store: Store) -> None:
    await _fleet_of_every_kind(store)
    whole = await queries.fleet(store)
    pages = [p async for p in queries.fleet_pages(store, page_size=2)]
    assert [len(p.nodes) for p in pages] == [2, 2, 2, 0]
    assert [n for p in pages for n in p.nodes] == list(whole.nodes)
    assert {p.event_seq for p in pages} == {whole.event_seq}
