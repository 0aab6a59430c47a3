"""What the simulated fleet is asked to do: an operator's mix of work, drawn from one seeded Random.

`make_workload(rng)` returns the callable `bc.sim.fleet.run` starts as a task (and cancels at the quiet
period). It calls the same library functions the Admin servicer calls, under the control plane of the
moment (`fleet.control()` waits while it is down), so the work goes through the production code:

* reservations (`bc.control.capacity.reservations.reserve`): some with a window that starts later, some with
  only a duration, some open-ended, some on a named node; released later (`release`), or ended by the
  placement pass at their window's end. Only `devices` has a converger on the agent today, and
  reservations are what write it, so each placed or released hold counts as `spec.devices`;
* spec changes through `bc.control.nodes.specs.set_section` on the other sections (`host`, `access`,
  `telemetry`): the agent reports `host` and `telemetry` UNSUPPORTED (terminal), which still exercises
  delivery and `observed_generation`; its `access` converger writes nothing for these principals (they
  name no node, so none is the node's own) and reports CONVERGED;
* commands of every kind the fake hardware runs on a GPU node (`NODE_KINDS`: the `node` role's), through
  `bc.control.commands.queue.enqueue`; the destructive ones outside a batch meet the unbatched allowance;
* destructive batches (`bc.control.quorum.batches.create_batch`) that three seeded approvers sign (or, now and
  then, reject); their Ed25519 keys are derived from the Random, so a run replays. One of them, approver0,
  holds a second key (`second_key`) and signs with both: the quorum's dangerous situation (Q1), a batch
  one person signed twice, which only the count's distinct-operator rule keeps one approval;
* jobs (`bc.jobs.engine.JobEngine.submit`): reboots with `max_parallel`, remediations, rollouts. Their
  batches are signed by the same approvers.

Rates are per node and per simulated hour (`Rates`), so the load grows with the fleet. The mix lands
in `fleet.work`: `reservations`, `releases`, `spec.<section>`, `command.<kind>`, `batches`,
`approvals`, `rejections`, `jobs.<template>`; a refusal the production code raises on purpose (a
Conflict while busy, a node that is away) counts as `refused.<what>` and the workload goes on.

Determinism: every choice is drawn from the Random passed in, in a fixed order, and only sorted or
insertion-ordered collections are iterated; ids the control plane draws come from the same Random.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.kinds import REGISTRY
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.capacity import reservations
from bc.control.commands import queue as cmds
from bc.control.nodes import specs
from bc.control.quorum import approvers as appr
from bc.control.quorum import batches as quorum
from bc.control.signing.signer import Signer
from bc.errors import BcError, Conflict, NotFound, Unavailable, UsageError
from bc.jobs.engine import JobEngine
from bc.jobs.views import JobRequest
from bc.pki import quorum as q
from bc.protocol import kinds
from bc.protocol.pb import common_pb2
from bc.seams.ids import ulid
from bc.store import Store, Tx
from bc.store import nodes as nodes_sql
from bc.store import operators as ops_sql
from bc.store import quorum as q_sql
from bc.store.base import StoreError

log = logging.getLogger(__name__)

REQUESTER = "sim-operator"
"""Who asks for the work (never an approver: a requester's own approval does not count)."""
APPROVERS = ("approver0", "approver1", "approver2")
TWO_KEYS = "approver0"
"""The operator who holds a second approver key (`second_key`) and signs with both."""
SECOND_KEY_NAME = f"{TWO_KEYS}-second"
THRESHOLD = 2
UNBATCHED_PER_HOUR = 1
"""Set through a signed quorum change, so an unbatched destructive command sometimes runs and is
sometimes refused `UNBATCHED_LIMIT` by the node."""
APPROVAL_TTL_MS = 3_600_000
SPEC_SECTIONS = ("access", "host", "telemetry")
"""The sections the workload writes besides `devices` (which reservations write)."""
JOB_TEMPLATES = ("reboot", "remediate", "rollout")
# The simulated hosts are GPU nodes: the kinds an agent of the `node` role runs (not a ramdisk's or a site's),
# but not those of VMs (`instance.*`: they need a running instance and an upload URL; `--instances` models VMs
# through their section), so a run draws the mix it drew before VMs had commands and keeps its digest.
NODE_KINDS = tuple(sorted(k for k in REGISTRY if "node" in kinds.KINDS[k].roles and not k.startswith("instance.")))


class ControlPlaneLike(Protocol):
    """What the workload needs of the control plane of the moment (`bc.sim.fleet`'s and SessionPair's)."""

    @property
    def store(self) -> Store: ...
    @property
    def bus(self) -> Bus: ...
    @property
    def signer(self) -> Signer: ...
    @property
    def jobs(self) -> JobEngine | None: ...
    @property
    def quorum_count(self) -> q.CountApprovals:
        """The batch quorum's count this control plane decides with (production's unless a `--break`)."""
        ...


class FleetLike(Protocol):
    """What the workload needs of the fleet: its nodes, where to count, and the control plane."""

    @property
    def node_ids(self) -> Sequence[str]: ...
    @property
    def work(self) -> Counter[str]: ...
    def asked_to_release(self, reservation_id: str) -> None:
        """The workload (the operator) asks for the reservation's release now (the health checker H1 reads when)."""
        ...

    def control(self) -> AbstractAsyncContextManager[ControlPlaneLike]: ...


Workload = Callable[[FleetLike], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class Rates:
    """Per node and per simulated hour (fleet-wide ones say so), and the workload's rhythm."""

    reservations: float = 6.0
    releases: float = 2.0
    specs: float = 0.3
    commands: float = 3.0
    batches_per_hour: float = 36.0  # fleet-wide, however large: each needs people to sign it (Q1 sees 10+ a half hour)
    jobs_per_hour: float = 6.0  # fleet-wide too
    approval_pass_s: float = 60.0
    """How often the approvers look at pending batches (a person's rhythm, not a machine's)."""
    reject_share: float = 0.05
    """The share of batches an approver rejects instead of signing."""

    def weights(self, nodes: int) -> dict[str, float]:
        """Each action's rate per simulated second for `nodes` nodes, in a fixed order."""
        return {
            "reserve": self.reservations * nodes / 3600,
            "release": self.releases * nodes / 3600,
            "spec": self.specs * nodes / 3600,
            "command": self.commands * nodes / 3600,
            "batch": self.batches_per_hour / 3600,
            "job": self.jobs_per_hour / 3600,
        }


@dataclass(frozen=True)
class Approver:
    name: str  # the key's name in the approver set
    key: ed25519.Ed25519PrivateKey
    operator: str = ""
    """The operator the key is registered to, whose certificate sends its decisions; empty: the one named like
    the key."""

    @property
    def holder(self) -> str:
        return self.operator or self.name

    @property
    def raw(self) -> bytes:
        return self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def key_id(self) -> str:
        return q.key_id(self.raw)

    def public_b64(self) -> str:
        return base64.b64encode(self.raw).decode()


def seeded_approvers(rng: random.Random) -> list[Approver]:
    """The approvers' keys, drawn from the seed (Ed25519 signs deterministically, so a run replays)."""
    return [Approver(name, ed25519.Ed25519PrivateKey.from_private_bytes(rng.randbytes(32))) for name in APPROVERS]


def second_key(first: Approver) -> Approver:
    """`first`'s operator's second approver key. Derived from the first key's private bytes rather than drawn,
    so that the Random's draws (and every other choice of a seed's run) stay what they were without it."""
    raw = first.key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    seed = hashlib.sha256(b"bc-sim-second-approver-key\n" + raw).digest()
    return Approver(SECOND_KEY_NAME, ed25519.Ed25519PrivateKey.from_private_bytes(seed), operator=first.holder)


@dataclass
class _State:
    """What the workload remembers between actions (insertion-ordered, so iteration is deterministic)."""

    open_reservations: list[str] = field(default_factory=list)
    gpus: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ready: bool = False


def make_workload(rng: random.Random, rates: Rates | None = None) -> Workload:
    """The workload callable for `bc.sim.fleet.run(cfg, workload=...)`; every choice drawn from `rng`."""
    r = rates or Rates()

    async def workload(fleet: FleetLike) -> None:
        await Driver(fleet, rng, r).run()

    return workload


class Driver:
    """One workload run over one fleet: bootstrap the approvers, then draw actions until cancelled."""

    def __init__(self, fleet: FleetLike, rng: random.Random, rates: Rates) -> None:
        self.fleet, self.rng, self.rates = fleet, rng, rates
        self.nodes = sorted(fleet.node_ids)
        self.approvers = seeded_approvers(rng)
        two = next(a for a in self.approvers if a.name == TWO_KEYS)
        self.keys: dict[str, list[Approver]] = {a.holder: [a] for a in self.approvers}
        self.keys[two.holder].append(second_key(two))
        self.state = _State()
        self.work = fleet.work

    async def run(self) -> None:
        await self.bootstrap()
        weights = self.rates.weights(len(self.nodes))
        names = list(weights)
        total = sum(weights.values())
        next_approval = self.rates.approval_pass_s
        elapsed = 0.0
        while True:
            wait = self.rng.expovariate(total) if total > 0 else self.rates.approval_pass_s
            if elapsed + wait >= next_approval:
                await asyncio.sleep(next_approval - elapsed)
                elapsed = next_approval
                next_approval += self.rates.approval_pass_s
                await self.guarded("approve", self.approval_pass)
                continue
            await asyncio.sleep(wait)
            elapsed += wait
            action = self.rng.choices(names, [weights[n] for n in names])[0]
            await self.guarded(action, getattr(self, f"do_{action}"))

    async def guarded(self, what: str, fn: Callable[[ControlPlaneLike], Awaitable[None]]) -> None:
        """Run one action under the control plane of the moment; a refusal is counted, never raised."""
        try:
            async with self.fleet.control() as cp:
                await fn(cp)
        except (Conflict, NotFound, UsageError) as e:
            # Production refusing on purpose: busy, away, expired, a batch already decided.
            self.work[f"refused.{what}"] += 1
            log.debug("event=sim.workload-refused action=%s why=%s", what, e)
        except (Unavailable, StoreError, ConnectionError) as e:
            # The control plane went down under the action (a restart mid-transaction).
            self.work[f"interrupted.{what}"] += 1
            log.debug("event=sim.workload-interrupted action=%s why=%s", what, e)
        except BcError as e:
            self.work[f"refused.{what}"] += 1
            log.debug("event=sim.workload-refused action=%s why=%s", what, e)

    # -- the approvers ------------------------------------------------------------------------

    async def bootstrap(self) -> None:
        """Operators for the approvers, their keys, k and the unbatched allowance, each change signed."""
        while not self.state.ready:
            try:
                async with self.fleet.control() as cp:
                    await self._bootstrap(cp)
                self.state.ready = True
            except (Unavailable, StoreError, ConnectionError):
                self.work["interrupted.bootstrap"] += 1
                await asyncio.sleep(5)

    async def _bootstrap(self, cp: ControlPlaneLike) -> None:
        store = cp.store
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            for a in self.approvers:
                if await ops_sql.get(tx, a.name) is None:
                    await ops_sql.insert(tx, a.name, "operator", "bc sim", now_ms)
            if await ops_sql.get(tx, REQUESTER) is None:
                await ops_sql.insert(tx, REQUESTER, "operator", "bc sim", now_ms)
        current = await appr.approver_set(store)
        have = {str(r["name"]) for r in current.approvers}
        edits: list[appr.Edit] = [
            appr.AddApprover(a.name, a.public_b64()) for a in self.approvers if a.name not in have
        ]
        if current.threshold != THRESHOLD or not have:
            edits.append(appr.SetThreshold(THRESHOLD))
        if current.unbatched_per_hour != UNBATCHED_PER_HOUR:
            edits.append(appr.SetAllowance(UNBATCHED_PER_HOUR))
        for edit in edits:
            p = await appr.propose(store, cp.bus, edit, REQUESTER, self.rng)
            if p.state == "pending":
                await self._sign_change(cp, p.change_id)
            self.work["quorum.changes"] += 1
        await self._add_second_key(cp)

    async def _add_second_key(self, cp: ControlPlaneLike) -> None:
        """Give approver0's operator a second approver key, through a quorum change the approvers sign.

        `bc approvers add` refuses a second key of an operator (`bc.control.quorum.approvers`: one key per
        operator), but only where the change is proposed: the approvers sign whatever settings a change shows
        them, and neither the control plane applying it nor a node walking the path to it checks that rule
        again. So a change proposed by an older or a compromised control plane can give one person two keys,
        and then only the count's distinct-operator rule (`bc.pki.quorum.count_approvals`, at both ends) keeps
        that person one approval. The simulator writes such a proposal as that process would (the row
        `propose` writes, from the settings in force to them plus the key) and the rest is production's."""
        extra = self.keys[TWO_KEYS][1]
        store = cp.store
        now_ms = await store.now_ms()
        async with store.transaction() as tx:
            cur = await appr.stored(tx)
            if any(str(r["key_id"]) == extra.key_id for r in cur.approvers):
                return
            change_id = await self._second_key_change(tx, cp.bus, cur, extra, now_ms)
        await self._sign_change(cp, change_id)
        self.work["quorum.changes"] += 1

    async def _second_key_change(self, tx: Tx, bus: Bus, cur: appr.ApproverSet, extra: Approver, now_ms: int) -> str:
        """The pending change adding `extra` (the one already asked for, after an interrupted bootstrap)."""
        frm = appr.effective(cur)
        to = common_pb2.QuorumSettings()
        to.CopyFrom(frm)
        to.version = cur.version + 1
        to.approver_keys.add(key_id=extra.key_id, public_key=extra.raw, name=extra.name, operator=extra.holder)
        pending = await q_sql.open_change(tx, now_ms)
        if pending is not None and bytes(pending["to_settings"]) == to.SerializeToString(deterministic=True):
            return str(pending["id"])
        # Its own Random for the id, from the key: the workload's draws stay as they were without this change.
        change_id = "q-" + ulid(now_ms / 1000, random.Random(extra.raw))
        summary = q.describe_change(frm, to)
        await q_sql.insert_change(
            tx,
            id_=change_id,
            requested_by=REQUESTER,
            summary=summary,
            from_settings=frm.SerializeToString(deterministic=True),
            to_settings=to.SerializeToString(deterministic=True),
            threshold=q.change_threshold(frm),
            to_version=to.version,
            now_ms=now_ms,
            not_after_ms=now_ms + round(appr.CHANGE_TTL_S * 1000),
        )
        data = {"summary": summary, "requested_by": REQUESTER, "needs": q.change_threshold(frm)}
        await publish(tx, bus, "quorum.change-requested", change_id, data, now_ms)
        return change_id

    async def _sign_change(self, cp: ControlPlaneLike, change_id: str) -> None:
        async with cp.store.transaction(write=False) as tx:
            row = await q_sql.get_change(tx, change_id)
        assert row is not None
        frm = common_pb2.QuorumSettings.FromString(bytes(row["from_settings"]))
        to = common_pb2.QuorumSettings.FromString(bytes(row["to_settings"]))
        msg = q.change_message(change_id, q.settings_digest(frm), q.settings_digest(to), REQUESTER)
        holders = {a.key_id for a in frm.approver_keys}
        for a in self.approvers:
            if a.key_id not in holders:
                continue
            async with cp.store.transaction(write=False) as tx:
                row = await q_sql.get_change(tx, change_id)
            if row is None or str(row["state"]) != "pending":
                return
            await appr.decide(cp.store, cp.bus, change_id, a.key_id, a.key.sign(msg), approve=True, caller=a.holder)

    async def approval_pass(self, cp: ControlPlaneLike) -> None:
        """Every pending batch (oldest first) gets k signatures, or now and then one rejection.

        approver0 looks at every batch first and signs with both of its keys (Q1's dangerous situation, in every
        batch): the production count takes one of the two, so the signature of another approver, drawn for each
        batch, is still needed; a count that takes both approves the batch on one person's."""
        store = cp.store
        async with store.transaction(write=False) as tx:
            rows = await q_sql.list_batches(tx, "pending", limit=1000)
            pending = []
            for row in sorted(rows, key=lambda r: (int(r["created_at_ms"]), str(r["id"]))):
                pending.append((row, await q_sql.count_leaves(tx, str(row["id"]))))
        for row, leaf_count in pending:
            batch_id, root, by = str(row["id"]), bytes(row["scope_root"]), str(row["requested_by"])
            signers = self.rng.sample(self.approvers, len(self.approvers))
            try:
                if self.rng.random() < self.rates.reject_share:
                    a, reason = signers[0], "bc sim: an approver says no"
                    sig = a.key.sign(q.rejection_message(batch_id, root, reason))
                    await quorum.decide(
                        store, cp.bus, batch_id, a.key_id, sig, approve=False, caller=a.holder, reason=reason
                    )
                    self.work["rejections"] += 1
                    continue
                now_ms = await store.now_ms()
                expires = now_ms + APPROVAL_TTL_MS
                msg = q.approval_message(batch_id, root, leaf_count, by, expires)
                first = next(a for a in self.approvers if a.holder == TWO_KEYS)
                chosen = [first, *[a for a in signers if a is not first][: THRESHOLD - 1]]
                for key in [k for a in chosen for k in self.keys[a.holder]]:
                    await quorum.decide(
                        store,
                        cp.bus,
                        batch_id,
                        key.key_id,
                        key.key.sign(msg),
                        approve=True,
                        caller=key.holder,
                        expires_at_ms=expires,
                        count=cp.quorum_count,
                    )
                    self.work["approvals"] += 1
                    if key.operator:  # a second key of its operator
                        self.work["approvals.second-key"] += 1
            except (Conflict, UsageError, NotFound):
                self.work["refused.approve"] += 1  # expired, already decided: the batch moved on without us

    # -- actions ------------------------------------------------------------------------------

    def pick_node(self) -> str:
        return self.nodes[self.rng.randrange(len(self.nodes))]

    def pick_nodes(self, most: int) -> list[str]:
        k = self.rng.randint(1, max(1, min(most, len(self.nodes))))
        return sorted(self.rng.sample(self.nodes, k))

    async def node_gpus(self, cp: ControlPlaneLike, node_id: str) -> tuple[str, ...]:
        """The node's GPU UUIDs from its reported inventory (remembered once known)."""
        known = self.state.gpus.get(node_id)
        if known:
            return known
        async with cp.store.transaction(write=False) as tx:
            rows = await nodes_sql.placement_facts(tx, node_id)
        gpus = tuple(sorted(g.uuid for g in reservations.inventory_of(rows[0]).gpus)) if rows else ()
        if gpus:
            self.state.gpus[node_id] = gpus
        return gpus

    async def do_reserve(self, cp: ControlPlaneLike) -> None:
        rng = self.rng
        now_ms = await cp.store.now_ms()
        gpus = rng.choices((1, 2, 4, 8), (4, 3, 2, 1))[0]
        node_id = self.pick_node() if rng.random() < 0.3 else ""
        shape = rng.choices(("window", "duration", "open"), (4, 3, 3))[0]
        start_ms = end_ms = duration_ms = None
        if shape == "window":  # starts later, ends at a set time
            start_ms = now_ms + rng.randint(1, 30) * 60_000
            end_ms = start_ms + rng.randint(10, 120) * 60_000
        elif shape == "duration":
            duration_ms = rng.randint(10, 120) * 60_000
        req = reservations.ReserveRequest(
            gpus=gpus, node_id=node_id, start_ms=start_ms, end_ms=end_ms, duration_ms=duration_ms
        )
        row = await reservations.reserve(cp.store, cp.bus, cp.signer, req, rng)
        self.state.open_reservations.append(str(row["id"]))
        self.work["reservations"] += 1
        self.work[f"reservations.{shape}"] += 1
        if str(row["state"]) == "placed":
            self.work["spec.devices"] += 1

    async def do_release(self, cp: ControlPlaneLike) -> None:
        live = self.state.open_reservations
        if not live:
            return
        rid = live.pop(self.rng.randrange(len(live)))
        self.fleet.asked_to_release(rid)  # asked for, whatever comes of it
        row = await reservations.release(cp.store, cp.bus, cp.signer, rid)
        state = str(row["state"])
        if state == "ended":  # its window ended first: the placement pass took it back
            self.work["reservations.ended-before-release"] += 1
            return
        self.work["releases"] += 1
        if state == "releasing":  # it was on a node: the release is a devices write
            self.work["spec.devices"] += 1

    async def do_spec(self, cp: ControlPlaneLike) -> None:
        rng = self.rng
        section = rng.choice(SPEC_SECTIONS)
        node_id = self.pick_node()
        await specs.set_section(cp.store, cp.bus, cp.signer, node_id, section, section_json(section, rng))
        self.work[f"spec.{section}"] += 1

    async def do_command(self, cp: ControlPlaneLike) -> None:
        rng = self.rng
        kind = rng.choice(NODE_KINDS)
        node_id = self.pick_node()
        payload = await self.payload(cp, kind, [node_id])
        req = cmds.EnqueueRequest(
            node_id, kind, cmds.payload_from_json(kind, payload), not_after_s=600.0, requested_by=REQUESTER
        )
        await cmds.enqueue(cp.store, cp.bus, cp.signer, req, rng)
        self.work[f"command.{kind}"] += 1

    async def payload(self, cp: ControlPlaneLike, kind: str, node_ids: list[str]) -> str:
        """A payload the fake hardware accepts: GPU resets name one GPU of each node."""
        rng = self.rng
        if kind == "gpu.reset":
            uuids: list[str] = []
            for n in node_ids:
                gpus = await self.node_gpus(cp, n)
                if gpus:
                    uuids.append(gpus[rng.randrange(len(gpus))])
            if not uuids:
                raise Conflict(f"no inventory from {node_ids[0]} yet: nothing to reset")
            return json.dumps({"gpu_uuids": uuids})
        if kind == "diag.dcgm":
            return json.dumps({"level": rng.randint(1, 2)})
        if kind == "node.reboot":
            return json.dumps({"reason": "bc sim"})
        return "{}"

    async def do_batch(self, cp: ControlPlaneLike) -> None:
        kind = self.rng.choice(sorted(kinds.DESTRUCTIVE & set(NODE_KINDS)))
        nodes = self.pick_nodes(4)
        payload = await self.payload(cp, kind, nodes)
        req = quorum.BatchRequest(kind, nodes, payload, reason="bc sim", not_after_s=1800.0)
        await quorum.create_batch(cp.store, cp.bus, cp.signer, req, REQUESTER, self.rng)
        self.work["batches"] += 1
        self.work[f"batches.{kind}"] += 1

    async def do_job(self, cp: ControlPlaneLike) -> None:
        rng = self.rng
        template = rng.choice(JOB_TEMPLATES)
        if cp.jobs is None:
            raise Conflict("the job queue does not run in this fleet")
        if template == "reboot":
            req = JobRequest("reboot", tuple(self.pick_nodes(6)), reason="bc sim", max_parallel=rng.randint(1, 3))
        elif template == "remediate":
            req = JobRequest("remediate", (self.pick_node(),), reason="bc sim", deadline_s=600.0)
        else:
            section = rng.choice(SPEC_SECTIONS)
            req = JobRequest(
                "rollout",
                tuple(self.pick_nodes(8)),
                section=section,
                section_json=section_json(section, rng),
                max_unavailable=rng.randint(1, 3),
            )
        await cp.jobs.submit(req, REQUESTER)
        self.work[f"jobs.{template}"] += 1


def section_json(section: str, rng: random.Random) -> str:
    """A valid value for one of `SPEC_SECTIONS`, drawn from `rng`."""
    n = rng.randint(0, 9)
    if section == "telemetry":
        return json.dumps({"otlp_endpoint": f"http://collector-{n}.sim:4317", "export_interval_s": 10 + n})
    if section == "access":
        return json.dumps({"principals": sorted({f"user{n}", f"user{rng.randint(0, 9)}"})})
    # The sysctl unit and a key on the operator's allowlist: an operator's change, never root-equivalent
    # (bc.protocol.root_equiv), so the node takes it without a quorum batch.
    return json.dumps({"units": [{"name": "sysctl", "settings_json": json.dumps({"vm.swappiness": n})}]})
