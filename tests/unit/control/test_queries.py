"""The read side every client shares (bc/control/reads/queries.py) against the real SQLite store on the virtual clock.

Each read returns what an operator is shown; each snapshot carries the seq of
its own read, so the events after that seq are exactly the changes it does
not show.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import any_pb2

from bc.control.base.bus import Bus
from bc.control.capacity import reservations
from bc.control.commands.queue import EnqueueRequest, enqueue
from bc.control.nodes import admin as node_admin
from bc.control.nodes import specs
from bc.control.quorum import approvers as appr
from bc.control.quorum import batches as quorum
from bc.control.reads import queries
from bc.control.signing.signer import NullSigner
from bc.errors import NotFound, UsageError
from bc.jobs import queries as job_queries
from bc.pki import quorum as q
from bc.protocol.pb import common_pb2
from bc.store import events as events_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance
from tests.unit.control.quorum_setup import add_operator, change, install, raw

AddNode = Callable[..., Awaitable[common_pb2.Inventory]]

SIGNER = NullSigner()
RNG = random.Random(11)
REQUESTER = "ops"
NAMES = ["alice", "bob", "carol"]


async def last_seq(store: InlineSqliteStore) -> int:
    async with store.transaction(write=False) as tx:
        return await events_sql.last_seq(tx)


async def run(store: InlineSqliteStore, bus: Bus, node_id: str) -> str:
    row = await enqueue(store, bus, SIGNER, EnqueueRequest(node_id, "inventory.refresh", any_pb2.Any()), RNG)
    return str(row["id"])


@pytest.fixture
def keys() -> dict[str, ed25519.Ed25519PrivateKey]:
    return {n: ed25519.Ed25519PrivateKey.generate() for n in NAMES}


@pytest.fixture
async def quorum_ready(store: InlineSqliteStore, bus: Bus, keys: dict[str, ed25519.Ed25519PrivateKey]) -> None:
    """alice, bob and carol approve (k = 2), each held by the operator of that name; `ops` asks."""
    await install(store, bus, keys, k=2)
    await add_operator(store, REQUESTER)


async def create_batch(store: InlineSqliteStore, bus: Bus, nodes: list[str], not_after_s: float = 3600.0) -> str:
    req = quorum.BatchRequest(
        kind="gpu.reset",
        node_ids=nodes,
        payload_json=json.dumps({"gpu_uuids": ["GPU-aaaa"]}),
        reason="XID 79",
        not_after_s=not_after_s,
    )
    return await quorum.create_batch(store, bus, SIGNER, req, REQUESTER, RNG)


async def approve(store: InlineSqliteStore, bus: Bus, batch_id: str, name: str, key: ed25519.Ed25519PrivateKey) -> None:
    """`name` approves under their own operator's certificate, for ten minutes."""
    b = await queries.batch(store, batch_id)
    expires = await store.now_ms() + 600_000
    msg = q.approval_message(b.id, bytes.fromhex(b.scope_root), len(b.leaves), b.requested_by, expires)
    await quorum.decide(
        store, bus, batch_id, q.key_id(raw(key)), key.sign(msg), approve=True, caller=name, expires_at_ms=expires
    )


# -- nodes -----------------------------------------------------------------------------------------


async def test_the_fleet_is_every_node_with_the_seq_of_its_read(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    await add_node("n2", connectivity="disconnected")
    await run(store, bus, "n1")  # an event, so the seq is not 0
    fleet = await queries.fleet(store)
    assert [(n.node_id, n.state) for n in fleet.nodes] == [("n1", "connected"), ("n2", "disconnected")]
    assert fleet.event_seq == await last_seq(store) > 0
    assert not fleet.nodes[0].HasField("inventory")  # the list leaves the detail to `node`


async def test_a_deleted_node_shows_only_when_asked(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    await add_node("n2")
    await node_admin.cordon(store, bus, "n2", True)
    await node_admin.delete(store, bus, "n2")
    assert [n.node_id for n in (await queries.fleet(store)).nodes] == ["n1"]
    every = await queries.fleet(store, include_deleted=True)
    assert {n.node_id: n.state for n in every.nodes}["n2"] == "deleted"
    assert (await queries.node(store, "n2")).state == "deleted"  # its history is kept
    with pytest.raises(NotFound):
        await queries.node_summary(store, "n2")


async def test_a_node_in_detail_carries_its_inventory_capacity_and_seq(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    inv = await add_node("n1")
    await reservations.reserve(store, bus, SIGNER, reservations.ReserveRequest(gpus=3, node_id="n1"), RNG)
    info = await queries.node(store, "n1")
    assert len(info.inventory.gpus) == len(inv.gpus) == 8
    assert [(c.device_class, c.offered, c.booked_now, c.free_now) for c in info.capacity] == [("gpu", 8, 3, 5)]
    assert info.event_seq == await last_seq(store) > 0
    summary = await queries.node_summary(store, "n1")
    assert summary.node_id == "n1" and not summary.HasField("inventory") and not summary.capacity
    with pytest.raises(NotFound, match="no node named 'nope'"):
        await queries.node(store, "nope")


async def test_the_spec_of_a_node(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    await specs.set_section(store, bus, SIGNER, "n1", "telemetry", '{"otlp_endpoint": "https://a"}')
    spec = await queries.spec(store, "n1")
    assert (spec.node_id, spec.generation) == ("n1", 1) and spec.spec_hash
    assert json.loads(spec.spec_json)["telemetry"]["otlp_endpoint"] == "https://a"
    with pytest.raises(NotFound):
        await queries.spec(store, "nope")


# -- reservations ----------------------------------------------------------------------------------


async def test_reservations_and_one_reservation(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    a = await reservations.reserve(store, bus, SIGNER, reservations.ReserveRequest(gpus=2, node_id="n1"), RNG)
    b = await reservations.reserve(store, bus, SIGNER, reservations.ReserveRequest(gpus=8), RNG)  # waits
    assert str(b["state"]) == "pending"
    listed = await queries.reservations(store, include_released=True)
    assert [r.id for r in listed.reservations] == [str(a["id"]), str(b["id"])]
    assert listed.event_seq == await last_seq(store) > 0
    one = await queries.reservation(store, str(a["id"]))
    assert (one.node_id, one.gpus, len(one.devices)) == ("n1", 2, 2)
    assert [r.id for r in (await queries.reservations(store, node_id="n1")).reservations] == [str(a["id"])]
    with pytest.raises(NotFound):
        await queries.reservation(store, "r-nope")


# -- commands --------------------------------------------------------------------------------------


async def test_commands_newest_first_within_the_limit(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    await add_node("n2")
    ids = []
    for n in ("n1", "n2", "n1"):
        ids.append(await run(store, bus, n))
        await advance(0.01)
    every = await queries.commands(store)
    assert [c.id for c in every.commands] == ids[::-1]
    assert every.event_seq == await last_seq(store)
    assert [c.id for c in (await queries.commands(store, node_id="n1")).commands] == [ids[2], ids[0]]
    assert [c.id for c in (await queries.commands(store, limit=1)).commands] == [ids[2]]
    assert (await queries.commands(store, state="succeeded")).commands == []
    with pytest.raises(UsageError, match="unknown command state"):
        await queries.commands(store, state="bogus")
    with pytest.raises(UsageError, match="negative"):
        await queries.commands(store, limit=-1)
    assert (await queries.command(store, ids[1])).node_id == "n2"
    with pytest.raises(NotFound):
        await queries.command(store, "c-nope")


# -- the seq of a snapshot -------------------------------------------------------------------------


async def test_what_a_snapshot_does_not_show_is_exactly_what_follows_its_seq(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    before = await run(store, bus, "n1")
    snap = await queries.commands(store)
    after = await run(store, bus, "n1")
    assert [c.id for c in snap.commands] == [before]
    later = await queries.events_after(store, snap.event_seq)
    assert {e.subject for e in later if e.type.startswith("command.")} == {after}
    assert all(e.seq > snap.event_seq for e in later)
    assert before not in {e.subject for e in later}


# -- batches and approvals -------------------------------------------------------------------------


@pytest.mark.usefixtures("quorum_ready")
async def test_batches_by_state_with_expired_ones_shown_as_expired(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1", profile=None)
    short = await create_batch(store, bus, ["n1"], not_after_s=1.0)
    await advance(2.0)
    live = await create_batch(store, bus, ["n1"])
    every = await queries.batches(store)
    assert [(b.id, b.state) for b in every.batches] == [(live, "pending"), (short, "expired")]
    assert every.event_seq == await last_seq(store)
    assert [b.id for b in (await queries.batches(store, "pending")).batches] == [live]
    assert [b.id for b in (await queries.batches(store, "expired")).batches] == [short]
    assert (await queries.batches(store, "approved")).batches == []
    with pytest.raises(UsageError, match="unknown batch state"):
        await queries.batches(store, "bogus")
    one = await queries.batch(store, live)
    assert (one.requested_by, one.threshold, [leaf.node_id for leaf in one.leaves]) == (REQUESTER, 2, ["n1"])
    with pytest.raises(NotFound):
        await queries.batch(store, "b-nope")


@pytest.mark.usefixtures("quorum_ready")
async def test_a_removed_approvers_approval_counts_neither_in_the_view_nor_in_the_decision(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, keys: dict[str, ed25519.Ed25519PrivateKey]
) -> None:
    await add_node("n1", profile=None)
    batch_id = await create_batch(store, bus, ["n1"])
    await approve(store, bus, batch_id, "alice", keys["alice"])
    assert (await queries.batch(store, batch_id)).approvals == 1
    await change(store, bus, appr.RemoveApprover("alice"), keys)
    shown = await queries.batch(store, batch_id)
    # Her decision is still shown; it no longer counts, in the view as in the decision below.
    assert [d.name for d in shown.decisions] == ["alice"] and shown.approvals == 0
    await approve(store, bus, batch_id, "bob", keys["bob"])
    shown = await queries.batch(store, batch_id)
    assert (shown.state, shown.approvals, shown.threshold) == ("pending", 1, 2)
    await approve(store, bus, batch_id, "carol", keys["carol"])
    shown = await queries.batch(store, batch_id)
    assert (shown.state, shown.approvals) == ("approved", 2)
    assert [b.approvals for b in (await queries.batches(store, "approved")).batches] == [2]


@pytest.mark.usefixtures("quorum_ready")
async def test_an_expired_approval_counts_neither_in_the_view_nor_in_the_decision(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode, keys: dict[str, ed25519.Ed25519PrivateKey]
) -> None:
    await add_node("n1", profile=None)
    batch_id = await create_batch(store, bus, ["n1"])
    await approve(store, bus, batch_id, "alice", keys["alice"])
    await advance(601.0)
    assert (await queries.batch(store, batch_id)).approvals == 0
    await approve(store, bus, batch_id, "bob", keys["bob"])
    shown = await queries.batch(store, batch_id)
    assert (shown.state, shown.approvals) == ("pending", 1)


# -- approvers, quorum changes, operators ----------------------------------------------------------


async def test_the_approver_set_changes_and_operators(
    store: InlineSqliteStore, bus: Bus, keys: dict[str, ed25519.Ed25519PrivateKey]
) -> None:
    await install(store, bus, keys, k=2)
    s = await queries.approver_set(store)
    assert sorted(a.name for a in s.approvers) == NAMES and s.threshold == 2 and not s.HasField("change")
    proposed = await appr.propose(store, bus, appr.SetThreshold(3), REQUESTER, RNG)
    with_change = await queries.approver_set(store, proposed.change_id)
    assert with_change.change.id == proposed.change_id and with_change.change.state == "pending"
    assert [c.id for c in (await queries.quorum_changes(store, "pending")).changes] == [proposed.change_id]
    assert (await queries.quorum_change(store, proposed.change_id)).requested_by == REQUESTER
    with pytest.raises(NotFound):
        await queries.quorum_change(store, "q-nope")
    assert sorted(o.name for o in (await queries.operators(store)).operators) == [*NAMES, "local"]


# -- events and the server ---------------------------------------------------------------------------


async def test_events_pages_and_limits(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_node("n1")
    for _ in range(3):
        await run(store, bus, "n1")
    every = (await queries.events(store)).events
    assert [e.seq for e in every] == sorted(e.seq for e in every) and every[-1].seq == await last_seq(store)
    assert [e.seq for e in (await queries.events(store, after_seq=every[0].seq, limit=1)).events] == [every[1].seq]
    assert {e.type for e in (await queries.events(store, type_prefix="command.")).events} <= {
        e.type for e in every if e.type.startswith("command.")
    }
    with pytest.raises(UsageError, match="between 0 and 10,000"):
        await queries.events(store, limit=queries.MAX_EVENTS_LIMIT + 1)
    assert [e.seq for e in await queries.events_after(store, every[-2].seq)] == [every[-1].seq]


async def test_server_facts(store: InlineSqliteStore, bus: Bus, add_node: AddNode) -> None:
    await add_operator(store, "alice", role="viewer")
    await add_node("n1")
    await run(store, bus, "n1")
    facts = await queries.server_facts(store, "alice")
    assert (facts.role, facts.event_seq, facts.now_ms) == ("viewer", await last_seq(store), await store.now_ms())
    assert (await queries.server_facts(store, "stranger")).role == ""


# -- jobs (their reads live beside the queue) --------------------------------------------------------


async def test_the_jobs_snapshot_reads_dags_pools_and_seq_at_once(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await add_node("n1")
    await run(store, bus, "n1")
    snap = await job_queries.jobs_snapshot(store)
    assert snap.dags == [] and snap.seq == await last_seq(store) > 0
    assert snap.pools == await job_queries.list_pools(store)
