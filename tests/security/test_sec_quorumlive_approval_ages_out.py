"""Attack (on availability): a rolling reboot that outlives its approval, so that its later nodes are refused.

An approval counts for the hour its signer gave it (`bc approve sign --expires-in`, 1 h), and each node checks
that hour itself when its command arrives. A job that asked once for the whole rolling reboot would send its
later waves with approvals that aged out: each node refuses (BATCH_UNAPPROVED) and the job fails. So the
job asks for each wave's batch when that wave is due. Here each wave takes 70 minutes, on virtual time;
the approvers sign whatever the job asks for when it asks; the node's check is the one nodes apply
(`bc.pki.quorum.count_approvals` at delivery, against the approver keys they hold).
"""

from __future__ import annotations

import random

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.control.base.bus import Bus
from bc.control.quorum import approvers as appr
from bc.control.signing.signer import NullSigner
from bc.jobs import queries
from bc.jobs.engine import JobEngine
from bc.jobs.views import JobRequest
from bc.pki import quorum as q
from bc.protocol.pb import common_pb2
from bc.store import Store
from bc.store import quorum as q_sql
from bc.testing import advance
from tests.unit.conftest import bus, clock, store_on_each_backend  # noqa: F401  (the fixtures: a real store, both drivers)
from tests.unit.control.conftest import AddNode, add_node  # noqa: F401
from tests.unit.control.quorum_setup import install
from tests.unit.control.test_jobs_engine import settle
from tests.unit.control.test_quorum import approve, read_batch

pytestmark = pytest.mark.virtual_time

NODES = ("n1", "n2", "n3", "n4")
WAVE_S = 70 * 60  # a wave (drain, reboot, back) takes longer than an approval counts
APPROVAL_TTL_MS = 3_600_000  # `bc approve sign`'s default --expires-in


async def reboot_commands(db: Store) -> list[dict[str, object]]:
    async with db.transaction(write=False) as tx:
        return await tx.fetchall(
            "SELECT id, node_id, state, held, batch_id FROM commands WHERE kind = 'node.reboot' ORDER BY id"
        )


async def node_accepts(db: Store, batch_id: str) -> bool:
    """The node's own check when the command arrives: k approvals of the keys it holds, unexpired now."""
    now_ms = await db.now_ms()
    async with db.transaction(write=False) as tx:
        raw = await q_sql.approval_of(tx, batch_id)
    settings, _ = await appr.trust_state(db)
    approval = common_pb2.BatchApproval.FromString(raw or b"")
    return len(q.count_approvals(approval, list(settings.approver_keys), now_ms).counted) >= settings.quorum_k


async def test_a_rolling_reboot_whose_waves_come_due_after_the_approval_ttl_still_completes(
    store: Store,
    bus: Bus,  # noqa: F811
    add_node: AddNode,  # noqa: F811
) -> None:
    for n in NODES:
        await add_node(n)
    keys = {n: ed25519.Ed25519PrivateKey.generate() for n in ("carol", "dave", "erin")}
    await install(store, bus, keys, k=2)
    engine = JobEngine(store, bus, NullSigner(), random.Random(3), holder="gw-test")
    dag_id = await engine.submit(JobRequest("reboot", NODES, max_parallel=2, reason="kernel"), "alice")

    signed: dict[str, int] = {}  # batch id -> when its approvals were given
    delivered: dict[str, int] = {}  # command id -> when it reached its node (and was accepted)
    refused: list[str] = []
    for _ in range(12):
        await engine.pass_once()
        view = await queries.get_dag(store, dag_id)
        if view.terminal:
            break
        # The approvers sign what the job asks for, when it asks (valid for the usual hour).
        for node in view.nodes:
            bid = str(node.detail.get("batch_id", ""))
            if node.kind == "Batch" and node.state == "running" and bid not in signed:
                batch, leaves = await read_batch(store, bid)
                for name in ("carol", "dave"):
                    await approve(store, bus, batch, leaves, keys[name], expires_in_ms=APPROVAL_TTL_MS)
                signed[bid] = await store.now_ms()
        await engine.pass_once()
        # The gateway delivers each released leaf now; the node checks its approvals on arrival.
        for c in await reboot_commands(store):
            cid = str(c["id"])
            if c["state"] == "pending" and not c["held"] and cid not in delivered:
                if await node_accepts(store, str(c["batch_id"])):
                    delivered[cid] = await store.now_ms()
                else:
                    refused.append(str(c["node_id"]))
                    await settle(store, cid, "failed", "BATCH_UNAPPROVED")
        await advance(WAVE_S)
        running = {str(c["id"]) for c in await reboot_commands(store) if c["state"] == "pending"}
        for cid in sorted(delivered.keys() & running):  # back up after the wave's time
            await settle(store, cid, "succeeded", "rebooted")

    view = await queries.get_dag(store, dag_id)
    assert refused == [], f"nodes refused their reboot, its approval aged out: {refused}"
    assert (view.state, view.terminal) == ("done", True), [(n.id, n.state, n.error) for n in view.nodes]
    sent = await reboot_commands(store)
    assert sorted(str(c["node_id"]) for c in sent) == list(NODES)
    assert {str(c["state"]) for c in sent} == {"succeeded"}
    # Each reboot arrived within the hour its batch's approvals were given: asked for when it was due.
    for c in sent:
        assert delivered[str(c["id"])] - signed[str(c["batch_id"])] < APPROVAL_TTL_MS, c
    assert len(signed) == 2  # one batch per wave of --max-parallel 2
