"""A health policy's pre-approvals against a real store (SQLite and PostgreSQL): a version that names them opens
a one-leaf `health.preapprove` batch; it pre-approves nothing until k approvers signed it; then a remediation
in its pool asks for no batch and its command carries the signed version; outside the pool, for another kind,
or once expired, the reconciler asks for a batch again. What is asserted is what an operator sees: `bc health
policy show` (GetHealthPolicy), the batches `bc approve list` lists, the commands, the events with reasons.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.control.base.bus import Bus
from bc.control.health import admin as health_admin
from bc.control.nodes import admin as node_admin
from bc.control.quorum import batches
from bc.control.reads import health as health_reads
from bc.control.signing.signer import NullSigner
from bc.errors import UsageError
from bc.jobs.engine import JobEngine
from bc.jobs.health import HealthReconciler
from bc.pki import preapproval as pre
from bc.pki import quorum as q
from bc.protocol.pb.session_pb2 import DesiredStateBody
from bc.store import Store
from bc.store import nodes as nodes_sql
from bc.store import quorum as q_sql
from bc.testing import advance
from tests.unit.control.conftest import AddNode
from tests.unit.control.quorum_setup import install, raw
from tests.unit.control.test_health_loop import events, sick

POOLS = {"n1": "a", "n2": "a", "n3": "b", "n4": "a"}
HOUR_MS = 3_600_000
RNG = random.Random(9)  # the one Random of these tests' server


@pytest.fixture
async def gpus(store: Store, bus: Bus, add_node: AddNode) -> dict[str, list[str]]:
    out = {}
    for n, pool in POOLS.items():
        inv = await add_node(n)
        out[n] = [g.uuid for g in inv.gpus]
        await node_admin.label(store, bus, n, {"pool": pool}, [], NullSigner())
    return out


@pytest.fixture
def engine(store: Store, bus: Bus) -> JobEngine:
    return JobEngine(store, bus, NullSigner(), random.Random(3), holder="w1")


@pytest.fixture
async def keys(store: Store, bus: Bus) -> dict[str, ed25519.Ed25519PrivateKey]:
    k = {name: ed25519.Ed25519PrivateKey.generate() for name in ("alice", "bob", "carol")}
    await install(store, bus, k, k=2)
    return k


async def set_preapproving(store: Store, bus: Bus, lifetime_ms: int = HOUR_MS) -> int:
    now_ms = await store.now_ms()
    doc = {
        "limits": {"max_nodes": 10, "max_fleet_percent": 100, "max_actions_per_hour": 100},
        "preapprove": [{"kind": "gpu.reset", "pool": {"pool": "a"}, "expires_at_ms": now_ms + lifetime_ms}],
    }
    return await health_admin.set_policy(store, bus, json.dumps(doc), "admin", "pool a", RNG)


async def sign(store: Store, bus: Bus, batch_id: str, name: str, key: ed25519.Ed25519PrivateKey) -> None:
    """`bc approve sign` as `name`: the root recomputed from the payload, signed until the batch's own expiry."""
    async with store.transaction(write=False) as tx:
        b = await q_sql.get_batch(tx, batch_id)
    assert b is not None
    version, text = pre.payload_of(str(b["payload_json"]))
    root = pre.scope_root(version, text)
    expires = int(b["not_after_ms"])
    sig = key.sign(q.approval_message(batch_id, root, 1, str(b["requested_by"]), expires))
    await batches.decide(
        store, bus, batch_id, q.key_id(raw(key)), sig, approve=True, caller=name, expires_at_ms=expires
    )


async def started(store: Store) -> list[dict[str, Any]]:
    return [d for t, d in await events(store) if t == "health.remediation.started"]


async def reset_rows(store: Store) -> list[dict[str, Any]]:
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT node_id, held, preapproval, state FROM commands WHERE kind = 'gpu.reset'")
    return sorted((dict(r) for r in rows), key=lambda r: str(r["node_id"]))


async def test_a_version_pre_approves_its_pool_only_once_k_approvers_signed_it(
    store: Store, bus: Bus, gpus: dict[str, list[str]], keys: dict[str, ed25519.Ed25519PrivateKey], engine: JobEngine
) -> None:
    health = HealthReconciler(store, bus, engine, random.Random(4), holder="w1")
    v = await set_preapproving(store, bus)
    info = await health_reads.health_policy(store)
    assert (info.preapproval_state, info.preapproval_approvals, info.preapproval_threshold) == ("pending", 0, 2)
    assert [(e.kind, dict(e.pool), e.state) for e in info.preapprovals] == [
        ("gpu.reset", {"pool": "a"}, "waiting-for-approvals")
    ]
    batch_id = info.preapproval_batch
    async with store.transaction(write=False) as tx:
        b = await q_sql.get_batch(tx, batch_id)
    assert b is not None and b["kind"] == pre.BATCH_KIND and b["requested_by"] == "admin"
    assert f"health policy v{v} pre-approves gpu.reset in pool pool=a" in str(b["reason"])

    # Unsigned: n1's reset (pool a) waits for a batch of its own, and the event says why.
    await sick(store, "n1", gpus["n1"][0])
    await health.pass_once()
    (s1,) = await started(store)
    assert (
        s1["approval"] == f"a quorum batch (health policy v{v}'s pre-approval batch {batch_id} holds 0 of 2 approvals)"
    )
    assert [(r["node_id"], bool(r["held"]), r["preapproval"]) for r in await reset_rows(store)] == [("n1", True, 0)]

    # One signature of two pre-approves nothing yet.
    await sign(store, bus, batch_id, "alice", keys["alice"])
    assert (await health_reads.health_policy(store)).preapproval_state == "pending"
    await sign(store, bus, batch_id, "bob", keys["bob"])
    info = await health_reads.health_policy(store)
    assert (info.preapproval_state, info.preapproval_approvals, [e.state for e in info.preapprovals]) == (
        "approved",
        2,
        ["in-force"],
    )

    # Signed: n2's reset (pool a) carries the version and is not held; n3's (pool b) waits for its batch.
    await sick(store, "n2", gpus["n2"][0])
    await sick(store, "n3", gpus["n3"][0])
    await health.pass_once()
    by_node = {d["node"]: d["approval"] for d in await started(store)}
    assert by_node["n2"] == f"pre-approved by health policy v{v} (gpu.reset in pool pool=a, batch {batch_id})"
    assert by_node["n3"] == (
        f"a quorum batch (health policy v{v} does not pre-approve it: the node is not in pool pool=a)"
    )
    rows = {r["node_id"]: (bool(r["held"]), r["preapproval"]) for r in await reset_rows(store)}
    assert rows == {"n1": (True, 0), "n2": (False, v), "n3": (True, 0)}
    async with store.transaction(write=False) as tx:
        kinds = sorted(str(r["kind"]) for r in await tx.fetchall("SELECT kind FROM batches"))
    assert kinds == ["gpu.reset", "gpu.reset", pre.BATCH_KIND]  # n1's and n3's: none for n2

    # Past its expiry the version pre-approves nothing: n4 (pool a) waits for a batch again.
    await advance(HOUR_MS / 1000 + 1)
    info = await health_reads.health_policy(store)
    assert [e.state for e in info.preapprovals] == ["expired"]
    await sick(store, "n4", gpus["n4"][0])
    await health.pass_once()
    by_node = {d["node"]: d["approval"] for d in await started(store)}
    assert by_node["n4"].startswith("a quorum batch (")
    assert {r["node_id"]: r["preapproval"] for r in await reset_rows(store)}["n4"] == 0


async def test_a_newer_version_withdraws_the_waiting_batch_and_unchanged_pre_approvals_need_signing_again(
    store: Store, bus: Bus, gpus: dict[str, list[str]], keys: dict[str, ed25519.Ed25519PrivateKey]
) -> None:
    await set_preapproving(store, bus)
    first = (await health_reads.health_policy(store)).preapproval_batch
    await set_preapproving(store, bus)
    second = await health_reads.health_policy(store)
    async with store.transaction(write=False) as tx:
        old = await q_sql.get_batch(tx, first)
    assert old is not None and old["state"] == "withdrawn"
    assert second.preapproval_batch != first and second.preapproval_state == "pending"
    types = [t for t, _ in await events(store, "")]
    assert types.count("health.preapproval.requested") == 2 and "batch.withdrawn" in types


async def test_without_approvers_a_pre_approval_is_stored_unsigned_and_said_so(
    store: Store, bus: Bus, gpus: dict[str, list[str]]
) -> None:
    v = await set_preapproving(store, bus)
    info = await health_reads.health_policy(store)
    assert (info.preapproval_state, info.preapproval_batch) == ("no-approvers", "")
    (ev,) = [d for t, d in await events(store) if t == "health.preapproval.unsigned"]
    assert ev["version"] == v and ev["why"] == "no approvers exist to sign it"


async def test_a_bad_or_too_long_pre_approval_stores_nothing(store: Store, bus: Bus) -> None:
    now_ms = await store.now_ms()
    for entry, said in (
        ({"kind": "disk.wipe", "pool": {"pool": "a"}, "expires_at_ms": now_ms + 1}, "kind must be one of"),
        ({"kind": "gpu.reset", "pool": {"pool": "a"}, "expires_at_ms": now_ms}, "has already expired"),
        ({"kind": "gpu.reset", "pool": {"pool": "a"}, "expires_at_ms": now_ms + 91 * 86_400_000}, "90 days"),
    ):
        with pytest.raises(UsageError, match=said):
            await health_admin.set_policy(
                store, bus, json.dumps({"preapprove": [entry]}), "admin", "", random.Random(1)
            )
    assert (await health_reads.health_policy(store)).version == 0


async def test_a_label_change_is_a_new_generation_whose_signed_body_carries_the_labels(
    store: Store, bus: Bus, gpus: dict[str, list[str]]
) -> None:
    async def body() -> tuple[int, dict[str, str]]:
        async with store.transaction(write=False) as tx:
            row = await nodes_sql.get(tx, "n1")
        assert row is not None
        b = DesiredStateBody.FromString(bytes(row["spec_body"]))
        return int(row["generation"]), dict(b.labels)

    generation, labels = await body()
    assert labels == {"pool": "a"}
    await node_admin.label(store, bus, "n1", {"rack": "r7"}, [], NullSigner())
    assert await body() == (generation + 1, {"pool": "a", "rack": "r7"})
    await node_admin.label(store, bus, "n1", {"rack": "r7"}, [], NullSigner())  # no change: no new generation
    assert (await body())[0] == generation + 1
