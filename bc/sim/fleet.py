"""`bc sim`'s runner: the production control plane, gateway and agents on virtual time, under seeded chaos.

`run(cfg)` builds a `Fleet` on `SessionPair`'s wiring (the inline store, the Signer, one real `Gateway`,
liveness, the sweeper, the job engine and the placement pass as `bc serve` runs them, and per node a
whole `Agent` on fake hardware) over `bc.seams.network.SimNetwork` (faulty links of the chaos level), then:

1. starts the workload (`bc.sim.workload`) and executes the chaos schedule (`bc.sim.chaos`), each fault
   as a task at its time, for `duration_s` simulated seconds;
2. stops the workload, heals everything (partitions healed, every agent running, the control plane's
   clock back on the store's) and lets the fleet settle for `quiet_s` (placement, reconnects);
3. reads what the store holds into the `FactLog` (`bc.sim.record`), runs every checker
   (`bc.sim.checkers.check_all`, I7 on the quiet snapshot) and takes the events log's digest.

**Faults are events.** Each fault is published as a `sim.fault` event (subject: its targets, or
`control-plane`; data: kind, params and its simulated second) through the production `publish`, so the
events log, its digest, `Watch` and `--trace` all carry it. A fault that strikes while the control plane
is down is published as soon as it is back, with its own simulated second in the data. A `spec-replay`
also writes a `sim.spec-replay` event naming the node it reached (maybe not its target) and the generation.

**Determinism.** One seed reaches everything: the pair's Random (control plane, agents, fake hardware),
and two Randoms drawn from it for the chaos schedule and the links' fates. The run lives on
`bc.seams.virtual_time`'s loop and reads no wall time, so one seed writes one events log, whatever the host,
the process or `PYTHONHASHSEED`; `--journal-files` changes where journals live, not what happens (the
SQLite journal runs inline on the loop, `bc.sim.file_journal`), so the digest is the same.

**Deliberate bugs.** `break_rule` applies `bc.sim.breaks.seams_for(rule)`: the journal wrapper where the
agents open their journals, each agent's spec rule (`AgentParts.spec_rule`) and quorum count
(`AgentParts.quorum_count`), the Liveness factory and the gateway and placement classes where the control
plane is built, and the control plane's quorum count (`ControlPlane.quorum_count`, which the workload's
batch decisions pass); nothing in production code reads the rule.

**Several gateways** (`gateways` > 1, up to `MAX_GATEWAYS`): the control plane runs its worker roles only
and `bc.sim.gateways.GatewayFleet` runs N gateway processes on the same store (an `OutageStore`, opened
once: a control-plane restart is then a worker process restarting, and the store stays up as PostgreSQL
would), each node dialing all N with the production agent's rotation. The chaos then also kills and
stalls gateways and takes the store out (`bc.sim.chaos`); the nodes a gateway held, and every node during
a store outage, are away until their next Hello (I3 asks nothing of them meanwhile). With one gateway
the fleet is built exactly as before, so existing seeds keep their digests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from agent.app import Agent
from agent.health.monitor import HealthMonitor
from agent.hw.base import HardwareBackend
from agent.hw.fake import FakeHardware
from agent.instances.fake import FakeRuntime
from agent.journal_api import AgentJournal
from bc.assembly.control import ControlFactories
from bc.control.base.bus import Bus
from bc.control.base.events import publish
from bc.control.health.admin import set_policy
from bc.control.signing.signer import Signer
from bc.control.trust.intent import Intent
from bc.errors import UsageError
from bc.gateway.sessions import Gateway, GatewayConfig
from bc.protocol.kinds import KINDS
from bc.protocol.pb import session_pb2
from bc.protocol.text_safety import one_line
from bc.seams.clock import Clock, LoopClock, ms
from bc.seams.network import LinkFaults, SimNetwork
from bc.seams.virtual_time import WALL_START
from bc.seams.virtual_time import run as run_virtual
from bc.sim import chaos, storm_aim, storms, strikes
from bc.sim import instances as sim_instances
from bc.sim.breaks import PowerLoss, SimSeams, seams_for
from bc.sim.bus_hub import BusHub
from bc.sim.chaos import Fault, Level
from bc.sim.checkers import InvariantResult, check_all
from bc.sim.facts import FactLog
from bc.sim.gateways import GatewayEvent, GatewayFleet, address
from bc.sim.gpu_faults import GpuFaults
from bc.sim.health_record import health_from_store
from bc.sim.pair import ControlPlane, PairConfig, PairNode, SessionPair, _scratch_dir, events_digest
from bc.sim.process_store import OutageStore
from bc.sim.record import LinkWatch, Recorder, from_store, quiet_snapshot, watch_links
from bc.sim.strikes import Strike, Strikes
from bc.sim.sweep import SeedOutcome
from bc.sim.trace import trace
from bc.sim.workload import Workload, make_workload
from bc.store import Store, StoreError
from bc.store import capacity as cap_sql
from bc.store import events as events_sql

MAX_GATEWAYS = 8
REBOOT_S = 45.0
"""How long a `node.reboot` command keeps the machine down before its agent starts on the new boot id."""
SIM_WALL_START = WALL_START - 20 * 60
"""A run's wall clock starts at 07:40 (2027-01-15), twenty minutes before an hour ends, so a run of half an hour
closes every running hold's usage hour: the periodic flush's dangerous moment (I8) in every run, not only in
the runs a workload's release happened to cut."""
GPU_RESET_S = 10.0
"""How long a fake GPU reset takes, as a real one does: a command can be interrupted while it runs."""
PROGRESS_EVERY_S = 60.0
DIRECTIONS: dict[str, Literal["both", "to_node", "from_node"]] = {
    "both": "both",
    "to_node": "to_node",
    "from_node": "from_node",
}

Progress = Callable[[float, int, int], None]
"""`progress(simulated seconds, events so far, faults so far)`, about once per simulated minute."""


AIM_AT_HOLDS = 0.75
"""How often a scheduled journal loss moves to a node that holds a booking (`Fleet._aim_at_holds`)."""


@dataclass(frozen=True)
class SimConfig:
    nodes: int
    seed: int
    chaos: Level = "none"
    duration_s: float = 3600.0
    gateways: int = 1
    journal_files: bool = False
    break_rule: str | None = None
    health: bool = False
    """`--health`: set a health policy at the start and add XID storms to the chaos (`bc.sim.storms`)."""
    instances: bool = False
    """`--instances`: VMs with passed-through GPUs on every node, instance reservations, and V1
    (`bc.sim.instances`)."""
    trace: Path | None = None
    """Write the events log here, one JSON array (seq, type, subject, data, at_ms) a line."""
    quiet_s: float = 300.0
    """The quiet period after the run: no workload, no faults, everything healed, before I7 is checked."""

    def repro(self) -> str:
        """The command that runs this again."""
        out = f"bc sim --nodes {self.nodes} --chaos {self.chaos} --seed {self.seed}"
        out += f" --duration {_duration(self.duration_s)}"
        if self.gateways != 1:
            out += f" --gateways {self.gateways}"
        if self.journal_files:
            out += " --journal-files"
        if self.health:
            out += " --health"
        if self.instances:
            out += " --instances"
        if self.break_rule:
            out += f" --break {self.break_rule}"
        return out


@dataclass
class SimResult:
    digest: str
    events: int
    faults: Counter[str]
    work: Counter[str]
    invariants: list[InvariantResult]
    sim_seconds: float
    wall_seconds: float
    repro: str
    link_faults: Counter[str] = field(default_factory=Counter)
    """What the links did on their own (`SimNetwork.stats`: drops, resets, duplicates, ...)."""
    facts: FactLog | None = None
    gateways: int = 1
    gateway_fences: int = 0
    """How many times a gateway process fenced itself (counted with several gateways only)."""
    traces: dict[str, list[str]] = field(default_factory=dict)
    """Per failed invariant, the last events that touched what its counterexample names (`bc.sim.trace`)."""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.invariants)


def _duration(seconds: float) -> str:
    """As `bc sim --duration` reads it: whole seconds written `1h30m`, `20m`, `45s`."""
    left, out = round(seconds), ""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            out += f"{left // size}{unit}"
            left %= size
    return out or "0s"


class SimPair(SessionPair):
    """`SessionPair` with the simulator's seams: the recorder's outbox on every agent, the break's
    components, the agent restarts and outages written down as they happen."""

    def __init__(self, root: Path, cfg: SimConfig, network: SimNetwork, recorder: Recorder, seams: SimSeams) -> None:
        several = cfg.gateways > 1
        pair_cfg = PairConfig(
            reboot_s=REBOOT_S,
            reboot_restarts=True,
            journal_files=cfg.journal_files,
            gateway=not several,
            wall_start=SIM_WALL_START,
        )
        super().__init__(root, seed=cfg.seed, agents=cfg.nodes, cfg=pair_cfg, network=network)
        self.recorder, self.seams, self.sim_network = recorder, seams, network
        self.boots: dict[str, str] = {}
        self.gateway_count = cfg.gateways
        self.health = cfg.health
        self.instances = cfg.instances
        self.node_index = {n: i for i, n in enumerate(self.node_ids())}
        self.hub = BusHub()
        self.shared_store: OutageStore | None = None
        """With several gateways: the one store every process uses, open from the start to the end."""
        self.gateways: GatewayFleet | None = None
        self.on_gateway: GatewayEvent | None = None
        self._cp_bus: Bus | None = None

    @property
    def several(self) -> bool:
        return self.gateway_count > 1

    async def _open_store(self) -> Store:
        if not self.several:
            return await super()._open_store()
        if self.shared_store is None:
            self.shared_store = OutageStore(self.root / "bc.db", self.clock)
            await self.shared_store.open()
        return self.shared_store

    async def _close_store(self, store: Store) -> None:
        if not self.several:
            await super()._close_store(store)
        # else: the store outlives the control plane's processes; `stop` closes it

    def _make_control_plane(self, store: Store, signer: Signer, intent: Intent, rng: random.Random) -> ControlPlane:
        s = self.seams
        control = ControlFactories(
            gateway_cls=s.gateway_cls, liveness=s.liveness, placement_cls=s.placement_cls, health_cls=s.health_cls
        )
        cp = ControlPlane(store, signer, intent, self.cp_clock, rng, self.cfg, control, s.quorum_count)
        if self.several:  # the worker process's wake-ups reach the gateway processes, and theirs it
            if self._cp_bus is not None:
                self.hub.leave(self._cp_bus)
            self._cp_bus = cp.bus
            self.hub.join(cp.bus)
        return cp

    async def _open_control_plane(self) -> ControlPlane:
        cp = await super()._open_control_plane()
        if self.several and self.gateways is None:
            assert self.shared_store is not None
            self.gateways = GatewayFleet(
                self.gateway_count,
                self.shared_store,
                self.cp_clock,
                self.sim_network,
                self.hub,
                self._new_gateway,
                self.seed,
                on_event=self.on_gateway,
            )
            self.recorder.routing = self.gateways.routing
            await self.gateways.start_all()
        return cp

    async def _new_gateway(self, gateway_id: str, store: Store, bus: Bus, clock: Clock) -> Gateway:
        """A gateway process's Gateway, as the control plane builds its own (the break's class included)."""
        signer = self.process_signer()
        intent = await self.process_intent(store, signer)
        cfg = GatewayConfig(heartbeat_interval_s=self.cfg.heartbeat_interval_s)
        return self.seams.gateway_cls(store, bus, clock, gateway_id, signer, intent, cfg)

    def _hardware(self, node_id: str, node_dir: Path, rng: random.Random) -> HardwareBackend:
        hw = super()._hardware(node_id, node_dir, rng)
        if isinstance(hw, FakeHardware):
            hw.reset_seconds = GPU_RESET_S
        return hw

    def _build_agent(self, node: PairNode) -> Agent:
        agent = super()._build_agent(node)
        if self.gateways is not None:  # every gateway's address, node i first on gateway i mod N
            agent.parts.dial = self.gateways.dialer(node.node_id, self.node_index[node.node_id])
        outbox = self.recorder.outbox(node.node_id)
        agent.outbox = outbox
        # The recording journal is outermost: it counts the acceptances the dispatcher sees made.
        # The spec tap sits inside it, around the break's journal: it records what the agent stored.
        spec_journal = self.recorder.spec_journal(node.node_id, self.seams.journal(agent.parts.open_journal))
        agent.parts.open_journal = outbox.journal(spec_journal)
        agent.parts.spec_rule = self.seams.spec_rule
        agent.parts.devices_converger = self.seams.devices_cls
        agent.parts.quorum_count = self.seams.quorum_count
        if self.health:  # the GPUs' health, read as `bc node --fake-hw` reads it (the storms write its faults file)
            source = node.hw.capabilities.health(node.dir, ())
            if source is not None:
                agent.parts.health = source
                agent.health = HealthMonitor(source, agent.parts.clock, agent.parts.offload)
        if self.instances:  # the fake VM runtime `bc node --fake-hw` runs, its records in the machine's directory
            sim_instances.prepare_machine(node.dir)
            agent.parts.instances = FakeRuntime(node.dir / "fake-instances.json", agent.parts.offload)
        self.boots.setdefault(node.node_id, node.hw.boot_id())
        return agent

    async def crash_agent(self, node_id: str) -> None:
        task = self.tasks.get(node_id)
        if task is not None and not task.done():
            self.recorder.away(node_id, "agent-down")
        await super().crash_agent(node_id)

    def start_agent(self, node_id: str) -> Agent:
        node = self.nodes[node_id]
        boot = node.hw.boot_id()
        self.recorder.facts.agent_restart(self.recorder.now_ms(), node_id, boot != self.boots.get(node_id))
        self.boots[node_id] = boot
        self.recorder.back(node_id, "agent-down")
        return super().start_agent(node_id)

    async def stop(self) -> None:
        await super().stop()
        if self.gateways is not None:
            await self.gateways.stop()
        if self.shared_store is not None:
            await self.shared_store.close()

    async def power_loss(self, node_id: str, lose: PowerLoss) -> None:
        """What a power loss does to the node's journal under `lose` (the agent is down)."""
        node = self.nodes[node_id]
        journal = await self._open_journal(node)
        await lose(journal)
        if self.cfg.journal_files:  # the restart opens the file again, as a new process would
            await journal.close()
            node.journal = None

    async def open_journal_id(self, node_id: str, within_s: float = 60.0) -> str:
        """The journal id of the node's running agent, once it has opened it."""
        for _ in range(int(within_s * 10)):
            journal: AgentJournal | None = getattr(self.agents[node_id], "journal", None)
            if journal is not None:
                return journal.journal_id
            await asyncio.sleep(0.1)
        return ""


class Fleet:
    """The running simulation: what the workload and the chaos act on, and what the checkers read."""

    def __init__(self, cfg: SimConfig, root: Path) -> None:
        if not 1 <= cfg.gateways <= MAX_GATEWAYS:
            raise UsageError(f"--gateways must be between 1 and {MAX_GATEWAYS}, not {cfg.gateways}")
        if cfg.nodes < 1:
            raise UsageError("a fleet needs at least one node (--nodes)")
        self.cfg = cfg
        self.facts = FactLog()
        self.work: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        seeds = random.Random(cfg.seed ^ 0x5EED_C4A05)
        self.recorder = Recorder(self.facts, self._now_ms)
        links = {
            "none": LinkFaults.none,
            "light": LinkFaults.light,
            "heavy": LinkFaults.heavy,
            "storm": LinkFaults.heavy,
        }[cfg.chaos]()
        self.network = SimNetwork(
            random.Random(seeds.getrandbits(64)), faults=links, tap=self.recorder.tap, stats=LinkWatch()
        )
        watch_links(self.network, self.recorder)
        self.seams = seams_for(cfg.break_rule)
        self.pair = SimPair(root, cfg, self.network, self.recorder, self.seams)
        chaos_rng = random.Random(seeds.getrandbits(64))
        self.schedule: list[Fault] = chaos.schedule(
            cfg.chaos, chaos_rng, self.pair.node_ids(), cfg.duration_s, cfg.gateways
        )
        if cfg.health:  # drawn after every other fault: the rest of the schedule is the one without storms
            more = storms.schedule(chaos_rng, self.pair.node_ids(), cfg.duration_s)
            more += storms.aimed(chaos_rng, self.pair.node_ids(), cfg.duration_s)
            self.schedule = sorted(self.schedule + more, key=lambda f: (f.t_s, f.kind, f.targets))
        self.gpu_faults = GpuFaults(self.pair)
        self.operator_released: dict[str, int] = {}
        """Reservations the workload (the operator) asked to release, and when it first asked (the store's ms): H1
        blames any other release of a held GPU under remediation, or one decided before the ask, on the
        reconciler."""
        self.strikes = Strikes(cfg.chaos, random.Random(seeds.getrandbits(64)), cfg.gateways)
        self._aim = random.Random(f"bc-sim-aim:{cfg.seed}")  # its own: every other draw of the run is unchanged
        self._storm_aim = random.Random(f"bc-sim-storm-aim:{cfg.seed}")  # the aimed XIDs' (`bc.sim.storm_aim`)
        self._struck: set[str] = set()
        """Nodes (and gateway addresses) a strike is still working on: not struck again until it is over."""
        self.striking = False
        """Strikes land only while the workload and the chaos run (not before the start, nor in the quiet)."""
        self.recorder.moment = self._moment
        self._unpublished: list[tuple[str, str, dict[str, object]]] = []
        """Events for the log (type, subject, data) not written yet: the store was out or the control plane down."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._errors: list[tuple[str, BaseException]] = []  # (the injector task's name, what it raised)
        self.t0 = 0.0
        """The loop time the run's chaos and workload started at (`t_s` of the run's own events counts from it)."""
        self.pair.on_gateway = self._gateway_event

    # -- what the workload uses ------------------------------------------------------------

    @property
    def clock(self) -> LoopClock:
        return self.pair.clock

    @property
    def node_ids(self) -> list[str]:
        return self.pair.node_ids()

    @contextlib.asynccontextmanager
    async def control(self) -> AsyncIterator[ControlPlane]:
        """The control plane of the moment; waits while it is down (a restart)."""
        while self.pair.cp is None or not self.pair.cp_up.is_set():
            await self.pair.cp_up.wait()
        yield self.pair.cp

    def _now_ms(self) -> int:
        return ms(self.pair.clock.now())

    def asked_to_release(self, reservation_id: str) -> None:
        """`FleetLike.asked_to_release`: the store's clock is the loop's (`bc.sim.process_store` passes it on)."""
        self.operator_released.setdefault(reservation_id, self._now_ms())

    async def set_health_policy(self) -> None:
        """`--health`: the storms' policy in force before anything runs, as an admin's `bc health policy set`."""
        async with self.control() as cp:
            await set_policy(cp.store, cp.bus, storms.POLICY, "sim-operator", "bc sim --health")

    # -- chaos ------------------------------------------------------------------------------

    async def run_chaos(self, t0: float) -> None:
        """Each fault of the schedule at its time (`t0` + `t_s` on the loop), as its own task."""
        loop = asyncio.get_running_loop()
        self.t0 = t0
        for f in self.schedule:
            await asyncio.sleep(max(0.0, t0 + f.t_s - loop.time()))
            if f.kind == chaos.JOURNAL_LOSS:
                f = await self._aim_at_holds(f)
            elif "aim" in f.params and self.pair.cp is not None and self.pair.cp_up.is_set():
                f = await storm_aim.aim(f, self.pair.cp.store, self._storm_aim)
            self.faults[f.kind] += 1
            await self._publish_fault(f, loop.time() - t0)
            self._spawn(self._inject(f), f"fault-{f.kind}")

    async def _aim_at_holds(self, f: Fault) -> Fault:
        """A journal lost where a hold is live is where a node that forgets its holds shows (I5, the break
        `release-on-journal-loss`); drawn at random, most losses fell on nodes holding nothing (3 gateways,
        seeds 1-10: a break caught in 7). So, `AIM_AT_HOLDS` of the time, a loss scheduled on a node that holds
        no booking moves to one that does now, picked by the run's own aim Random (the other draws stay)."""
        if self._aim.random() >= AIM_AT_HOLDS:
            return f
        cp = self.pair.cp
        if cp is None or not self.pair.cp_up.is_set():
            return f
        try:
            async with cp.store.transaction(write=False) as tx:
                rows = await cap_sql.live_bookings(tx)
        except StoreError:  # the store is out: the loss strikes where it was drawn
            return f
        holding = sorted({str(r["node_id"]) for r in rows if str(r["state"]) == "active"})
        if not holding or f.targets[0] in holding:
            return f
        return replace(f, targets=(holding[self._aim.randrange(len(holding))],))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self._errors.append((task.get_name(), error))

    def _moment(self, what: str, node_id: str, command_id: str, kind: str) -> None:
        """A command was accepted or started on `node_id`: maybe strike there (`bc.sim.strikes`). The part of
        a strike that must happen before the agent's next step (its connections reset, so the ACK does not
        leave on them) happens here, synchronously; the rest runs as its own task."""
        if not self.striking or node_id in self._struck:
            return
        k = KINDS.get(kind)
        s = self.strikes.at(
            what, node_id, command_id, once_only=k is not None and not (k.retry_safe or k.self_terminating)
        )
        if s is None:
            return
        target = node_id
        frame = self.recorder.accepted_frame if what == strikes.ACCEPT else None
        if s.kind == strikes.DUPLICATE_AFTER_ACCEPT and frame is None:
            return  # not seen on the way in (never, for a command the gateway sent): nothing to send again
        if s.kind == strikes.GATEWAY_KILL_AT_ACCEPT:
            index = self._killable_gateway_of(node_id)
            if index is None:
                return
            target = address(index)
        self._struck.add(target)
        self.faults[s.kind] += 1
        at_s = round(asyncio.get_running_loop().time() - self.t0, 3)
        data: dict[str, object] = {"kind": s.kind, "t_s": at_s, "command_id": command_id, **s.params}
        if target != node_id:
            data["node_id"] = node_id
        self._unpublished.append(("sim.fault", target, data))
        try:
            if s.kind == strikes.DUPLICATE_AFTER_ACCEPT:
                self.network.deliver_again(node_id, frame, float(s.params["after_s"]))
            if s.kind in (strikes.CUT_AT_ACCEPT, strikes.CRASH_AT_ACCEPT):
                self.recorder.away(node_id, "reset")
                self.network.reset(node_id)
                self.recorder.back(node_id, "reset")
        except Exception as e:  # runs inside the agent's accept: the harness's bug must not pass for the agent's
            self._errors.append((f"strike-{s.kind}", e))
            return
        self._spawn(self._strike(s, target), f"strike-{s.kind}")

    def _killable_gateway_of(self, node_id: str) -> int | None:
        """The gateway holding the node's session, if killing it leaves another gateway up and nothing else
        is striking it."""
        gws = self.pair.gateways
        if gws is None or sum(1 for p in gws.procs if p.up) < 2:
            return None
        for p in gws.procs:
            if p.up and address(p.index) not in self._struck and node_id in gws.nodes_on(p.index):
                return p.index
        return None

    async def _strike(self, s: Strike, target: str) -> None:
        try:
            await self.publish_pending()
            if s.kind in (strikes.CRASH_AT_ACCEPT, strikes.CRASH_WHILE_RUNNING):
                await self.pair.restart_agent(s.node_id, float(s.params["restart_s"]))
            elif s.kind == strikes.POWER_LOSS_WHILE_RUNNING:
                await self._power_cycle(s.node_id, float(s.params["down_s"]))
            elif s.kind == strikes.GATEWAY_KILL_AT_ACCEPT:
                await self._kill_gateway(self._gateway_index(target), float(s.params["down_s"]))
        finally:
            self._struck.discard(target)

    async def _power_cycle(self, node_id: str, down_s: float) -> None:
        """The machine loses power: its agent dies where it is, its journal keeps what it made durable (the
        production journal fsyncs every write: all of it), and it boots anew after `down_s`."""
        rec = self.recorder
        rec.away(node_id, "reboot")
        await self.pair.crash_agent(node_id)
        if self.seams.power_loss is not None:
            await self.pair.power_loss(node_id, self.seams.power_loss)
        await self.pair.restart_agent(node_id, down_s, reboot=True)
        rec.back(node_id, "reboot")

    async def _publish_fault(self, fault: Fault, at_s: float) -> None:
        data: dict[str, object] = {"kind": fault.kind, "t_s": round(at_s, 3), **fault.params}
        if len(fault.targets) == 1:
            subject = fault.targets[0]
        elif fault.targets:
            subject, data["targets"] = "fleet", list(fault.targets)
        else:
            subject = "control-plane"
        self._unpublished.append(("sim.fault", subject, data))
        await self.publish_pending()

    def _gateway_event(self, addr: str, state: str, data: dict[str, object]) -> None:
        """A gateway process started or fenced itself: a `sim.gateway` event (subject its address), written
        as soon as the store takes it, with its own simulated second."""
        t_s = round(asyncio.get_running_loop().time() - self.t0, 3) if self.t0 else 0.0
        self._unpublished.append(("sim.gateway", addr, {"state": state, "t_s": t_s, **data}))
        if self.t0:  # at the start, the first fault's write takes them along
            self._spawn(self.publish_pending(), "sim.gateway")

    async def publish_pending(self) -> None:
        """Every event not yet in the events log, if the control plane is up (else when it is back)."""
        cp = self.pair.cp
        if cp is None or not self.pair.cp_up.is_set() or not self._unpublished:
            return  # down or going down: when it is back
        pending, self._unpublished = self._unpublished, []
        try:
            now_ms = await cp.store.now_ms()
            async with cp.store.transaction() as tx:
                for type_, subject, data in pending:
                    await publish(tx, cp.bus, type_, subject, data, now_ms)
        except StoreError:  # the store went away under the write: they go in once it is back
            self._unpublished = pending + self._unpublished

    async def _inject(self, f: Fault) -> None:
        pair, net, rec = self.pair, self.network, self.recorder
        p = f.params
        if f.kind == chaos.AGENT_CRASH:
            await pair.restart_agent(f.targets[0], float(p.get("restart_s", chaos.RESTART_S)))
        elif f.kind == chaos.NODE_REBOOT:
            await self._power_cycle(f.targets[0], float(p["down_s"]))
        elif f.kind == chaos.JOURNAL_LOSS:
            await self._lose_journal(f.targets[0], float(p.get("restart_s", chaos.RESTART_S)))
        elif f.kind == chaos.PARTITION:
            direction = DIRECTIONS[str(p.get("direction", "both"))]
            for n in f.targets:
                rec.away(n, "partition")
            net.partition(f.targets, direction)
            await asyncio.sleep(float(p["duration_s"]))
            net.heal(f.targets)
            for n in f.targets:
                rec.back(n, "partition")
        elif f.kind == chaos.HALF_OPEN:
            rec.away(f.targets[0], "half-open")
            net.half_open(f.targets[0])
            rec.back(f.targets[0], "half-open")  # over when the node notices and its next Hello arrives
        elif f.kind == chaos.RESET:
            rec.away(f.targets[0], "reset")
            net.reset(f.targets[0])
            rec.back(f.targets[0], "reset")
        elif f.kind == chaos.STALL:
            rec.away(f.targets[0], "stall")
            net.stall(f.targets[0], float(p["duration_s"]))
            await asyncio.sleep(float(p["duration_s"]))
            rec.back(f.targets[0], "stall")
        elif f.kind == chaos.SPEC_REPLAY:
            self._replay_spec(f.targets[0])
        elif f.kind == chaos.NODE_CLOCK_SKEW:
            pair.nodes[f.targets[0]].clock.step(float(p["offset_s"]))
        elif f.kind == chaos.CP_CLOCK_SKEW:
            self._skew_control_plane(float(p["offset_s"]))
        elif f.kind == chaos.CP_RESTART:
            await self._restart_control_plane(float(p["down_s"]))
        elif f.kind == chaos.GATEWAY_KILL:
            await self._kill_gateway(self._gateway_index(f.targets[0]), float(p["down_s"]))
        elif f.kind == chaos.GATEWAY_STALL:
            await self._stall_gateway(self._gateway_index(f.targets[0]), float(p["duration_s"]))
        elif f.kind == chaos.STORE_OUTAGE:
            await self._store_outage(float(p["duration_s"]))
        elif f.kind in storms.KINDS:
            await self.gpu_faults.inject(f)
        else:
            raise ValueError(f"no injector for fault kind {f.kind!r}")

    def _replay_spec(self, target: str) -> None:
        """Send a node a spec older than the one it applies, on its live session: the target, else the next
        node in order that has one (most nodes hold one generation for long stretches). The node it reached
        and the generation are a `sim.spec-replay` event, so a trace of that node shows it."""
        nodes = self.pair.node_ids()
        i = nodes.index(target)
        for node_id in nodes[i:] + nodes[:i]:
            frame = self.recorder.stale_spec(node_id)
            if frame is not None and self.network.replay(node_id, frame):
                body = session_pb2.DesiredStateBody.FromString(frame.desired_state.envelope.body)
                t_s = round(asyncio.get_running_loop().time() - self.t0, 3)
                data: dict[str, object] = {"generation": body.generation, "target": target, "t_s": t_s}
                self._unpublished.append(("sim.spec-replay", node_id, data))
                self._spawn(self.publish_pending(), "sim.spec-replay")
                return

    def _skew_control_plane(self, offset_s: float) -> None:
        """The control plane's clock `offset_s` off the store's (absolute, so skews never add up)."""
        base = self.pair.clock.wall_offset
        assert base is not None
        self.pair.cp_clock.wall_offset = base + offset_s

    async def _lose_journal(self, node_id: str, down_s: float) -> None:
        pair = self.pair
        old = pair.nodes[node_id].journal
        old_id, in_flight = "", []
        if old is not None:
            old_id = old.journal_id
            in_flight = [e.command_id for e in await old.commands() if e.state in ("accepted", "running")]
        t = self._now_ms()
        await pair.restart_agent(node_id, down_s, lose_journal=True)
        new_id = await pair.open_journal_id(node_id)
        self.facts.journal_loss(t, node_id, old_id, new_id, in_flight)

    def _gateway_index(self, addr: str) -> int:
        gws = self.pair.gateways
        assert gws is not None, "a gateway fault in a one-gateway run"
        return next(p.index for p in gws.procs if p.addr == addr)

    async def _kill_gateway(self, index: int, down_s: float) -> None:
        """The gateway process dies; its nodes are away until their next Hello; a new one starts after `down_s`."""
        gws = self.pair.gateways
        assert gws is not None
        if not gws.procs[index].up:  # a strike and the schedule drew the same gateway: the first one's restart
            return
        for n in gws.nodes_on(index):
            self.recorder.away(n, "gateway")
        for n in await gws.kill(index) or ():
            self.recorder.back(n, "gateway")
        await asyncio.sleep(down_s)
        await gws.start(index)

    async def _stall_gateway(self, index: int, seconds: float) -> None:
        """The gateway process freezes for `seconds`; the nodes it held are away until their next Hello."""
        gws = self.pair.gateways
        assert gws is not None
        held = gws.nodes_on(index)
        for n in held:
            self.recorder.away(n, "gateway-stall")
        await gws.stall(index, seconds)
        for n in held:
            self.recorder.back(n, "gateway-stall")

    async def _store_outage(self, seconds: float) -> None:
        """Every transaction of every process fails for `seconds`; every node is away until its next Hello."""
        store = self.pair.shared_store
        assert store is not None, "a store outage in a one-gateway run"
        self.facts.outage_began(self._now_ms(), None, "store")
        for n in self.node_ids:
            self.recorder.away(n, "store")
        store.out = True
        try:
            await asyncio.sleep(seconds)
        finally:
            store.out = False
        self.facts.outage_ended(self._now_ms(), None, "store")
        for n in self.node_ids:
            self.recorder.back(n, "store")
        await self.publish_pending()

    async def _restart_control_plane(self, down_s: float) -> None:
        t = self._now_ms()
        self.facts.outage_began(t, None, "control-plane")
        for n in self.node_ids:
            self.recorder.away(n, "control-plane")
        await self.pair.restart_control_plane(down_s)
        self.facts.outage_ended(self._now_ms(), None, "control-plane")
        for n in self.node_ids:
            self.recorder.back(n, "control-plane")
        await self.publish_pending()

    # -- the end ------------------------------------------------------------------------------

    async def heal_everything(self) -> None:
        """The quiet period's start: faults in progress finish, partitions heal, every agent runs, the
        control plane's clock is back on the store's."""
        self.striking = False
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._errors:  # an injector that failed is the simulator's bug: say so rather than check a skewed run
            name, first = self._errors[0]
            raise RuntimeError(f"{len(self._errors)} fault injection(s) failed, first: {name}: {first!r}") from first
        self.network.heal()
        for n in self.node_ids:
            self.recorder.back(n, "partition")
        self._skew_control_plane(0.0)
        for n in self.node_ids:
            task = self.pair.tasks.get(n)
            if task is None or task.done():
                self.pair.start_agent(n)
        await self.publish_pending()

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pair.stop()


async def run(cfg: SimConfig, *, workload: Workload | None = None, progress: Progress | None = None) -> SimResult:
    """One simulated run on the running (virtual-time) loop; see the module docstring. `wall_seconds` is 0
    here: nothing in the run reads the host's clock (`run_sync` measures it around the loop)."""
    with _scratch_dir() as root:
        return await _run_in(cfg, root, workload, progress)


async def _run_in(cfg: SimConfig, root: Path, workload: Workload | None, progress: Progress | None) -> SimResult:
    return await run_fleet(Fleet(cfg, root), workload=workload, progress=progress)


async def run_fleet(fleet: Fleet, *, workload: Workload | None = None, progress: Progress | None = None) -> SimResult:
    """`run` of a fleet already built (a test may set its `schedule` first)."""
    cfg = fleet.cfg
    loop = asyncio.get_running_loop()
    await fleet.pair.start()
    if cfg.health:
        await fleet.set_health_policy()
    t0 = fleet.t0 = loop.time()
    await fleet.publish_pending()  # the gateway processes' starts (with one gateway, nothing)
    fleet.striking = True
    tasks = [asyncio.create_task(fleet.run_chaos(t0), name="chaos")]
    if workload is not None:
        tasks.append(asyncio.create_task(_drive(workload, fleet), name="workload"))
    vms: sim_instances.InstanceWork | None = None
    if cfg.instances:
        dirs = {n: fleet.pair.nodes[n].dir for n in fleet.node_ids}
        vms = sim_instances.InstanceWork(fleet, cfg.seed, dirs, fleet._now_ms)
        tasks.append(asyncio.create_task(vms.run(), name="instances"))
    # The reporter runs whether anyone listens or not: its store read once a simulated minute is part of the
    # schedule, so a run with no listener (a test's run_sync, `python -m bc.sim.fleet`) is `bc sim --seed`'s
    # run event for event. Without it, the same seed wrote two different event logs.
    tasks.append(asyncio.create_task(_report(fleet, t0, progress or _unwatched), name="progress"))
    try:
        await asyncio.sleep(cfg.duration_s)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await fleet.heal_everything()
        await asyncio.sleep(cfg.quiet_s)
        store = fleet.pair.store
        fleet.facts.quiet = await quiet_snapshot(store)
        events = await fleet.pair.events()
        await from_store(fleet.facts, fleet.recorder, store, events)
        if cfg.health:
            await health_from_store(fleet.facts, store, events, fleet.operator_released)
        if vms is not None:
            vms.sample_all()
            fleet.facts.gpu_uses = vms.samples
    finally:
        await fleet.stop()
    if cfg.trace is not None:
        cfg.trace.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    checked = check_all(fleet.facts, i7=True)
    return SimResult(
        digest=events_digest(events),
        events=len(events),
        faults=fleet.faults,
        work=fleet.work,
        invariants=checked,
        sim_seconds=loop.time() - t0,
        wall_seconds=0.0,
        repro=cfg.repro(),
        link_faults=Counter(fleet.network.stats),
        facts=fleet.facts,
        gateways=cfg.gateways,
        gateway_fences=len(fleet.pair.gateways.fences) if fleet.pair.gateways is not None else 0,
        traces={i.id: trace(events, i.entities, i.at_ms) for i in checked if not i.ok},
    )


async def _drive(workload: Workload, fleet: Fleet) -> None:
    await workload(fleet)


async def _report(fleet: Fleet, t0: float, progress: Progress) -> None:
    loop = asyncio.get_running_loop()
    events = 0
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        cp = fleet.pair.cp
        if cp is not None and fleet.pair.cp_up.is_set():  # while it is down, the count it last had
            with contextlib.suppress(StoreError):  # and while the store is out
                async with cp.store.transaction(write=False) as tx:
                    events = await events_sql.last_seq(tx)
        progress(loop.time() - t0, events, sum(fleet.faults.values()))


def run_sync(cfg: SimConfig, *, workload: Workload | None = None, progress: Progress | None = None) -> SimResult:
    """`run` on a fresh `bc.seams.virtual_time` loop, with the wall time it took."""
    host = LoopClock()  # outside any loop it reads the host's monotonic clock: the one wall reading here
    w0 = host.monotonic()
    result = run_virtual(run(cfg, workload=workload, progress=progress))
    return replace(result, wall_seconds=host.monotonic() - w0)


def workload_for(cfg: SimConfig) -> Workload:
    """The standard workload of a run: `bc.sim.workload`'s mix, its own Random seeded from the run's seed as
    `bc sim` seeds it (a string seed hashes the same in every process), so this module's runs and `bc sim`'s
    write the same events log for one seed."""
    return make_workload(random.Random(f"bc-sim-workload:{cfg.seed}"))


def _unwatched(sim_s: float, events: int, faults: int) -> None:
    """A run nobody watches reports its progress to no one (the reporter still runs: see `run_fleet`)."""


def repro_at(cfg: SimConfig, seed: int) -> str:
    """The command that replays `cfg` at `seed`."""
    return replace(cfg, seed=seed).repro()


def seed_outcome(cfg: SimConfig, seed: int) -> SeedOutcome:
    """One seed of a sweep (`bc.sim.sweep`): `cfg` at `seed` with the standard workload, as `bc sim --seed`
    runs it; what the run raises is the harness's error, said in one line with the seed that replays it."""
    one = replace(cfg, seed=seed, trace=None)
    try:
        result = run_sync(one, workload=workload_for(one))
    except Exception as e:
        return SeedOutcome(seed=seed, repro=one.repro(), harness_error=one_line(f"{type(e).__name__}: {e}")[:300])
    failed = [i for i in result.invariants if not i.ok]
    return SeedOutcome(
        seed=seed,
        repro=one.repro(),
        failed=tuple(i.id for i in failed),
        first_failure=one_line(failed[0].counterexample or "")[:300] if failed else "",
        digest=result.digest,
        wall_seconds=result.wall_seconds,
        sim_seconds=result.sim_seconds,
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m bc.sim.fleet`: one run with the standard workload, its digest and invariants printed (what
    the tests run in a subprocess; `bc sim` is the operator's command)."""
    p = argparse.ArgumentParser(prog="python -m bc.sim.fleet")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--chaos", choices=chaos.LEVELS, default="heavy")
    p.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    p.add_argument("--gateways", type=int, default=1)
    p.add_argument("--journal-files", action="store_true")
    p.add_argument("--break", dest="break_rule")
    p.add_argument("--health", action="store_true")
    p.add_argument("--instances", action="store_true")
    p.add_argument("--no-workload", action="store_true")
    p.add_argument("--trace", type=Path)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    cfg = SimConfig(
        nodes=args.nodes,
        seed=args.seed,
        chaos=args.chaos,
        duration_s=args.duration,
        gateways=args.gateways,
        journal_files=args.journal_files,
        break_rule=args.break_rule,
        health=args.health,
        instances=args.instances,
        trace=args.trace,
    )
    result = run_sync(cfg, workload=None if args.no_workload else workload_for(cfg))
    out = {
        "digest": result.digest,
        "events": result.events,
        "faults": dict(sorted(result.faults.items())),
        "work": dict(sorted(result.work.items())),
        "invariants": [{"id": r.id, "ok": r.ok, "counterexample": r.counterexample} for r in result.invariants],
        "gateway_fences": result.gateway_fences,
        "sim_seconds": result.sim_seconds,
        "wall_seconds": round(result.wall_seconds, 1),
        "repro": result.repro,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
