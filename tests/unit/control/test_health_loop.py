"""The health reconciler against a real store (SQLite and PostgreSQL) on virtual time.

Conditions arrive as a gateway stores them (a node's status with its `GpuHealthy/<uuid>` conditions);
jobs move as the job engine's pass moves them; commands settle as a node would settle them. What is
asserted is what an operator sees: the episodes `bc health` lists, the jobs, the commands sent to the
nodes, the GPU cordons placement honours, the events.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.capacity import reservations
from bc.control.capacity.placement_pass import load_facts
from bc.control.capacity.placement_plan import atoms_of
from bc.control.health import admin as health_admin
from bc.control.signing.signer import NullSigner
from bc.errors import UsageError
from bc.jobs.engine import JobEngine
from bc.jobs.health import HealthReconciler
from bc.store import Store
from bc.store import commands as cmd_sql
from bc.store import events as events_sql
from bc.store import health as health_sql
from bc.store import jobs as jobs_sql
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql
from bc.testing import advance
from tests.unit.control.conftest import AddNode
from tests.unit.control.quorum_setup import install

NODES = ["n1", "n2", "n3", "n4"]


@pytest.fixture
async def gpus(add_node: AddNode) -> dict[str, list[str]]:
    out = {}
    for n in NODES:
        inv = await add_node(n)
        out[n] = [g.uuid for g in inv.gpus]
    return out


@pytest.fixture
def engine(store: Store, bus: Bus) -> JobEngine:
    return JobEngine(store, bus, NullSigner(), random.Random(3), holder="w1")


@pytest.fixture
async def health(store: Store, bus: Bus, engine: JobEngine) -> HealthReconciler:
    """The reconciler, with the default policy set (version 1): before any is set, nothing acts."""
    await health_admin.set_policy(store, bus, "{}", "admin", "the defaults")
    return HealthReconciler(store, bus, engine, random.Random(4), holder="w1")


async def test_before_an_admin_sets_a_policy_nothing_acts(
    store: Store, bus: Bus, gpus: dict[str, list[str]], engine: JobEngine
) -> None:
    await sick(store, "n1", gpus["n1"][0])
    await HealthReconciler(store, bus, engine, random.Random(4), holder="w1").pass_once()
    assert await episodes(store) == []
    assert await free_gpus_on(store, "n1") == 8


async def sick(store: Store, node: str, gpu: str, reason: str = "Xid79", message: str = "") -> None:
    """Store the node's status as a gateway would: one GPU's `GpuHealthy` False."""
    message = message or "XID 79: GPU has fallen off the bus"
    now_ms = await store.now_ms()
    cond = {"type": f"GpuHealthy/{gpu}", "status": "False", "reason": reason, "message": message, "since_ms": now_ms}
    async with store.transaction() as tx:
        await nodes_sql.write_status(tx, node, json.dumps({"conditions": [cond]}))


async def well(store: Store, node: str) -> None:
    async with store.transaction() as tx:
        await nodes_sql.write_status(tx, node, json.dumps({"conditions": []}))


async def episodes(store: Store) -> list[dict[str, Any]]:
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT * FROM health_episodes ORDER BY opened_at_ms, node_id, gpu_uuid")
    return [dict(r) for r in rows]


async def commands(store: Store, kind: str) -> list[dict[str, Any]]:
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT id, node_id, kind, state, held FROM commands ORDER BY id")
    return [dict(r) for r in rows if r["kind"] == kind]


async def events(store: Store, prefix: str = "health.") -> list[tuple[str, dict[str, Any]]]:
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 100_000, prefix)
    return [(str(r["type"]), json.loads(str(r["data"]))) for r in rows]


async def settle(store: Store, command_id: str, result: dict[str, Any] | None = None, state: str = "succeeded") -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await cmd_sql.get(tx, command_id)
        assert row is not None
        body = json.dumps(result).encode() if result is not None else None
        assert await cmd_sql.settle(
            tx, command_id, expected=str(row["state"]), state=state, reason="", message="", now_ms=now_ms, result=body
        )


async def dag_state(store: Store, dag_id: str) -> str:
    async with store.transaction(write=False) as tx:
        row = await jobs_sql.get_dag(tx, dag_id)
    assert row is not None
    return str(row["state"])


async def free_gpus_on(store: Store, node: str) -> int:
    async with store.transaction(write=False) as tx:
        facts = await load_facts(tx)
    (info,) = [n for n in facts.nodes if n.node_id == node]
    return len(atoms_of(info, "gpu"))


async def test_an_xid_makes_one_gpu_scoped_job_that_resets_the_gpu_and_returns_it(
    store: Store, gpus: dict[str, list[str]], engine: JobEngine, health: HealthReconciler
) -> None:
    g = gpus["n1"][0]
    await sick(store, "n1", g)
    await health.pass_once()
    await health.pass_once()  # the same condition again: no second episode, no second job
    (e,) = await episodes(store)
    assert (e["state"], e["stage"], e["rule"], e["action"]) == ("running", "reset", "xid:79", "reset")
    assert await free_gpus_on(store, "n1") == 7  # the GPU is cordoned: placement offers 7 of 8
    (reset,) = await commands(store, "gpu.reset")  # no hold on the GPU: the drain was done at once
    async with store.transaction(write=False) as tx:
        node_row = await nodes_sql.get(tx, "n1")
    assert node_row is not None and node_row["job_hold"] is None  # the node's other GPUs keep working
    await settle(store, str(reset["id"]), {"gpus": [{"uuid": g, "reset": True, "healthy": True, "message": ""}]})
    await engine.pass_once()
    (diag,) = await commands(store, "diag.nvml")
    await settle(store, str(diag["id"]), {})
    await engine.pass_once()
    assert await dag_state(store, str(e["dag_id"])) == "done"
    await well(store, "n1")
    await health.pass_once()
    (e,) = await episodes(store)
    assert e["state"] == "done"
    assert await free_gpus_on(store, "n1") == 8
    types = [t for t, _ in await events(store, "health.")]
    assert types == [
        "health.policy.set",
        "health.remediation.queued",
        "health.gpu.cordoned",
        "health.remediation.started",
        "health.remediation.done",
        "health.gpu.returned",
    ]


async def test_beyond_the_limits_conditions_wait_in_the_queue_with_their_reason(
    store: Store, bus: Bus, gpus: dict[str, list[str]], health: HealthReconciler
) -> None:
    await health_admin.set_policy(
        store, bus, json.dumps({"limits": {"max_nodes": 1, "max_actions_per_hour": 2}}), "alice"
    )
    for n in NODES:
        await sick(store, n, gpus[n][0])
    await health.pass_once()
    rows = await episodes(store)
    assert [r["state"] for r in rows] == ["running", "queued", "queued", "queued"]
    assert {r["wait_reason"] for r in rows[1:]} == {"1 of at most 1 node(s) are in remediation"}
    assert {r["policy_version"] for r in rows} == {2}
    assert len(await commands(store, "gpu.reset")) == 1


async def test_a_gpu_under_a_live_hold_is_never_reset_and_the_hold_is_never_released(
    store: Store, bus: Bus, gpus: dict[str, list[str]], engine: JobEngine, health: HealthReconciler
) -> None:
    held = await reservations.reserve(
        store, bus, NullSigner(), reservations.ReserveRequest(gpus=8, node_id="n1"), random.Random(1)
    )
    assert held["state"] == "placed"
    g = gpus["n1"][3]
    await sick(store, "n1", g)
    await health.pass_once()
    for _ in range(3):
        await advance(60)
        await engine.pass_once()
        await health.pass_once()
    assert await commands(store, "gpu.reset") == []
    (e,) = await episodes(store)
    assert e["state"] == "running"
    async with store.transaction(write=False) as tx:
        (drain,) = [n for n in await jobs_sql.nodes_of(tx, str(e["dag_id"])) if n["kind"] == "Drain"]
        res = await tx.fetchone("SELECT state FROM reservations WHERE id = :i", {"i": held["id"]})
    assert drain["state"] == "running" and held["id"] in str(drain["detail"])
    assert res is not None and res["state"] != "released"
    await reservations.release(store, bus, NullSigner(), str(held["id"]))
    await engine.pass_once()
    assert await commands(store, "gpu.reset") == []  # releasing: the node has not dropped the hold yet
    async with store.transaction() as tx:  # the node's report that it dropped the assignment lands
        await res_sql.set_state(tx, str(held["id"]), "released", await store.now_ms())
        await res_sql.release_bookings(tx, str(held["id"]), await store.now_ms())
    await engine.pass_once()
    assert len(await commands(store, "gpu.reset")) == 1


async def test_a_failed_reset_reboots_the_node_and_a_second_failure_quarantines_the_gpu(
    store: Store, gpus: dict[str, list[str]], engine: JobEngine, health: HealthReconciler
) -> None:
    g = gpus["n2"][0]
    await sick(store, "n2", g)
    await health.pass_once()
    (reset,) = await commands(store, "gpu.reset")
    await settle(store, str(reset["id"]), {"gpus": [{"uuid": g, "reset": True, "healthy": False, "message": "ECC"}]})
    await engine.pass_once()
    (diag,) = await commands(store, "diag.nvml")
    await settle(store, str(diag["id"]), {})
    await engine.pass_once()
    await health.pass_once()
    (e,) = await episodes(store)
    assert (e["state"], e["stage"]) == ("running", "reboot")
    (reboot,) = await commands(store, "node.reboot")
    await settle(store, str(reboot["id"]), {})
    await engine.pass_once()
    await health.pass_once()
    (e,) = await episodes(store)
    assert e["state"] == "done"
    await advance(600)
    await health.pass_once()  # sick again within 24 h of its last remediation: quarantined, for a person
    rows = await episodes(store)
    assert [r["state"] for r in rows] == ["done", "quarantined"]
    assert "second failure" in rows[1]["outcome"]
    assert await free_gpus_on(store, "n2") == 7
    assert len(await commands(store, "gpu.reset")) == 1
    types = [t for t, _ in await events(store)]
    assert types[-2:] == ["health.remediation.queued", "health.gpu.quarantined"]
    assert "health.remediation.escalated" in types


async def test_with_approvers_the_reset_waits_for_a_named_node_scoped_batch(
    store: Store, bus: Bus, gpus: dict[str, list[str]], engine: JobEngine, health: HealthReconciler
) -> None:
    keys = {name: ed25519.Ed25519PrivateKey.generate() for name in ("alice", "bob", "carol")}
    await install(store, bus, keys, k=2)
    g = gpus["n3"][1]
    await sick(store, "n3", g)
    await health.pass_once()
    async with store.transaction(write=False) as tx:
        (batch,) = await tx.fetchall("SELECT * FROM batches WHERE kind = 'gpu.reset'")
    assert batch["state"] == "pending"
    assert "xid:79" in str(batch["reason"]) and g in str(batch["reason"]) and "Xid79" in str(batch["reason"])
    (reset,) = await commands(store, "gpu.reset")
    assert (reset["state"], bool(reset["held"])) == ("pending", True)  # held for the quorum: nothing reaches n3


async def test_a_flapping_condition_that_clears_while_queued_makes_no_job(
    store: Store, bus: Bus, gpus: dict[str, list[str]], health: HealthReconciler
) -> None:
    await health_admin.set_policy(
        store, bus, json.dumps({"enabled": True, "limits": {"max_actions_per_hour": 0}}), "al"
    )
    g = gpus["n4"][0]
    for _ in range(5):  # sick, well, sick, ... faster than the flap window: one episode
        await sick(store, "n4", g)
        await health.pass_once()
        await advance(30)
        await well(store, "n4")
        await health.pass_once()
        await advance(30)
    assert [r["state"] for r in await episodes(store)] == ["queued"]
    await advance(601)
    await health.pass_once()
    assert [r["state"] for r in await episodes(store)] == ["cleared"]
    assert await free_gpus_on(store, "n4") == 8
    assert await commands(store, "gpu.reset") == []


async def test_policy_versions_keep_who_and_when_and_a_bad_one_stores_nothing(store: Store, bus: Bus) -> None:
    """(Without the `health` fixture: no version set before this test's.)"""
    assert await health_admin.set_policy(store, bus, "{}", "alice", "defaults") == 1
    assert await health_admin.set_policy(store, bus, '{"drain": "ask"}', "bob") == 2
    with pytest.raises(UsageError, match="drain must be one of wait, ask"):
        await health_admin.set_policy(store, bus, '{"drain": "now"}', "bob")
    async with store.transaction(write=False) as tx:
        versions = await health_sql.policy_versions(tx, 10)
    assert [(v["version"], v["set_by"]) for v in versions] == [(2, "bob"), (1, "alice")]


async def test_with_no_episode_open_a_pass_reads_the_fleet_only_for_news_that_can_open_one(
    store: Store, bus: Bus, gpus: dict[str, list[str]], health: HealthReconciler
) -> None:
    """Each pass reads every node's status: with nothing open, only a changed condition or a new policy (or
    the 30 s backstop) is worth one. An open episode makes every wake a pass (its job, node and holds move)."""
    await health.pass_once()
    assert health.seen_seq is not None
    assert not await health._has_work(health.seen_seq)
    await sick(store, "n1", gpus["n1"][0])
    async with store.transaction() as tx:
        await publish(tx, bus, "node.status", "n1", {}, await store.now_ms())  # not news to the reconciler
    assert not await health._has_work(health.seen_seq)
    async with store.transaction() as tx:
        await publish(tx, bus, "node.condition", "n1", {"type": f"GpuHealthy/{gpus['n1'][0]}"}, await store.now_ms())
    assert await health._has_work(health.seen_seq)
    await health.pass_once()
    assert len(await episodes(store)) == 1
    assert await health._has_work(health.seen_seq)
