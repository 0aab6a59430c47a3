"""The persisted job queue over a real store on virtual time: steps, primitives, restart, cancel.

Node outcomes are what a gateway would store (a command settled, a status report); the engine
notices them in `pass_once`, as its singleton task does after each event.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.control.base.bus import Bus
from bc.control.signing.signer import NullSigner
from bc.errors import Conflict, NotFound, UsageError
from bc.jobs import queries
from bc.jobs.engine import JobEngine
from bc.jobs.views import DagView, JobRequest
from bc.store import commands as cmd_sql
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance
from tests.unit.control.conftest import AddNode, Count
from tests.unit.control.quorum_setup import install
from tests.unit.control.test_quorum import approve, read_batch, reject

NODES = ["n1", "n2", "n3", "n4"]


@pytest.fixture
async def nodes(add_node: AddNode) -> list[str]:
    for n in NODES:
        await add_node(n)
    return NODES


@pytest.fixture
def engine(store: InlineSqliteStore, bus: Bus) -> JobEngine:
    return JobEngine(store, bus, NullSigner(), random.Random(3), holder="gw-test")


async def commands(store: InlineSqliteStore, kind: str = "") -> list[dict[str, Any]]:
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT id, node_id, kind, state, held, idempotency_key FROM commands ORDER BY id")
    return [r for r in rows if not kind or r["kind"] == kind]


async def settle(store: InlineSqliteStore, command_id: str, state: str = "succeeded", reason: str = "") -> None:
    now_ms = await store.now_ms()
    async with store.transaction() as tx:
        row = await cmd_sql.get(tx, command_id)
        assert row is not None
        assert await cmd_sql.settle(
            tx, command_id, expected=str(row["state"]), state=state, reason=reason, message="", now_ms=now_ms
        )


async def node_row(store: InlineSqliteStore, node_id: str) -> dict[str, Any]:
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, node_id)
    assert row is not None
    return row


def states(view: DagView) -> dict[str, str]:
    return {n.id: n.state for n in view.nodes}


async def job_events(store: InlineSqliteStore, dag_id: str) -> list[tuple[str, dict[str, Any]]]:
    async with store.transaction(write=False) as tx:
        rows = await events_sql.list_events(tx, 0, 100_000, "job.")
    return [(str(r["type"]), json.loads(str(r["data"]))) for r in rows if r["subject"] == dag_id]


async def test_cordon_is_a_dag_that_is_done_when_its_submit_returns(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    dag_id = await engine.submit(JobRequest("cordon", ("n1",)), "alice")
    view = await queries.get_dag(store, dag_id)
    assert (view.state, view.terminal, view.requested_by) == ("done", True, "alice")
    assert states(view) == {"set:n1": "done", "reconcile:n1": "done", "emit:n1": "done"}
    assert (await node_row(store, "n1"))["cordoned"] == 1
    types = [t for t, _ in await job_events(store, dag_id)]
    assert types[0] == "job.submitted" and types[-1] == "job.settled" and "job.outcome" in types
    await engine.submit(JobRequest("uncordon", ("n1",)), "alice")
    assert (await node_row(store, "n1"))["cordoned"] == 0


async def test_a_reboot_never_runs_more_than_max_parallel_and_each_command_is_sent_once(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    dag_id = await engine.submit(JobRequest("reboot", tuple(NODES), max_parallel=2), "alice")
    seen_at_once = 0
    while True:
        live = [c for c in await commands(store, "node.reboot") if c["state"] == "pending"]
        seen_at_once = max(seen_at_once, len(live))
        held = [n for n in NODES if (await node_row(store, n))["job_hold"] == dag_id]
        assert len(held) <= 2, "a node is held out of placement only while its reboot runs"
        if not live:
            break
        for c in live:
            await settle(store, str(c["id"]))
        await engine.pass_once()
    view = await queries.get_dag(store, dag_id)
    assert (view.state, view.terminal) == ("done", True)
    sent = await commands(store, "node.reboot")
    assert sorted(str(c["node_id"]) for c in sent) == NODES and seen_at_once == 2
    assert {str(c["idempotency_key"]) for c in sent} == {f"job:{dag_id}:cmd:{n}" for n in NODES}
    assert [(await node_row(store, n))["job_hold"] for n in NODES] == [None] * 4
    async with store.transaction(write=False) as tx:
        assert await tx.fetchval("SELECT COUNT(*) FROM job_leases") == 0
        assert await tx.fetchval("SELECT COUNT(*) FROM job_slots") == 0


async def test_a_restarted_engine_resumes_from_the_rows_and_sends_nothing_twice(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, nodes: list[str]
) -> None:
    dag_id = await engine.submit(JobRequest("reboot", ("n1", "n2"), max_parallel=1), "alice")
    (first,) = await commands(store, "node.reboot")
    await settle(store, str(first["id"]))
    fresh = JobEngine(store, bus, NullSigner(), random.Random(99), holder="gw-test")  # nothing held in memory
    assert await fresh.pass_once() == 1
    assert await fresh.pass_once() == 0  # a pass with nothing settled starts nothing again
    sent = await commands(store, "node.reboot")
    assert sorted(str(c["node_id"]) for c in sent) == ["n1", "n2"]
    (second,) = [c for c in sent if c["node_id"] == "n2"]
    await settle(store, str(second["id"]))
    await fresh.pass_once()
    assert (await queries.get_dag(store, dag_id)).state == "done"
    assert len(await commands(store, "node.reboot")) == 2


async def test_another_dag_waits_for_the_node_lease_and_runs_after(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    reboot = await engine.submit(JobRequest("reboot", ("n1",)), "alice")
    cordon = await engine.submit(JobRequest("cordon", ("n1",)), "bob")
    assert (await queries.get_dag(store, cordon)).state == "queued"
    assert (await node_row(store, "n1"))["cordoned"] == 0
    (cmd,) = await commands(store, "node.reboot")
    await settle(store, str(cmd["id"]))
    await engine.pass_once()
    assert (await queries.get_dag(store, reboot)).state == "done"
    assert (await queries.get_dag(store, cordon)).state == "done"
    assert (await node_row(store, "n1"))["cordoned"] == 1


async def test_cancel_spares_the_tails_cancels_a_never_sent_command_and_refuses_a_settled_dag(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    dag_id = await engine.submit(JobRequest("reboot", ("n1", "n2"), max_parallel=1), "alice")
    assert await engine.cancel(dag_id, "alice") is True
    (cmd,) = await commands(store, "node.reboot")
    assert cmd["state"] == "cancelled"  # never sent, so cancelled at once...
    view = await queries.get_dag(store, dag_id)
    s = states(view)
    assert s["reboot:n2"] == "cancelled" and s["cmd:n1"] == "cancelled"  # ...and its node ends in the same step
    assert view.cancel_requested and view.terminal and view.state == "cancelled" and not view.first_error
    assert s["reconcile:n1"] == "done" and s["reconcile:n2"] == "done"
    assert (await node_row(store, "n1"))["job_hold"] is None
    with pytest.raises(Conflict, match="already ended"):
        await engine.cancel(dag_id, "alice")
    with pytest.raises(NotFound):
        await engine.cancel("j-nope", "alice")


async def test_a_queued_cordon_cancelled_before_it_starts_has_written_nothing(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    await engine.submit(JobRequest("reboot", ("n1",)), "alice")
    cordon = await engine.submit(JobRequest("cordon", ("n1",)), "bob")
    assert await engine.cancel(cordon, "bob") is True
    view = await queries.get_dag(store, cordon)
    assert view.terminal and view.state == "cancelled"
    assert (await node_row(store, "n1"))["cordoned"] == 0


@pytest.mark.parametrize(
    ("req", "error"),
    [
        (JobRequest("reboot", ("n9",)), "no node named 'n9'"),
        (JobRequest("defrag", ("n1",)), "unknown job template 'defrag'"),
        (JobRequest("reboot", ()), "needs at least one node"),
        (JobRequest("reboot", ("n1", "n1")), "appears twice"),
        (JobRequest("reboot", ("n1",), max_parallel=-1), "--max-parallel"),
        (JobRequest("rollout", ("n1",), section="host", section_json="{nope"), "host"),
        (JobRequest("rollout", ("n1",), section="devices", section_json="{}"), "devices"),
        (JobRequest("remediate", ("n1",)), "no approvers are configured"),
        (JobRequest("drain", ("n1", "n2")), "one node"),
        (JobRequest("cordon", ("n1\r",)), "spaces around it"),
        (JobRequest("cordon", ("",)), "empty"),
    ],
)
async def test_bad_input_is_one_sentence_and_stores_nothing(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str], count: Count, req: JobRequest, error: str
) -> None:
    with pytest.raises((UsageError, NotFound, Conflict), match=error) as e:
        await engine.submit(req, "alice")
    assert "\n" not in str(e.value)
    assert await count("job_dags") == 0 and await count("job_nodes") == 0 and await count("commands") == 0


async def test_rollout_stops_at_the_first_node_that_answers_unsupported(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    req = JobRequest("rollout", ("n1", "n2", "n3"), section="telemetry", section_json="{}", max_unavailable=1)
    dag_id = await engine.submit(req, "alice")
    n1 = await node_row(store, "n1")
    assert int(n1["generation"]) == 1 and int((await node_row(store, "n2"))["generation"]) == 0
    status = {"sections": [{"section": "telemetry", "state": "UNSUPPORTED", "generation": 1, "reason": "NoConverger"}]}
    async with store.transaction() as tx:
        await nodes_sql.write_status(tx, "n1", json.dumps(status))
    await engine.pass_once()
    view = await queries.get_dag(store, dag_id)
    assert view.terminal and view.state == "failed"
    assert "answered telemetry UNSUPPORTED (NoConverger)" in view.first_error
    assert states(view)["patch:n2"] == "cancelled" and states(view)["patch:n3"] == "cancelled"
    assert int((await node_row(store, "n2"))["generation"]) == 0


# -- remediate: the quorum batch the DAG owns -------------------------------------------------------


@pytest.fixture
async def quorum_keys(store: InlineSqliteStore, bus: Bus) -> dict[str, ed25519.Ed25519PrivateKey]:
    keys = {n: ed25519.Ed25519PrivateKey.generate() for n in ("carol", "dave", "erin")}
    await install(store, bus, keys, k=2)
    return keys


async def batch_of(store: InlineSqliteStore, dag_id: str) -> str:
    view = await queries.get_dag(store, dag_id)
    return str(next(n for n in view.nodes if n.id == "batch").detail["batch_id"])


async def test_remediate_waits_for_its_quorum_releases_its_leaf_itself_and_resolves_done(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, nodes: list[str], quorum_keys: dict[str, Any]
) -> None:
    dag_id = await engine.submit(JobRequest("remediate", ("n1",), reason="xid 79"), "alice")
    batch_id = await batch_of(store, dag_id)
    batch, leaves = await read_batch(store, batch_id)
    assert batch["dag_id"] == dag_id and (await node_row(store, "n1"))["job_hold"] == dag_id
    await approve(store, bus, batch, leaves, quorum_keys["carol"])
    await approve(store, bus, batch, leaves, quorum_keys["dave"])
    (reset,) = await commands(store, "gpu.reset")
    assert reset["held"] == 1, "approving a job's batch releases nothing by itself"
    await engine.pass_once()
    (reset,) = await commands(store, "gpu.reset")
    assert reset["held"] == 0
    await settle(store, str(reset["id"]))
    await engine.pass_once()
    (diag,) = await commands(store, "diag.nvml")
    await settle(store, str(diag["id"]))
    await engine.pass_once()
    view = await queries.get_dag(store, dag_id)
    assert view.state == "done" and view.terminal
    batch, _ = await read_batch(store, batch_id)
    assert (batch["state"], batch["resolution"]) == ("approved", "done")
    assert (await node_row(store, "n1"))["job_hold"] is None


async def test_remediate_resolves_a_rejected_batch_as_failed(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, nodes: list[str], quorum_keys: dict[str, Any]
) -> None:
    dag_id = await engine.submit(JobRequest("remediate", ("n1",)), "alice")
    batch, _ = await read_batch(store, await batch_of(store, dag_id))
    await reject(store, bus, batch, quorum_keys["erin"])
    await engine.pass_once()
    view = await queries.get_dag(store, dag_id)
    assert view.terminal and view.state == "failed" and "rejected" in view.first_error
    batch, _ = await read_batch(store, str(batch["id"]))
    assert (batch["state"], batch["resolution"]) == ("rejected", "failed")
    assert [c["state"] for c in await commands(store, "gpu.reset")] == ["cancelled"]


async def test_remediate_cancelled_while_waiting_withdraws_its_batch(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, nodes: list[str], quorum_keys: dict[str, Any]
) -> None:
    dag_id = await engine.submit(JobRequest("remediate", ("n1",)), "alice")
    batch_id = await batch_of(store, dag_id)
    assert await engine.cancel(dag_id, "alice") is True
    await engine.pass_once()
    view = await queries.get_dag(store, dag_id)
    assert view.terminal and view.state == "cancelled"
    batch, _ = await read_batch(store, batch_id)
    assert (batch["state"], batch["resolution"]) == ("withdrawn", "cancelled")
    assert [c["state"] for c in await commands(store, "gpu.reset")] == ["cancelled"]
    assert (await node_row(store, "n1"))["job_hold"] is None


async def test_a_drain_fails_at_its_deadline_naming_the_holds_left(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    async with store.transaction() as tx:
        await tx.execute(
            "INSERT INTO reservations (id, seq, node_id, allocation_id, device_class, gpus, binding, state,"
            " created_at_ms) VALUES ('r-1', 1, 'n1', 'a-1', 'gpu', 1, 'hold', 'active', 0)"
        )
    dag_id = await engine.submit(JobRequest("drain", ("n1",), deadline_s=60), "alice")
    assert states(await queries.get_dag(store, dag_id))["drain:n1"] == "running"
    await advance(61)
    await engine.pass_once()
    view = await queries.get_dag(store, dag_id)
    assert view.state == "failed" and "r-1" in view.first_error
    assert (await node_row(store, "n1"))["cordoned"] == 1, "a drain leaves the node cordoned, as wanted"
    assert (await node_row(store, "n1"))["job_hold"] is None


async def test_slots_set_a_pool_capacity(store: InlineSqliteStore, engine: JobEngine) -> None:
    await engine.set_slots("reboots", 2)
    assert {p.name: p.capacity for p in await queries.list_pools(store)}["reboots"] == 2
    with pytest.raises(UsageError):
        await engine.set_slots("reboots", 0)


async def test_cancelling_a_waiting_drain_ends_it_at_once_and_the_tail_still_reconciles(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    async with store.transaction() as tx:
        await tx.execute(
            "INSERT INTO reservations (id, seq, node_id, allocation_id, device_class, gpus, binding, state,"
            " created_at_ms) VALUES ('r-1', 1, 'n1', 'a-1', 'gpu', 1, 'hold', 'active', 0)"
        )
    dag_id = await engine.submit(JobRequest("drain", ("n1",)), "alice")
    assert (await node_row(store, "n1"))["job_hold"] == dag_id
    assert await engine.cancel(dag_id, "alice") is True
    view = await queries.get_dag(store, dag_id)
    assert view.terminal and states(view)["drain:n1"] == "cancelled" and states(view)["reconcile:n1"] == "done"
    assert view.state == "cancelled" and not view.first_error
    assert (await node_row(store, "n1"))["job_hold"] is None


async def test_a_quiet_pass_writes_nothing(store: InlineSqliteStore, engine: JobEngine, nodes: list[str]) -> None:
    await engine.submit(JobRequest("reboot", ("n1",)), "alice")
    async with store.transaction(write=False) as tx:
        before = await tx.fetchval("SELECT version FROM job_meta")
    assert await engine.pass_once() == 0
    async with store.transaction(write=False) as tx:
        assert await tx.fetchval("SELECT version FROM job_meta") == before


async def test_cancel_asks_a_command_in_flight_and_waits_for_its_real_outcome(
    store: InlineSqliteStore, engine: JobEngine, nodes: list[str]
) -> None:
    dag_id = await engine.submit(JobRequest("reboot", ("n1",)), "alice")
    (cmd,) = await commands(store, "node.reboot")
    async with store.transaction() as tx:  # the gateway sent it: it is in flight on the node
        await tx.execute("UPDATE commands SET state = 'dispatched' WHERE id = :c", {"c": cmd["id"]})
    assert await engine.cancel(dag_id, "alice") is True
    view = await queries.get_dag(store, dag_id)
    assert states(view)["cmd:n1"] == "running" and not view.terminal
    async with store.transaction(write=False) as tx:
        row = await cmd_sql.get(tx, str(cmd["id"]))
    assert row is not None and row["cancel_requested_at_ms"] is not None
    await settle(store, str(cmd["id"]))  # the reboot had started: it reports that it succeeded
    await engine.pass_once()
    view = await queries.get_dag(store, dag_id)
    assert view.terminal and states(view)["cmd:n1"] == "done" and view.state == "done"


async def test_a_rolling_reboot_under_a_quorum_asks_for_the_next_waves_batch_only_when_it_is_due(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, nodes: list[str], quorum_keys: dict[str, Any]
) -> None:
    dag_id = await engine.submit(JobRequest("reboot", tuple(NODES), max_parallel=2), "alice")
    view = await queries.get_dag(store, dag_id)
    assert (states(view)["batch:1"], states(view)["batch:2"]) == ("running", "queued")
    (wait,) = view.awaiting_approval
    assert (wait.node, wait.signed, wait.needed) == ("batch:1", 0, 2)
    batch, leaves = await read_batch(store, wait.batch_id)
    assert [str(r["node_id"]) for r in leaves] == ["n1", "n2"]
    await approve(store, bus, batch, leaves, quorum_keys["carol"])
    assert (await queries.get_dag(store, dag_id)).awaiting_approval[0].signed == 1
    await reject(store, bus, batch, quorum_keys["erin"])  # one no fails the wave, and the waves after it
    await engine.pass_once()
    view = await queries.get_dag(store, dag_id)
    assert view.terminal and view.state == "failed" and "rejected" in view.first_error
    assert states(view)["batch:2"] == "cancelled" and states(view)["reboot:n3"] == "cancelled"
    assert view.awaiting_approval == ()
    async with store.transaction(write=False) as tx:
        assert await tx.fetchval("SELECT COUNT(*) FROM batches") == 1  # the second wave's was never asked for
