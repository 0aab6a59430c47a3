"""`SessionPair`: the production control plane, gateway and agents in one process, on in-memory links.

What runs is the code `bc serve` and `bc node` run: the store (the inline
SQLite driver, so nothing leaves the loop's thread), the Signer and the trust
bundle, the gateway's session drivers, liveness, the command sweeper, and for
each node a whole `Agent` with fake GPUs, the memory journal and inline
offload. Only the transport differs: each dial is one connection of the one
in-memory network (`bc.seams.network.SimNetwork`, fault-free unless the caller
passes one with faults), which can partition a node (every frame in both
directions is lost and new dials are refused) and heal it.

Everything is drawn from one seed: the control plane's Random and Secrets
(ids, certificate serials, keys, token secrets), each agent's Random, the
fake hardware. On `bc.seams.virtual_time`'s loop a run is a function of its seed,
so two runs write the same events log byte for byte; `python -m
bc.sim.pair --seed 7` prints that log's digest.

The control plane is built and started by `bc.assembly`, as `bc serve`'s is: the worker role's loops
(liveness, the sweeper, the job queue, the placement pass, …) and the gateway's; with `reboot_s`
each fake reboot takes that long on the loop's clock and is recorded (`SessionPair.reboots`) instead
of re-executing the process (`bench.jobs` rolls a reboot over the pair).

Each node's machine outlives its agent process (`PairNode`: identity, key, fake hardware, its own
clock, its journal), so a node can crash and come back (`crash_agent`, `start_agent`, `restart_agent`),
reboot (a new boot id) or lose its journal, as `bc.sim.fleet`'s chaos does. With `journal_files` each agent keeps
the real SQLite journal in its data dir (driven inline, `bc.sim.file_journal`), else the memory journal.

Restarting the control plane (`restart_control_plane`) drains the gateway,
closes the store and opens it again with a new gateway id and a Random drawn
from the pair's (never the first seed again: it would draw the same serials
and token ids on the same install).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import random
import tempfile
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.app import Agent, AgentOptions, AgentParts
from agent.hw import HardwareBackend, InProcessReboot, open_backend
from agent.hw.fake import boot_anew
from agent.identity import HeldIdentity, Identity
from agent.journal_api import AgentJournal, new_journal_id
from agent.memory_journal import MemoryJournal
from agent.node_key import NodeKey
from agent.offload import inline
from bc.assembly.control import ControlFactories, ControlSettings, build_control
from bc.assembly.loops import GATEWAY, SIGNING_KEYS, WORKER, start_loops
from bc.assembly.retry import retry_start
from bc.assembly.supervisor import Supervisor
from bc.control.base.bus import Bus
from bc.control.quorum import approvers
from bc.control.signing.signer import KeySigner, NullSigner, Signer
from bc.control.trust import identity
from bc.control.trust import intent as intent_ctl
from bc.control.trust.intent import Intent
from bc.pki import quorum as q
from bc.pki import tokens as pki_tokens
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import make_csr, peer_identity
from bc.pki.secrets_source import SeededSecrets, p256_key
from bc.pki.signing import SigningKeys
from bc.seams.clock import LoopClock
from bc.seams.network import SimNetwork
from bc.seams.virtual_time import WALL_START, virtual_clock
from bc.seams.virtual_time import run as run_virtual
from bc.store import Store, StoreError
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore

log = logging.getLogger("bc.sim.pair")


@dataclass(frozen=True)
class PairConfig:
    heartbeat_interval_s: float = 10.0
    lease_ttl_s: float = 40.0
    unreachable_grace_s: float = 120.0
    profile: str = "hgx-h100-8"
    signing: bool = True
    reboot_s: float | None = None
    """A fake reboot takes this long (on the loop's clock) and then calls the pair's hook, which records
    it (`SessionPair.reboots`); None: the fake hardware as it is (a reboot re-executes the process)."""
    wall_start: float = WALL_START
    """The wall clock's reading at the start (the store's `compute_now()` and every process's `now()`)."""
    reboot_restarts: bool = False
    """A fake reboot (the `node.reboot` command) restarts the node's agent in place after `reboot_s` (0 when
    None), on its new boot id, as a machine coming back would; else only the hook above runs."""
    journal_files: bool = False
    """Agents keep the real SQLite journal (`journal.db` in the node's dir) instead of the memory journal."""
    gateway: bool = True
    """The control plane serves node sessions with a gateway of its own, as `bc serve` with every role does;
    False: it runs the worker roles only (the simulator's gateways are then processes of their own,
    `bc.sim.gateways`), and no dial reaches it."""


ControlSeams = ControlFactories
"""The classes the control plane is built from (`bc.assembly.control.ControlFactories`)."""


def control_plane_plan(cfg: PairConfig, *, signing: bool) -> tuple[frozenset[str], frozenset[str]]:
    """The roles and what-it-has the harness's control plane passes to `start_loops` (`bc.assembly.loops`):
    `bc serve`'s worker role, with its gateway's unless the simulator runs gateway processes of its own."""
    roles = frozenset({GATEWAY, WORKER}) if cfg.gateway else frozenset({WORKER})
    return roles, frozenset({SIGNING_KEYS}) if signing else frozenset()


class ControlPlane:
    """The control plane's workers and one gateway over a store, built and started as `bc serve` builds and
    starts its own (`bc.assembly`), minus gRPC: the roles `worker` and, with `PairConfig.gateway`, `gateway`."""

    def __init__(
        self,
        store: Store,
        signer: Signer,
        intent: Intent,
        clock: LoopClock,
        rng: random.Random,
        cfg: PairConfig,
        seams: ControlFactories | None = None,
        quorum_count: q.CountApprovals = q.count_approvals,
    ) -> None:
        self.store, self.signer, self.intent, self.clock, self.rng, self.cfg = store, signer, intent, clock, rng, cfg
        self.quorum_count = quorum_count
        """The batch quorum's count the Admin API's decisions use here (`batches.decide(count=...)`): the workload
        calls the library as the servicer does, and passes this where the servicer leaves the default."""
        self.bus = Bus()
        self.gateway_id = f"gw-sim-{rng.getrandbits(24):06x}"
        self.parts = build_control(
            store,
            self.bus,
            clock,
            rng,
            signer,
            intent,
            gateway_id=self.gateway_id,
            worker_id=self.gateway_id,
            settings=ControlSettings(cfg.heartbeat_interval_s, cfg.lease_ttl_s, cfg.unreachable_grace_s),
            factories=seams,
        )
        assert self.parts.gateway is not None and self.parts.liveness is not None and self.parts.sweeper is not None
        assert self.parts.jobs is not None and self.parts.placement is not None
        self.gateway, self.liveness, self.sweeper = self.parts.gateway, self.parts.liveness, self.parts.sweeper
        self.jobs, self.placement = self.parts.jobs, self.parts.placement
        self.roles, self.has = control_plane_plan(cfg, signing=signer.keys is not None)
        self._supervisor_rng = random.Random(rng.getrandbits(64))
        self.supervisor: Supervisor | None = None
        self.loops: list[str] = []

    async def start(self) -> None:
        if GATEWAY in self.roles:  # as bc serve's start: a store away now is waited for (bc.assembly.retry)
            await retry_start(
                self.gateway.renew_lease,
                what="gateway-lease-renewal",
                clock=self.clock,
                rng=self._supervisor_rng,
                process="control-plane",
            )
        self.supervisor = Supervisor(self.clock, self._supervisor_rng, process="control-plane")
        self.loops = start_loops(self.supervisor, self.roles, self.has, self.parts)

    async def stop(self) -> None:
        if self.supervisor is not None:
            await self.supervisor.stop()
        if GATEWAY not in self.roles:
            return
        async with asyncio.timeout(30):
            await self.gateway.drain()
        # In a store outage the lease is not handed back: it runs out, and the next control plane waits for
        # that (as `bc serve`'s stop does). A restart falling in an outage must not end the run.
        with contextlib.suppress(StoreError):
            await self.gateway.release_lease()


@dataclass
class PairNode:
    """One simulated machine: what outlives its agent process (identity, key, disk, clock, journal)."""

    node_id: str
    dir: Path
    identity: Identity
    identity_store: HeldIdentity
    key: NodeKey
    rng: random.Random
    clock: LoopClock
    """The node's own wall clock on the loop (the pair's, shifted): clock skew steps it."""
    hw: HardwareBackend
    journal: AgentJournal | None = None
    """The open journal while an agent runs on it; a memory journal stays here across restarts."""


class SessionPair:
    """A control plane, a gateway and N agents over in-memory links; see the module docstring."""

    def __init__(
        self,
        root: Path,
        *,
        seed: int,
        agents: int,
        cfg: PairConfig | None = None,
        network: SimNetwork | None = None,
    ) -> None:
        self.root, self.seed, self.n, self.cfg = root, seed, agents, cfg or PairConfig()
        self.rng = random.Random(seed)
        self.secrets = SeededSecrets(self.rng.getrandbits(64))
        self.clock = virtual_clock(self.cfg.wall_start)
        self.cp_clock = self.clock.shifted(0.0)
        """The control plane's processes' clock; the store keeps `clock` (it is `compute_now()`)."""
        # Fault-free by default: nothing is drawn from its Random, so the pair's own draws stay as they were.
        self.network = network if network is not None else SimNetwork(random.Random(f"bc-pair-links:{seed}"))
        self.agents: dict[str, Agent] = {}
        self.nodes: dict[str, PairNode] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.cp: ControlPlane | None = None
        self.cp_up = asyncio.Event()
        self.reboots: list[tuple[str, float]] = []  # (node, loop time) of each fake reboot, with `reboot_s`
        # The back-off of a control plane starting in a store outage; seeded apart, so the pair's own stream
        # (ids, serials, keys) is the same whether a start had to wait or not.
        self._retry_rng = random.Random(f"bc-pair-start:{seed}")
        self._background: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> Store:
        assert self.cp is not None, "the control plane is down"
        return self.cp.store

    # -- the control plane ---------------------------------------------------------

    def _make_store(self) -> Store:
        return InlineSqliteStore(self.root / "bc.db", self.clock)

    async def _open_store(self) -> Store:
        """The store a control plane starting now opens (`_close_store` closes it when it stops)."""
        store = self._make_store()
        await store.open()
        return store

    async def _close_store(self, store: Store) -> None:
        await store.close()

    async def process_intent(self, store: Store, signer: Signer) -> Intent:
        """What a control-plane process starting now holds of the trust state: the CA, the signer's key
        registered, the quorum as stored."""
        intent = Intent(signer, self.ca.ca_pem)
        await intent_ctl.register(store, signer)
        intent.set_quorum(*await approvers.trust_state(store))
        return intent

    def process_signer(self) -> Signer:
        return KeySigner(self.signing_keys) if self.signing_keys is not None else NullSigner()

    def _make_control_plane(self, store: Store, signer: Signer, intent: Intent, rng: random.Random) -> ControlPlane:
        return ControlPlane(store, signer, intent, self.cp_clock, rng, self.cfg)

    async def _open_control_plane(self) -> ControlPlane:
        store = await self._open_store()
        signer = self.process_signer()
        # A restart that falls in a store outage waits for the store, as bc serve's start does (bc.assembly.retry).
        intent = await retry_start(
            lambda: self.process_intent(store, signer),
            what="intent",
            clock=self.cp_clock,
            rng=self._retry_rng,
            process="control-plane",
        )
        cp = self._make_control_plane(store, signer, intent, random.Random(self.rng.getrandbits(64)))
        await cp.start()
        self.network.gateway = cp.gateway
        return cp

    async def restart_control_plane(self, down_s: float = 0.0) -> None:
        """Stop the gateway and the workers, close the store, stay down `down_s`, open everything again."""
        assert self.cp is not None
        self.cp_up.clear()
        self.network.gateway = None
        await self.cp.stop()
        await self._close_store(self.cp.store)
        self.cp = None
        if down_s:
            await asyncio.sleep(down_s)
        self.cp = await self._open_control_plane()
        self.cp_up.set()

    # -- nodes -----------------------------------------------------------------------

    async def _enroll(self, node_id: str) -> PairNode:
        """Join as `bc join` does on the server's side (token, CSR, certificate): the machine the agent runs on."""
        cp = self.cp
        assert cp is not None
        tok = await identity.create_token(
            cp.store, cp.bus, self.ca, self.clock, node_id, "node", 3600, rng=cp.rng, secrets=self.secrets
        )
        key = p256_key(self.secrets)
        csr = make_csr(key, node_id).public_bytes(serialization.Encoding.DER)
        proof = pki_tokens.join_proof(pki_tokens.parse_token(tok.token).secret, tok.token_id, csr)
        joined = await identity.join(
            cp.store, cp.bus, cp.signer, self.ca, tok.token_id, csr, f"host-{node_id}", proof=proof
        )
        cert = x509.load_pem_x509_certificate(joined.cert_pem)
        self.network.peers[node_id] = peer_identity(cert, self.ca.certificate, now=self.clock.now())
        ident = Identity(
            node_id=node_id,
            role=joined.role,
            server="memory",
            identity_generation=joined.identity_generation,
            ca_fingerprint=self.ca.fingerprint,
        )
        ident.set_trust_bundle(cp.intent.trust_bundle())
        rng = random.Random(self.rng.getrandbits(64))
        node_dir = self.root / f"node-{node_id}"
        node_dir.mkdir(parents=True, exist_ok=True)
        clock = self.clock.shifted(0.0)
        hw = self._hardware(node_id, node_dir, rng)
        return PairNode(node_id, node_dir, ident, HeldIdentity(), NodeKey(None, key), rng, clock, hw)

    def _build_agent(self, node: PairNode) -> Agent:
        """A new agent process on the node's machine (a new incarnation id, the journal it left)."""
        parts = AgentParts(
            clock=node.clock,
            rng=node.rng,
            identity=node.identity,
            ca_pem=self.ca.ca_pem,
            identity_store=node.identity_store,
            node_key=node.key,
            hw=node.hw,
            dial=self.network.dialer(node.node_id),
            open_journal=lambda: self._open_journal(node),
            offload=inline,
            renewal=False,
        )
        return Agent(AgentOptions(data_dir=node.dir, heartbeat_interval_s=self.cfg.heartbeat_interval_s), parts)

    async def _open_journal(self, node: PairNode) -> AgentJournal:
        """The journal the node left: the memory journal kept on the machine, or the file reopened."""
        if self.cfg.journal_files:
            from bc.sim.file_journal import open_inline  # the sim package imports this module

            node.journal = await open_inline(node.dir / "journal.db", node.node_id, node.rng)
        elif node.journal is None:
            node.journal = MemoryJournal(new_journal_id(node.rng))
        return node.journal

    def _hardware(self, node_id: str, node_dir: Path, rng: random.Random) -> HardwareBackend:
        """The node's fake GPUs, made where `bc node --fake-hw` makes its own (`agent.hw.open_backend`)."""
        reboot: InProcessReboot | None = None
        if self.cfg.reboot_s is not None or self.cfg.reboot_restarts:

            def hook() -> None:
                self.reboots.append((node_id, asyncio.get_running_loop().time()))
                if self.cfg.reboot_restarts:
                    # The machine goes down under the agent that asked (its task is cancelled by the restart).
                    self._spawn(self._come_back(node_id, self.cfg.reboot_s or 0.0), f"reboot-{node_id}")

            # Restarting in place: the reboot itself is instant and the restart stays down `reboot_s`.
            takes_s = 0.0 if self.cfg.reboot_restarts else self.cfg.reboot_s or 0.0
            reboot = InProcessReboot(hook, takes_s=takes_s, hang=self.cfg.reboot_restarts)
        return open_backend(self.cfg.profile, node_id, node_dir, rng=rng, offload=inline, reboot=reboot)

    async def _come_back(self, node_id: str, down_s: float) -> None:
        await self.restart_agent(node_id, down_s)  # the fake hardware already wrote the new boot id

    def _spawn(self, coro: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def node_ids(self) -> list[str]:
        return [f"n{i:03d}" for i in range(self.n)]

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        pki = self.root / "pki"
        self.ca = CertificateAuthority.create(self.clock, self.rng, self.secrets)
        self.signing_keys = SigningKeys.create(pki, self.clock, self.rng, self.secrets) if self.cfg.signing else None
        self.cp = await self._open_control_plane()
        self.cp_up.set()
        for node_id in self.node_ids():
            self.nodes[node_id] = await self._enroll(node_id)
            self.agents[node_id] = self._build_agent(self.nodes[node_id])
        for node_id, agent in self.agents.items():
            self.tasks[node_id] = asyncio.create_task(agent.run(), name=f"agent-{node_id}")

    def start_agent(self, node_id: str) -> Agent:
        """A new agent process on the node (after a crash or a reboot); the node must have none running."""
        running = self.tasks.get(node_id)
        assert running is None or running.done(), f"{node_id} already runs an agent"
        agent = self.agents[node_id] = self._build_agent(self.nodes[node_id])
        self.tasks[node_id] = asyncio.create_task(agent.run(), name=f"agent-{node_id}")
        return agent

    async def crash_agent(self, node_id: str) -> None:
        """The agent process dies: its tasks end where they are (no graceful stop); the machine stays."""
        task = self.tasks.get(node_id)
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        node = self.nodes[node_id]
        if self.cfg.journal_files:
            node.journal = None  # the process's connection is gone with it; the file stays

    async def restart_agent(
        self, node_id: str, down_s: float = 0.0, *, reboot: bool = False, lose_journal: bool = False
    ) -> Agent:
        """Crash the agent, stay down `down_s`, start it again; `reboot`: the machine boots anew (a new boot
        id, runtime state gone); `lose_journal`: it comes back on a fresh journal."""
        await self.crash_agent(node_id)
        node = self.nodes[node_id]
        if reboot:
            boot_anew(node.dir, str(uuid.UUID(int=node.rng.getrandbits(128), version=4)))
        if lose_journal:
            node.journal = None
            for suffix in ("", "-wal", "-shm"):
                (node.dir / f"journal.db{suffix}").unlink(missing_ok=True)
        if down_s:
            await asyncio.sleep(down_s)
            await self.crash_agent(node_id)  # another restart may have started one meanwhile: this one wins
        return self.start_agent(node_id)

    async def stop(self) -> None:
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for agent in self.agents.values():
            agent.stopped.set()
        async with asyncio.timeout(60):
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        if self.cp is not None:
            self.network.gateway = None
            await self.cp.stop()
            await self._close_store(self.cp.store)
            self.cp = None
            self.cp_up.clear()
        for t in list(self.network.sessions):
            t.cancel()
        await asyncio.gather(*self.network.sessions, return_exceptions=True)

    # -- faults ----------------------------------------------------------------------

    def partition(self, node_ids: list[str]) -> None:
        self.network.partition(node_ids)

    def heal(self, node_ids: list[str] | None = None) -> None:
        self.network.heal(node_ids)

    # -- what happened -------------------------------------------------------------------

    async def events(self) -> list[tuple[int, str, str, str, int]]:
        out: list[tuple[int, str, str, str, int]] = []
        async with self.store.transaction(write=False) as tx:
            while rows := await events_sql.list_events(tx, out[-1][0] if out else 0, 10_000):
                out += [
                    (int(r["seq"]), str(r["type"]), str(r["subject"]), str(r["data"]), int(r["at_ms"])) for r in rows
                ]
        return out

    async def connectivity(self) -> dict[str, str]:
        async with self.store.transaction(write=False) as tx:
            rows = await nodes_sql.list_all(tx)
        return {str(r["node_id"]): str(r["connectivity"]) for r in rows}


def events_digest(events: list[tuple[int, str, str, str, int]]) -> str:
    h = hashlib.sha256()
    for e in events:
        h.update(json.dumps(e, separators=(",", ":")).encode() + b"\n")
    return h.hexdigest()


@contextlib.contextmanager
def _scratch_dir() -> Iterator[Path]:
    # /dev/shm where there is one: a simulated hour is tens of thousands of small commits.
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="bc-pair-", dir=base) as d:
        yield Path(d)


async def hour_with_faults(pair: SessionPair, *, hours: float = 1.0) -> None:
    """The issue's scenario: heartbeats for `hours`, a 5-minute partition of a tenth of the nodes, a restart."""
    await pair.start()
    span = hours * 3600
    await asyncio.sleep(span * 0.25)
    cut = pair.node_ids()[: max(1, pair.n // 10)]
    pair.partition(cut)
    await asyncio.sleep(300)
    pair.heal()
    await asyncio.sleep(span * 0.25)
    await pair.restart_control_plane(down_s=30)
    await asyncio.sleep(span * 0.5 - 330)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bc.sim.pair")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--agents", type=int, default=100)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--dump", type=Path, help="write the events log here, one JSON array a line")
    p.add_argument("--log", action="store_true", help="print the processes' logs (warnings and up)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.log else logging.CRITICAL, format="%(message)s")

    async def go() -> list[tuple[int, str, str, str, int]]:
        with _scratch_dir() as root:
            pair = SessionPair(root, seed=args.seed, agents=args.agents)
            await hour_with_faults(pair, hours=args.hours)
            events = await pair.events()
            await pair.stop()
            return events

    events = run_virtual(go())
    if args.dump:
        args.dump.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    print(events_digest(events))


if __name__ == "__main__":
    main()
