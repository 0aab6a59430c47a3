"""Provisioning as a job (docs/metal.md) over a real store (SQLite and PostgreSQL) on virtual time.

The site and the ramdisk are played at their edge, as a gateway would store what they did: a command
settles, a ramdisk joins with the token the job minted (its token used, its node connected, its inventory
reported), the installed OS joins with its own. Two machines are provisioned in one job; a failure injected
at each step fails that machine `failed:<step>` with the step's words, the other one is provisioned, the
boot lease is cleaned up for both, and no command is ever sent twice.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.control.base.actor import Caller
from bc.control.base.bus import Bus
from bc.control.metal import machines
from bc.control.metal import plan as metal_plan
from bc.control.signing.signer import NullSigner
from bc.control.trust.identity import TokenMint
from bc.errors import Conflict, UsageError
from bc.jobs import queries
from bc.jobs.engine import JobEngine
from bc.jobs.metal_template import TEMPLATE
from bc.jobs.views import JobRequest
from bc.pki.batch_scope import recompute_root
from bc.pki.secrets_source import SeededSecrets
from bc.protocol.pb import admin_pb2, common_pb2
from bc.seams.clock import LoopClock
from bc.store import commands as cmd_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import advance
from tests.unit.control.conftest import AddNode, write_inventory
from tests.unit.control.quorum_setup import add_operator, install
from tests.unit.control.test_quorum import approve, read_batch, reject

ADMIN = Caller("alice", "admin")
IMAGE_SHA = "ab" * 32
KERNEL, INITRD = "11" * 32, "22" * 32
JOIN_TIMEOUT_S = 60.0


@pytest.fixture
def engine(store: InlineSqliteStore, bus: Bus, clock: LoopClock) -> JobEngine:
    mint = TokenMint("sha256:" + "0" * 64, clock, SeededSecrets(5))
    return JobEngine(store, bus, NullSigner(), random.Random(3), holder="gw-test", tokens=mint)


async def enroll(store: InlineSqliteStore, bus: Bus, add_node: AddNode, names: tuple[str, ...]) -> None:
    await add_node("s1", profile=None, role="site")
    for i, name in enumerate(names):
        await machines.enroll(
            store,
            bus,
            NullSigner(),
            random.Random(i),
            ADMIN,
            name=name,
            site_node="s1",
            bmc_url=f"http://127.0.0.1:{8000 + i}",
            macs=[f"52:54:00:00:00:0{i}"],
            labels=["pool=gpu"],
        )


async def submit(store: InlineSqliteStore, engine: JobEngine, names: tuple[str, ...], disk: str = "", **kw: Any) -> str:
    req = metal_plan.Request(
        disk=disk,
        machines=names,
        image="http://10.9.0.2/images/os.raw",
        sha256=IMAGE_SHA,
        ramdisk_kernel_sha256=KERNEL,
        ramdisk_initrd_sha256=INITRD,
        join_timeout_s=JOIN_TIMEOUT_S,
        labels=("rack=r1",),
    )
    plans = await machines.plans(store, req)
    job = JobRequest(TEMPLATE, names, metal_json=json.dumps([p.params() for p in plans]), **kw)
    return await engine.submit(job, "alice")


@dataclass
class Fleet:
    """The site and the machines at their edge: what each does when the job asks (a failure injected by step)."""

    store: InlineSqliteStore
    fail: dict[tuple[str, str], str] = field(default_factory=dict)  # (machine, step) -> how
    sent: list[str] = field(default_factory=list)  # idempotency keys of every command the job sent

    async def commands(self) -> list[dict[str, Any]]:
        async with self.store.transaction(write=False) as tx:
            return await tx.fetchall("SELECT id, node_id, kind, state, idempotency_key, body FROM commands ORDER BY id")

    async def settle(self, command_id: str, state: str, reason: str = "") -> None:
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            row = await cmd_sql.get(tx, command_id)
            assert row is not None
            await cmd_sql.settle(
                tx, command_id, expected=str(row["state"]), state=state, reason=reason, message="", now_ms=now_ms
            )

    async def join(
        self, node_id: str, role: str, disks: list[common_pb2.Disk] | None = None, macs: tuple[str, ...] = ()
    ) -> None:
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            await tx.execute(
                "UPDATE join_tokens SET used_at_ms = :t WHERE node_id = :n AND used_at_ms IS NULL",
                {"t": now_ms, "n": node_id},
            )
            await nodes_sql.ensure(tx, node_id, role, now_ms)
            await nodes_sql.set_connectivity(tx, node_id, "connected", now_ms)
        if disks is not None:
            nics = [common_pb2.Nic(name=f"eth{i}", mac=mac) for i, mac in enumerate(macs)]
            await write_inventory(self.store, node_id, common_pb2.Inventory(disks=disks, nics=nics))

    async def set_connectivity(self, node_id: str, state: str) -> None:
        now_ms = await self.store.now_ms()
        async with self.store.transaction() as tx:
            await nodes_sql.set_connectivity(tx, node_id, state, now_ms)

    async def running(self, dag_id: str) -> list[str]:
        async with self.store.transaction(write=False) as tx:
            rows = await tx.fetchall(
                "SELECT id FROM job_nodes WHERE dag_id = :d AND state = 'running' ORDER BY pos", {"d": dag_id}
            )
        return [str(r["id"]) for r in rows]

    async def play(self, dag_id: str) -> bool:
        """One round of the edge: answer every pending command and every join the job waits for.
        False when there was nothing to do (the job waits for time to pass)."""
        acted = False
        async with self.store.transaction(write=False) as tx:
            details = await tx.fetchall("SELECT id, detail FROM job_nodes WHERE dag_id = :d", {"d": dag_id})
        by_command = {json.loads(str(r["detail"] or "{}")).get("command_id"): str(r["id"]) for r in details}
        for c in await self.commands():
            if c["state"] != "pending":
                continue
            key = str(c["idempotency_key"])
            self.sent.append(key)
            step, machine = by_command[str(c["id"])].split(":", 1)  # a batch leaf's key names no step
            how = self.fail.get((machine, step))
            if how == "gone":  # the ramdisk vanishes under the step: the command stays in flight
                await self.set_connectivity(str(c["node_id"]), "unreachable")
                await self.settle(str(c["id"]), "dispatched")
            elif how:
                await self.settle(str(c["id"]), "failed", how)
            else:
                await self.settle(str(c["id"]), "succeeded")
            acted = True
        for node in await self.running(dag_id):
            if ":" not in node:
                continue  # the job's batch waits for its approvers
            step, machine = node.split(":", 1)
            if self.fail.get((machine, step)):
                continue
            if step == "ramdisk":
                disks = [common_pb2.Disk(name="vda", size_bytes=1 << 30)]
                if self.fail.get((machine, "inventory")):
                    disks = [common_pb2.Disk(name="vda", size_bytes=1 << 30, mounted=["/"])]
                # its NICs: the machine's enrolled MAC (enroll gives m1 …:00, m2 …:01), or another machine's
                mac = (
                    "52:54:00:ff:ff:ff"
                    if self.fail.get((machine, "mac"))
                    else f"52:54:00:00:00:0{int(machine[1:]) - 1}"
                )
                await self.join(f"{machine}-ramdisk", "ramdisk", disks, (mac,))
                acted = True
            elif step == "os":
                await self.join(machine, "node")
                acted = True
        return acted


async def run(engine: JobEngine, fleet: Fleet, dag_id: str) -> None:
    for _ in range(200):
        await engine.pass_once()
        if (await queries.get_dag(fleet.store, dag_id)).terminal:
            return
        if not await fleet.play(dag_id):
            await advance(JOIN_TIMEOUT_S + 1)
    raise AssertionError("the job did not settle")


async def machine(store: InlineSqliteStore, name: str) -> tuple[str, str, str]:
    m = await machines.show(store, name)
    return m.shown_state, m.reason, m.node_id


async def test_two_machines_are_provisioned_in_order_each_command_once_and_the_nodes_get_their_labels(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, add_node: AddNode
) -> None:
    await enroll(store, bus, add_node, ("m1", "m2"))
    dag_id = await submit(store, engine, ("m1", "m2"), max_parallel=1)
    fleet = Fleet(store)
    await run(engine, fleet, dag_id)
    view = await queries.get_dag(store, dag_id)
    assert (view.state, view.terminal) == ("done", True), view.first_error
    assert await machine(store, "m1") == ("provisioned", "", "m1")
    assert await machine(store, "m2") == ("provisioned", "", "m2")
    assert len(fleet.sent) == len(set(fleet.sent)) == 2 * 8  # 8 commands a machine, each once
    by_key = {str(c["idempotency_key"]): (str(c["node_id"]), str(c["kind"])) for c in await fleet.commands()}
    kinds = [by_key[k] for k in fleet.sent if k.endswith(":m1")]
    assert kinds == [
        ("s1", "bmc.power"),
        ("s1", "boot.prepareRamdisk"),
        ("s1", "bmc.boot"),
        ("s1", "bmc.power"),
        ("m1-ramdisk", "disk.wipe"),
        ("m1-ramdisk", "deploy.image"),
        ("m1-ramdisk", "boot.kexec"),
        ("s1", "boot.cleanUp"),
    ]
    # --max-parallel 1: m2's first command comes after m1's last step
    keys = fleet.sent
    assert keys.index(f"job:{dag_id}:power-off:m2") > keys.index(f"job:{dag_id}:kexec:m1")
    async with store.transaction(write=False) as tx:
        node = await nodes_sql.get(tx, "m1")
        tokens = await tx.fetchall("SELECT node_id, role, used_at_ms FROM join_tokens ORDER BY node_id")
    assert node is not None and json.loads(str(node["labels"])) == {"pool": "gpu", "rack": "r1"}
    assert [(t["node_id"], t["role"]) for t in tokens] == [
        ("m1", "node"),
        ("m1-ramdisk", "ramdisk"),
        ("m2", "node"),
        ("m2-ramdisk", "ramdisk"),
    ]
    assert all(t["used_at_ms"] is not None for t in tokens)


STEP_FAILURES: dict[str, tuple[str, str]] = {
    # step -> (what the edge does, words the machine's reason carries)
    "power-off": ("bmc-unreachable", "bmc.power on s1 failed (bmc-unreachable)"),
    "prepare": ("image-not-cached", "boot.prepareRamdisk on s1 failed (image-not-cached)"),
    "pxe": ("bmc-timeout", "bmc.boot on s1 failed (bmc-timeout)"),
    "power-on": ("bmc-error", "bmc.power on s1 failed (bmc-error)"),
    "ramdisk": ("never", "the ramdisk did not join as m1-ramdisk within 60 s"),
    "inventory": ("mounted", "inventory: none of the 1 disk(s) the ramdisk reports is usable"),
    "wipe": ("gone", "the ramdisk m1-ramdisk is unreachable; its disk.wipe was cancelled"),
    "deploy": ("digest-mismatch", "deploy.image on m1-ramdisk failed (digest-mismatch)"),
    "kexec": ("no-such-partition", "boot.kexec on m1-ramdisk failed (no-such-partition)"),
    "os": ("never", "the installed OS did not join as m1 within 60 s"),
}


@pytest.mark.parametrize("step", list(STEP_FAILURES))
async def test_a_failure_at_each_step_fails_that_machine_there_and_the_other_goes_on(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, add_node: AddNode, step: str
) -> None:
    await enroll(store, bus, add_node, ("m1", "m2"))
    dag_id = await submit(store, engine, ("m1", "m2"))
    how, words = STEP_FAILURES[step]
    fleet = Fleet(store, fail={("m1", step): how})
    await run(engine, fleet, dag_id)
    state, reason, node_id = await machine(store, "m1")
    assert (state, node_id) == (f"failed:{step}", ""), reason
    assert words in reason
    assert await machine(store, "m2") == ("provisioned", "", "m2")
    view = await queries.get_dag(store, dag_id)
    assert (view.state, view.terminal) == ("failed", True)
    assert len(fleet.sent) == len(set(fleet.sent)), "a command was sent twice"
    assert f"job:{dag_id}:cleanup:m1" in fleet.sent  # the boot lease goes whatever happened
    later = list(STEP_FAILURES)[list(STEP_FAILURES).index(step) + 1 :]
    assert not [k for k in fleet.sent if any(k == f"job:{dag_id}:{s}:m1" for s in later)], "ran past its failure"


async def test_a_restarted_engine_resumes_a_provisioning_job_and_sends_nothing_twice(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, add_node: AddNode, clock: LoopClock
) -> None:
    await enroll(store, bus, add_node, ("m1",))
    dag_id = await submit(store, engine, ("m1",))
    fleet = Fleet(store)
    for _ in range(3):  # part of the way: power off, prepare, pxe
        await fleet.play(dag_id)
        await engine.pass_once()
    fresh = JobEngine(store, bus, NullSigner(), random.Random(99), holder="gw-test", tokens=engine.tokens)
    await run(fresh, fleet, dag_id)
    assert await machine(store, "m1") == ("provisioned", "", "m1")
    assert len(fleet.sent) == len(set(fleet.sent)) == 8


async def test_enroll_writes_the_site_section_and_refuses_what_is_wrong(
    store: InlineSqliteStore, bus: Bus, add_node: AddNode
) -> None:
    await enroll(store, bus, add_node, ("m1",))
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, "s1")
    assert row is not None
    spec = json.loads(str(row["spec"]))
    assert [m["name"] for m in spec["site"]["machines"]] == ["m1"] and int(row["generation"]) >= 1
    [m] = await machines.list_machines(store)
    assert (m.name, m.site_node, m.shown_state, m.labels) == ("m1", "s1", "enrolled", {"pool": "gpu"})

    def again(**kw: Any) -> Callable[[], Any]:
        args: dict[str, Any] = {"name": "m9", "site_node": "s1", "bmc_url": "http://127.0.0.1:9000"} | kw
        return lambda: machines.enroll(store, bus, NullSigner(), random.Random(1), ADMIN, **args)

    with pytest.raises(Conflict, match="already lists a machine named 'm1'"):
        await again(name="m1")()
    with pytest.raises(UsageError, match="bmc_url must not carry credentials"):
        await again(bmc_url="http://root:pw@127.0.0.1:9000")()
    with pytest.raises(UsageError, match="52:54:00:00:00:00 is also 'm1'"):
        await again(macs=["52:54:00:00:00:00"])()
    await add_node("n1")
    with pytest.raises(UsageError, match="node n1 has the role node, not site"):
        await again(site_node="n1")()
    assert [m.name for m in await machines.list_machines(store)] == ["m1"]  # nothing of the refusals stored

    await machines.remove(store, bus, NullSigner(), random.Random(2), ADMIN, "m1")
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, "s1")
    assert row is not None and not json.loads(str(row["spec"])).get("site", {}).get("machines")
    assert await machines.list_machines(store) == []


async def quorum(store: InlineSqliteStore, bus: Bus) -> list[ed25519.Ed25519PrivateKey]:
    """bob and carol are approvers (k = 2); alice, who runs the jobs, is not one of them."""
    keys = [ed25519.Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32) for i in range(2)]
    await install(store, bus, dict(zip(("bob", "carol"), keys, strict=True)), k=2)
    await add_operator(store, "alice", "admin")
    return keys


async def bulk_batch(store: InlineSqliteStore, dag_id: str) -> str:
    view = await queries.get_dag(store, dag_id)
    [bulk] = [n for n in view.nodes if n.id == "bulk"]
    return str(bulk.detail["batch_id"])


def batch_info(batch: Any, leaves: list[Any]) -> admin_pb2.BatchInfo:
    """What `bc approve sign` reads of the batch (GetBatch), to recompute its scope itself."""
    return admin_pb2.BatchInfo(
        id=str(batch["id"]),
        kind=str(batch["kind"]),
        payload_json=str(batch["payload_json"]),
        scope_root=bytes(batch["scope_root"]).hex(),
        leaves=[
            admin_pb2.BatchLeafInfo(
                index=int(r["idx"]),
                node_id=str(r["node_id"]),
                kind=str(r["kind"]),
                payload_digest=bytes(r["payload_digest"]).hex(),
            )
            for r in leaves
        ],
    )


async def test_with_approvers_the_destructive_steps_wait_for_one_metal_bulk_batch_and_run_as_its_leaves(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, add_node: AddNode
) -> None:
    await enroll(store, bus, add_node, ("m1", "m2"))
    keys = await quorum(store, bus)
    with pytest.raises(UsageError, match=r"name the disk \(--disk NAME\)"):
        await submit(store, engine, ("m1", "m2"))
    dag_id = await submit(store, engine, ("m1", "m2"), disk="vda")
    fleet = Fleet(store)
    assert not await fleet.play(dag_id) and not fleet.sent  # nothing runs before the quorum
    batch_id = await bulk_batch(store, dag_id)
    batch, leaves = await read_batch(store, batch_id)
    assert str(batch["kind"]) == "metal.bulk" and str(batch["state"]) == "pending"
    steps = [(str(r["node_id"]), str(r["kind"])) for r in leaves]
    assert (
        steps[:5]
        == [
            ("s1", "bmc.power"),
            ("s1", "bmc.boot"),
            ("s1", "bmc.power"),
            ("m1-ramdisk", "disk.wipe"),
            ("m1-ramdisk", "deploy.image"),
        ]
        and len(steps) == 10
    )
    assert recompute_root(batch_info(batch, leaves)) == bytes(batch["scope_root"])  # what an approver checks
    for key in keys:
        await approve(store, bus, batch, leaves, key)
    await run(engine, fleet, dag_id)
    assert await machine(store, "m1") == ("provisioned", "", "m1")
    assert await machine(store, "m2") == ("provisioned", "", "m2")
    batch, leaves = await read_batch(store, batch_id)
    assert (str(batch["state"]), str(batch["resolution"])) == ("approved", "done")
    async with store.transaction(write=False) as tx:
        rows = await tx.fetchall("SELECT kind, batch_id, batch_proof FROM commands ORDER BY id")
    destructive = [r for r in rows if r["kind"] in ("bmc.power", "bmc.boot", "disk.wipe", "deploy.image")]
    assert len(destructive) == 10 and all(r["batch_id"] == batch_id and r["batch_proof"] for r in destructive)
    assert all(not r["batch_id"] for r in rows if r not in destructive)
    assert sorted(str(r["command_id"]) for r in leaves) == sorted(
        str(c["id"]) for c in await fleet.commands() if str(c["idempotency_key"]).startswith("batch:")
    )
    assert len(fleet.sent) == len(set(fleet.sent)) == 16


async def test_a_rejected_metal_bulk_batch_runs_nothing_and_fails_every_machine(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, add_node: AddNode
) -> None:
    await enroll(store, bus, add_node, ("m1",))
    keys = await quorum(store, bus)
    dag_id = await submit(store, engine, ("m1",), disk="vda")
    batch, _ = await read_batch(store, await bulk_batch(store, dag_id))
    await reject(store, bus, batch, keys[0])
    fleet = Fleet(store)
    await run(engine, fleet, dag_id)
    state, reason, _ = await machine(store, "m1")
    assert state == "failed:queued" and "was rejected" in reason, reason
    assert [k for k in fleet.sent if ":cleanup:" not in k] == []  # only the lease clean-up (harmless) ran


async def test_reprovision_cordons_and_drains_the_node_first_then_provisions_its_machine_again(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, add_node: AddNode
) -> None:
    await enroll(store, bus, add_node, ("m1",))
    fleet = Fleet(store)
    await run(engine, fleet, await submit(store, engine, ("m1",)))
    assert await machine(store, "m1") == ("provisioned", "", "m1")
    first = len(fleet.sent)
    plans = await machines.plans(
        store,
        metal_plan.Request(
            machines=(),
            reprovision_node="m1",
            image="http://10.9.0.2/images/os.raw",
            sha256=IMAGE_SHA,
            ramdisk_kernel_sha256=KERNEL,
            ramdisk_initrd_sha256=INITRD,
            join_timeout_s=JOIN_TIMEOUT_S,
        ),
    )
    assert [(p.machine, p.os_node) for p in plans] == [("m1", "m1")]
    req = JobRequest(TEMPLATE, ("m1",), metal_json=json.dumps([p.params() for p in plans]), reprovision="m1")
    dag_id = await engine.submit(req, "alice")
    view = await queries.get_dag(store, dag_id)
    order = [n.id for n in view.nodes]
    assert order[:2] == ["set:m1", "drain:m1"] and "reconcile:m1" in order
    await run(engine, fleet, dag_id)
    assert (await queries.get_dag(store, dag_id)).state == "done"
    async with store.transaction(write=False) as tx:
        node = await nodes_sql.get(tx, "m1")
    assert node is not None and node["cordoned"] == 1 and node["job_hold"] is None  # drained, left cordoned
    assert await machine(store, "m1") == ("provisioned", "", "m1")
    assert len(fleet.sent) - first == 8 and len(fleet.sent) == len(set(fleet.sent))


async def test_a_ramdisk_that_reports_none_of_the_machines_macs_fails_it_before_any_disk_is_touched(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, add_node: AddNode
) -> None:
    await enroll(store, bus, add_node, ("m1", "m2"))
    dag_id = await submit(store, engine, ("m1", "m2"))
    fleet = Fleet(store, fail={("m1", "mac"): "another machine"})
    await run(engine, fleet, dag_id)
    state, reason, _ = await machine(store, "m1")
    assert state == "failed:inventory" and "none of the machine's enrolled MACs (52:54:00:00:00:00" in reason, reason
    assert not [k for k in fleet.sent if k.endswith((":wipe:m1", ":deploy:m1"))]
    assert await machine(store, "m2") == ("provisioned", "", "m2")


async def test_with_approvers_enrolling_waits_for_its_spec_batch_and_provisioning_waits_for_the_section(
    store: InlineSqliteStore, bus: Bus, engine: JobEngine, add_node: AddNode
) -> None:
    await add_node("s1", profile=None, role="site")
    await quorum(store, bus)
    view, batch_id = await machines.enroll(
        store, bus, NullSigner(), random.Random(1), ADMIN, name="m1", site_node="s1", bmc_url="http://10.9.0.11"
    )
    assert batch_id.startswith("b-") and batch_id in view.reason and view.state == "enrolled"
    batch, _ = await read_batch(store, batch_id)
    assert str(batch["kind"]) == "spec.set"  # the site section's change: root-equivalent, the quorum's first
    async with store.transaction(write=False) as tx:
        row = await nodes_sql.get(tx, "s1")
    assert row is not None and "machines" not in json.loads(str(row["spec"])).get("site", {})
    with pytest.raises(Conflict, match="not in site s1's section yet"):
        await submit(store, engine, ("m1",), disk="vda")
