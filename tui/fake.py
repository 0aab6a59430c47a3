"""A seeded, in-memory Admin source: what snapshot tests and `bench/tui.py` drive the app with.

Everything comes from one `random.Random` passed in, so the same seed gives the same fleet,
and a `FrozenClock` keeps every age on screen still. It implements `tui.source.Source`;
`publish` appends an event and hands it to live watchers (as the events log does).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

from bc.errors import NotFound, Unauthenticated
from bc.protocol.pb import admin_pb2, common_pb2, metal_pb2, tunnel_pb2
from tui.source import Source

T0_MS = 1_780_000_000_000  # a fixed server time for seeded screens


class FrozenClock:
    """Time stands still for ages; `sleep` still waits (on the running loop) so loops do not spin."""

    def __init__(self, at: float = 1000.0) -> None:
        self.at = at

    def now(self) -> float:
        return T0_MS / 1000 + self.at

    def monotonic(self) -> float:
        return self.at

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def seeded_nodes(rng: random.Random, n: int) -> list[admin_pb2.NodeInfo]:
    out = []
    for i in range(n):
        gen = rng.randint(1, 9)
        state = rng.choices(["connected", "disconnected", "unreachable", "new"], [90, 5, 3, 2])[0]
        lag = rng.random() < 0.05
        info = admin_pb2.NodeInfo(
            node_id=f"gpu-{i:04d}",
            role=rng.choice(["node", "node", "node", "site"]),
            state=state,
            generation=gen,
            applied_generation=gen - lag,
            observed_generation=gen - lag,
            last_seen_age_ms=-1 if state == "new" else rng.randint(0, 4000) * (1 if state == "connected" else 90),
            state_age_ms=-1 if state == "new" else rng.randint(60_000, 9 * 86_400_000),
            labels={"rack": f"r{i // 32:02d}", "zone": rng.choice(["a", "b"])},
            cordoned=rng.random() < 0.03,
        )
        if state != "connected":
            info.no_schedule.append(state)
        if info.cordoned:
            info.no_schedule.append("cordoned")
        info.capacity.add(device_class="gpu", offered=8, booked_now=rng.choice([0, 0, 2, 4, 8]))
        for g in range(8):
            info.inventory.gpus.add(uuid=f"GPU-{i:04d}-{g}")
        out.append(info)
    return out


class FakeSource:
    """The Admin calls of `tui.source.Source`, over seeded replies held in memory."""

    def __init__(self, rng: random.Random, *, nodes: int = 8, role: str = "operator") -> None:
        self.server = "fake:0"
        self.role = role
        self.nodes = {n.node_id: n for n in seeded_nodes(rng, nodes)}
        self.events: list[admin_pb2.EventRecord] = []
        self.commands: list[admin_pb2.CommandInfo] = []
        self.batches: list[admin_pb2.BatchInfo] = []
        self.quorum_changes: list[admin_pb2.QuorumChangeInfo] = []
        self.jobs: list[admin_pb2.JobInfo] = []
        self.reservations: list[admin_pb2.Reservation] = []
        self.tunnels: list[tunnel_pb2.TunnelRecord] = [
            tunnel_pb2.TunnelRecord(
                sid="t-01fake0000000000000000000",
                node_id="gpu-0000",
                operator="oncall",
                purpose="shell",
                port=22,
                reason="disk full on /var",
                state="open",
                issued_at_ms=T0_MS + 990_000,
                opened_at_ms=T0_MS + 990_500,
                bytes_up=48_213,
                bytes_down=2_301_877,
            )
        ]
        self.machines: list[metal_pb2.MachineInfo] = [
            metal_pb2.MachineInfo(
                name=f"rack1-n0{i}",
                site_node="site-rack1",
                bmc_url=f"https://10.9.0.{10 + i}",
                macs=[f"52:54:00:00:00:0{i}"],
                state=state,
                step=step,
                reason=reason,
                node_id=node,
                dag_id="j-01fake0000000000000000000" if state != "enrolled" else "",
                updated_at_ms=T0_MS + 900_000 + i * 1000,
            )
            for i, (state, step, reason, node) in enumerate(
                [
                    ("provisioned", "", "", "rack1-n00"),
                    ("provisioning", "deploy", "", ""),
                    ("failed", "power-off", "power-off: bmc.power on site-rack1 failed (bmc-unreachable)", ""),
                    ("enrolled", "", "", ""),
                ]
            )
        ]
        self._watchers: list[asyncio.Queue[admin_pb2.EventRecord]] = []
        self.up = True
        self._seed_rest(rng)

    # -- seeding ----------------------------------------------------------------------------

    def _seed_rest(self, rng: random.Random) -> None:
        ids = sorted(self.nodes)
        kinds = ["inventory.refresh", "diag.nvml", "logs.collect", "diag.dcgm"]
        lanes = dict(zip(kinds, ["control", "control", "bulk", "provision"], strict=True))
        for i, state in enumerate(["running", "running", "acked", "pending", "succeeded", "failed", "succeeded"]):
            kind = kinds[i % len(kinds)]
            self.commands.append(
                admin_pb2.CommandInfo(
                    id=f"c-{i:04d}", node_id=ids[i % len(ids)], kind=kind, state=state, lane=lanes[kind], seq=i + 1,
                    created_age_ms=60_000 * (i + 1), updated_age_ms=5_000 * (i + 1), attempt=1,
                    idempotency_key=f"k-{i}", requested_by="alice",
                    reason="XID 79" if state == "failed" else "",
                    signer_key_id="ed25519:5f1c0a9e7d2b4c68", attested=kind == "gpu.reset",
                )
            )  # fmt: skip
        leaves = [
            admin_pb2.BatchLeafInfo(index=j, node_id=ids[j], kind="gpu.reset", payload_digest="ab" * 32)
            for j in range(min(3, len(ids)))
        ]
        self.batches.append(
            admin_pb2.BatchInfo(
                id="b-0001", kind="gpu.reset", state="pending", requested_by="bob", reason="XID 79 on rack r00",
                scope_root="cd" * 32, payload_json='{"gpuUuids":["GPU-0000-0"]}', leaves=leaves, threshold=2,
                approvals=1, created_age_ms=300_000, not_after_ms=T0_MS + 3_600_000,
                decisions=[admin_pb2.BatchDecision(name="carol", decision="approve", at_age_ms=120_000)],
            )
        )  # fmt: skip
        chain = [("SetWanted", "done"), ("Drain", "done"), ("Command", "running"), ("Reconcile", "queued")]
        self.jobs.append(
            admin_pb2.JobInfo(
                id="j-0001", template="reboot", state="running", subjects=[ids[0]], requested_by="alice",
                reason="kernel 6.8", created_at_ms=T0_MS - 600_000,
                nodes=[admin_pb2.JobNodeInfo(id=f"n{k}", kind=kind, subject=ids[0], state=st)
                       for k, (kind, st) in enumerate(chain)],
            )
        )  # fmt: skip
        self.jobs.append(
            admin_pb2.JobInfo(
                id="j-0000", template="cordon", state="done", terminal=True, subjects=[ids[1]],
                created_at_ms=T0_MS - 900_000,
                nodes=[admin_pb2.JobNodeInfo(id="set", kind="SetWanted", subject=ids[1], state="done")],
            )
        )  # fmt: skip
        self.reservations += [
            admin_pb2.Reservation(
                id="r-0001", node_id=ids[0], gpus=2, device_class="gpu", state="active", created_age_ms=3_600_000,
                devices=[admin_pb2.BookedDevice(device_class="gpu", atom_id=f"GPU-0000-{g}") for g in range(2)],
                start_ms=T0_MS - 3_600_000, tenant="ml",
            ),
            admin_pb2.Reservation(
                id="r-0002", gpus=8, device_class="gpu", state="pending", reason="no node has 8 free gpu",
                created_age_ms=60_000, tenant="ml",
            ),
        ]  # fmt: skip
        for i in range(12):
            t = ["node.connectivity", "command.settled", "node.status", "security.node.quarantined"][i % 4]
            subject = ids[i % len(ids)] if not t.startswith("command.") else f"c-{i:04d}"
            self._append(t, subject, '{"state":"connected"}' if t == "node.connectivity" else "{}")

    def _append(self, type_: str, subject: str, data_json: str) -> admin_pb2.EventRecord:
        ev = admin_pb2.EventRecord(
            seq=len(self.events) + 1, type=type_, subject=subject, data_json=data_json, at_ms=T0_MS + len(self.events)
        )
        self.events.append(ev)
        return ev

    def publish(self, type_: str, subject: str, data_json: str = "{}") -> admin_pb2.EventRecord:
        ev = self._append(type_, subject, data_json)
        for q in self._watchers:
            q.put_nowait(ev)
        return ev

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Source]:
        yield self

    # -- Source ---------------------------------------------------------------------------

    async def server_info(self) -> admin_pb2.ServerInfoResponse:
        return admin_pb2.ServerInfoResponse(
            version="fake", server_time_ms=T0_MS, operator="alice", role=self.role, event_seq=len(self.events)
        )

    async def fleet_snapshot(self, *, include_deleted: bool = False) -> admin_pb2.ListNodesResponse:
        listed = []
        for n in self.nodes.values():
            row = admin_pb2.NodeInfo()
            row.CopyFrom(n)
            row.ClearField("capacity")
            row.ClearField("inventory")
            listed.append(row)
        return admin_pb2.ListNodesResponse(nodes=listed, event_seq=len(self.events))

    async def get_node(self, node_id: str) -> admin_pb2.NodeInfo:
        if node_id not in self.nodes:
            raise NotFound(f"no node named {node_id!r}")
        out = admin_pb2.NodeInfo()
        out.CopyFrom(self.nodes[node_id])
        out.event_seq = len(self.events)
        out.sections.add(section="telemetry", state=common_pb2.CONVERGED, generation=out.generation)
        out.sections.add(section="devices", state=common_pb2.PROGRESSING, generation=out.generation, reason="Waiting")
        out.conditions.add(type="GpusHealthy", status="True", reason="AllHealthy", age_ms=600_000)
        # Two VMs of bc's and one domain it did not create (docs/instances.md), drawn from no Random.
        out.instances.add(
            id="web-1", runtime="qemu", state="RUNNING", desired="RUNNING", managed=True, vcpus=4, memory_mib=8192
        )
        out.instances.add(
            id="batch-7",
            runtime="qemu",
            state="STOPPED",
            desired="RUNNING",
            managed=True,
            vcpus=16,
            memory_mib=262144,
            message="ResourcesExhausted: 270592 MiB needed, 20480 MiB left",
        )
        out.instances.add(id="legacy-vm", runtime="qemu", state="RUNNING", managed=False)
        return out

    async def commands_snapshot(
        self, *, node_id: str = "", state: str = "", limit: int = 0
    ) -> admin_pb2.ListCommandsResponse:
        got = [c for c in self.commands if (not node_id or c.node_id == node_id) and (not state or c.state == state)]
        return admin_pb2.ListCommandsResponse(commands=got[: limit or 100], event_seq=len(self.events))

    async def list_commands(self, *, node_id: str = "", state: str = "", limit: int = 0) -> list[admin_pb2.CommandInfo]:
        return list((await self.commands_snapshot(node_id=node_id, state=state, limit=limit)).commands)

    async def get_command(self, command_id: str) -> admin_pb2.CommandInfo:
        for c in self.commands:
            if c.id == command_id:
                return c
        raise NotFound(f"no command {command_id!r}")

    async def get_pki(self) -> admin_pb2.PkiInfo:
        return admin_pb2.PkiInfo(command_signing=True, worker=admin_pb2.SigningKeyInfo(key_id="sha256:" + "ef" * 32))

    async def cancel_command(self, command_id: str, *, reason: str = "") -> admin_pb2.CommandInfo:
        c = await self.get_command(command_id)
        c.cancel_requested = True
        return c

    async def run_command(
        self,
        node_id: str,
        kind: str,
        *,
        payload_json: str = "",
        not_after_s: int = 0,
        min_generation: int = 0,
        idempotency_key: str = "",
    ) -> admin_pb2.CommandInfo:
        c = admin_pb2.CommandInfo(id=f"c-{len(self.commands):04d}", node_id=node_id, kind=kind, state="pending")
        self.commands.append(c)
        return c

    async def cordon_node(self, node_id: str, cordon: bool) -> admin_pb2.NodeInfo:
        self.nodes[node_id].cordoned = cordon
        return self.nodes[node_id]

    async def list_reservations(
        self, *, node_id: str = "", include_released: bool = False, state: str = "", tenant: str = ""
    ) -> list[admin_pb2.Reservation]:
        want = {"pending": ("pending",), "active": ("active", "placed"), "ended": ("released", "ended", "failed")}
        return [
            r
            for r in self.reservations
            if (not node_id or r.node_id == node_id) and (not state or r.state in want.get(state, (state,)))
        ]

    async def usage(self, *, since_ms: int = 0, until_ms: int = 0, by: str = "") -> admin_pb2.UsageResponse:
        rows = [
            admin_pb2.UsageRow(key="r-0001", atom_ms=2 * 3_600_000, atom_seconds=7200.0, windows=1, device_class="gpu")
        ]
        return admin_pb2.UsageResponse(rows=rows, now_ms=T0_MS)

    async def release(self, reservation_id: str) -> admin_pb2.Reservation:
        for r in self.reservations:
            if r.id == reservation_id:
                r.state = "released"
                return r
        raise NotFound(f"no reservation {reservation_id!r}")

    async def list_batches(self, *, state: str = "") -> list[admin_pb2.BatchInfo]:
        return [b for b in self.batches if not state or b.state == state]

    async def list_quorum_changes(self, *, state: str = "") -> list[admin_pb2.QuorumChangeInfo]:
        return [c for c in self.quorum_changes if not state or c.state == state]

    async def get_batch(self, batch_id: str) -> admin_pb2.BatchInfo:
        for b in self.batches:
            if b.id == batch_id:
                return b
        raise NotFound(f"no batch {batch_id!r}")

    async def decide_batch(
        self,
        batch_id: str,
        key_id: str,
        signature: bytes,
        *,
        approve: bool,
        expires_at_ms: int = 0,
        reason: str = "",
    ) -> admin_pb2.BatchInfo:
        return await self.get_batch(batch_id)

    async def get_health(self) -> admin_pb2.HealthInfo:
        """A fleet with one GPU in remediation, one queued behind the node limit, a driver waiting for a
        reboot (shown), and a quarantined GPU."""
        ids = sorted(self.nodes)
        h = admin_pb2.HealthInfo(
            policy_version=2,
            enabled=True,
            event_seq=len(self.events),
            limits=admin_pb2.HealthLimitsInfo(
                nodes=1, node_cap=1, actions_last_hour=1, actions_cap=4, per_label="", fleet_size=len(ids)
            ),
        )
        h.conditions.add(
            node_id=ids[0], gpu_uuid="GPU-0a1b", reason="Xid79", message="XID 79: GPU has fallen off the bus",
            since_ms=1_700_000_000_000, rule="xid:79", action="reset", episode_id="h-01",
            type="GpuHealthy/GPU-0a1b",
        )  # fmt: skip
        h.conditions.add(
            node_id=ids[1], gpu_uuid="GPU-2c3d", reason="EccUncorrectable",
            message="3 uncorrectable volatile ECC errors", since_ms=1_700_000_060_000, rule="ecc", action="reset",
            episode_id="h-02", type="GpuHealthy/GPU-2c3d",
        )  # fmt: skip
        h.conditions.add(
            node_id=ids[2], reason="NotRunning", message="nvidia-fabricmanager is inactive",
            since_ms=1_700_000_100_000, type="FabricManagerReady", action="none",
        )  # fmt: skip
        h.running.add(
            id="h-01", node_id=ids[0], gpu_uuid="GPU-0a1b", state="running", action="reset", rule="xid:79",
            stage="reset", dag_id="d-0007", job_state="running", started_at_ms=1_700_000_010_000,
        )  # fmt: skip
        h.queue.add(
            id="h-02", node_id=ids[1], gpu_uuid="GPU-2c3d", state="queued", action="reset", rule="ecc",
            opened_at_ms=1_700_000_060_000, wait_reason="1 of at most 1 node(s) are in remediation",
        )  # fmt: skip
        h.cordons.add(node_id=ids[0], gpu_uuid="GPU-0a1b", reason="health h-01: xid:79 (Xid79)", episode_id="h-01",
                      since_ms=1_700_000_000_000)  # fmt: skip
        h.cordons.add(node_id=ids[3], gpu_uuid="GPU-4e5f", reason="health h-00: quarantined: the reboot failed",
                      episode_id="h-00", quarantined=True, since_ms=1_699_990_000_000)  # fmt: skip
        return h

    async def list_jobs(self, *, include_all: bool = False) -> admin_pb2.ListJobsResponse:
        return admin_pb2.ListJobsResponse(jobs=self.jobs, pools=[admin_pb2.JobPool(name="reboots", capacity=2, held=1)])

    async def cancel_job(self, dag_id: str) -> admin_pb2.CancelJobResponse:
        for j in self.jobs:
            if j.id == dag_id:
                j.state, j.terminal = "cancelled", True
                return admin_pb2.CancelJobResponse(cancelled=True, job=j)
        raise NotFound(f"no job {dag_id!r}")

    async def list_tunnels(self, *, node_id: str = "", open_only: bool = False) -> list[tunnel_pb2.TunnelRecord]:
        return [
            t for t in self.tunnels if (not node_id or t.node_id == node_id) and (not open_only or t.state == "open")
        ]

    async def close_tunnel(self, sid: str, *, reason: str = "") -> tunnel_pb2.TunnelRecord:
        for t in self.tunnels:
            if t.sid == sid:
                if self.role != "admin":
                    raise Unauthenticated("closing a tunnel needs the admin role")
                if t.state == "open":
                    t.state, t.end_reason = "closed", reason or "closed"
                return t
        raise NotFound(f"no tunnel {sid!r}")

    async def list_machines(self) -> metal_pb2.ListMachinesResponse:
        return metal_pb2.ListMachinesResponse(machines=self.machines)

    async def list_events(
        self, *, after_seq: int = 0, limit: int = 0, type_prefix: str = ""
    ) -> list[admin_pb2.EventRecord]:
        return [e for e in self.events[after_seq:] if e.type.startswith(type_prefix)][: limit or 100]

    async def watch(self, *, after_seq: int = 0, type_prefix: str = "") -> AsyncIterator[admin_pb2.EventRecord]:
        q: asyncio.Queue[admin_pb2.EventRecord] = asyncio.Queue()
        for ev in self.events[after_seq:]:
            q.put_nowait(ev)
        self._watchers.append(q)
        try:
            while True:
                yield await q.get()
        finally:
            self._watchers.remove(q)
