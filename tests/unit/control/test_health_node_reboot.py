"""Node conditions → a node remediation, against a real store (SQLite and PostgreSQL) on virtual time.

A host unit's `DriverMismatch` with reason `RebootRequired` (an installed driver that needs a reboot)
becomes one `reboot` job for the node under the same limits; its drain never reboots a node under a
live hold; the other host units' conditions are shown in `bc health` and not acted on by default.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.control.base.bus import Bus
from bc.control.capacity import reservations
from bc.control.health import admin as health_admin
from bc.control.reads import health as health_reads
from bc.control.signing.signer import NullSigner
from bc.jobs.engine import JobEngine
from bc.jobs.health import HealthReconciler
from bc.store import Store
from bc.store import nodes as nodes_sql
from bc.store import reservations as res_sql
from bc.testing import advance
from tests.unit.control.conftest import AddNode
from tests.unit.control.quorum_setup import install
from tests.unit.control.test_health_loop import commands, episodes, events, settle

DRIVER = {
    "type": "DriverMismatch",
    "status": "True",
    "reason": "RebootRequired",
    "message": "driver 550.127.05 is installed; 535.183.01 is loaded",
}
FABRIC = {"type": "FabricManagerReady", "status": "False", "reason": "NotRunning", "message": "inactive"}


@pytest.fixture
async def fleet(add_node: AddNode) -> None:
    for n in ("n1", "n2"):
        await add_node(n)


@pytest.fixture
async def reconciler(store: Store, bus: Bus, fleet: None) -> tuple[HealthReconciler, JobEngine]:
    await health_admin.set_policy(store, bus, "{}", "admin", "the defaults")
    engine = JobEngine(store, bus, NullSigner(), random.Random(3), holder="w1")
    return HealthReconciler(store, bus, engine, random.Random(4), holder="w1"), engine


async def report(store: Store, node: str, *conds: dict[str, Any]) -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        await nodes_sql.write_status(tx, node, json.dumps({"conditions": [{**c, "since_ms": now_ms} for c in conds]}))


async def test_a_driver_that_needs_a_reboot_reboots_the_node_once_and_other_host_units_are_only_shown(
    store: Store, reconciler: tuple[HealthReconciler, JobEngine]
) -> None:
    health, engine = reconciler
    await report(store, "n1", DRIVER, FABRIC)
    await report(store, "n2", FABRIC)
    await health.pass_once()
    await health.pass_once()  # the same conditions again: no second episode, no second job
    (e,) = await episodes(store)
    assert (e["node_id"], e["gpu_uuid"], e["state"], e["stage"]) == ("n1", "", "running", "reboot")
    assert e["rule"] == "driver-reboot"
    (reboot,) = await commands(store, "node.reboot")
    assert reboot["node_id"] == "n1"
    info = await health_reads.health(store)
    shown = sorted((c.node_id, c.type, c.reason, c.action) for c in info.conditions)
    assert shown == [
        ("n1", "DriverMismatch", "RebootRequired", "reboot"),
        ("n1", "FabricManagerReady", "NotRunning", "none"),
        ("n2", "FabricManagerReady", "NotRunning", "none"),
    ]
    assert [(r.node_id, r.gpu_uuid, r.stage) for r in info.running] == [("n1", "", "reboot")]
    assert not info.cordons  # nothing cordoned: the job's drain keeps new holds off the node
    await settle(store, str(reboot["id"]), {})
    await engine.pass_once()
    await report(store, "n1")  # the new driver is loaded after the reboot
    await health.pass_once()
    (e,) = await episodes(store)
    assert (e["state"], e["outcome"]) == ("done", "the node rebooted")
    assert len(await commands(store, "node.reboot")) == 1
    started = [d for t, d in await events(store) if t == "health.remediation.started"]
    assert [(s["node"], s["gpu"], s["action"]) for s in started] == [("n1", "", "reboot")]


async def test_the_reboot_never_runs_while_a_hold_is_live_and_no_hold_is_released(
    store: Store, bus: Bus, reconciler: tuple[HealthReconciler, JobEngine]
) -> None:
    health, engine = reconciler
    held = await reservations.reserve(
        store, bus, NullSigner(), reservations.ReserveRequest(gpus=2, node_id="n1"), random.Random(1)
    )
    await report(store, "n1", DRIVER)
    await health.pass_once()
    for _ in range(3):
        await advance(60)
        await engine.pass_once()
        await health.pass_once()
    assert await commands(store, "node.reboot") == []
    async with store.transaction(write=False) as tx:
        res = await tx.fetchone("SELECT state FROM reservations WHERE id = :i", {"i": held["id"]})
    assert res is not None and res["state"] not in ("released", "releasing")
    await reservations.release(store, bus, NullSigner(), str(held["id"]))  # a person releases it
    async with store.transaction() as tx:
        await res_sql.set_state(tx, str(held["id"]), "released", await store.now_ms())
        await res_sql.release_bookings(tx, str(held["id"]), await store.now_ms())
    await engine.pass_once()
    assert len(await commands(store, "node.reboot")) == 1


async def test_a_failed_reboot_is_left_to_a_person_and_not_retried_within_the_repeat_window(
    store: Store, reconciler: tuple[HealthReconciler, JobEngine]
) -> None:
    health, engine = reconciler
    await report(store, "n2", DRIVER)
    await health.pass_once()
    (reboot,) = await commands(store, "node.reboot")
    await settle(store, str(reboot["id"]), None, state="failed")
    await engine.pass_once()
    for _ in range(3):
        await advance(600)
        await health.pass_once()
    assert [e["state"] for e in await episodes(store)] == ["quarantined"]
    assert len(await commands(store, "node.reboot")) == 1
    assert "health.node.quarantined" in [t for t, _ in await events(store)]


async def test_with_approvers_the_nodes_reboot_waits_for_a_batch_that_names_the_condition(
    store: Store, bus: Bus, reconciler: tuple[HealthReconciler, JobEngine]
) -> None:
    health, _ = reconciler
    keys = {name: ed25519.Ed25519PrivateKey.generate() for name in ("alice", "bob", "carol")}
    await install(store, bus, keys, k=2)
    await report(store, "n1", DRIVER)
    await health.pass_once()
    async with store.transaction(write=False) as tx:
        (batch,) = await tx.fetchall("SELECT * FROM batches WHERE kind = 'node.reboot'")
    assert batch["state"] == "pending"
    assert "driver-reboot on node n1 (DriverMismatch RebootRequired" in str(batch["reason"])
    (reboot,) = await commands(store, "node.reboot")
    assert bool(reboot["held"])  # held for the quorum: nothing reaches n1
