"""`SessionPair`: the production control plane, gateway and agents in one process, on in-memory links.

What runs is the code `bc serve` and `bc node` run: the store (the inline
SQLite driver, so nothing leaves the loop's thread), the Signer and the trust
bundle, the gateway's session drivers, liveness, the command sweeper, and for
each node a whole `Agent` with fake GPUs, the memory journal and inline
offload. Only the transport differs: each dial is one `bc.testing.link_pair`,
wrapped in `FaultyLink`, through which a `Network` can partition a node (every
frame in both directions is lost and new dials are refused) and heal it.

Everything is drawn from one seed: the control plane's Random and Secrets
(ids, certificate serials, keys, token secrets), each agent's Random, the
fake hardware. On `bc.virtual_time`'s loop a run is a function of its seed,
so two runs write the same events log byte for byte; `python -m
bc.session_pair --seed 7` prints that log's digest.

With `PairConfig(jobs=True)` the control plane runs the job queue too (`ControlPlane.jobs`, its pass
as a task, as `bc serve` does); with `reboot_s` each fake reboot takes that long on the loop's clock
and is recorded (`SessionPair.reboots`) instead of re-executing the process (`bench.jobs` rolls a
reboot over the pair).

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
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.app import Agent, AgentOptions, AgentParts
from agent.hw.fake import FakeHardware
from agent.identity import HeldIdentity, Identity
from agent.journal_api import new_journal_id
from agent.memory_journal import MemoryJournal
from agent.node_key import NodeKey
from agent.offload import inline
from bc.clock import LoopClock
from bc.control import approvers, identity
from bc.control import intent as intent_ctl
from bc.control.bus import Bus
from bc.control.intent import Intent
from bc.control.liveness import Liveness, LivenessConfig
from bc.control.signer import KeySigner, NullSigner, Signer
from bc.control.sweeper import CommandSweeper
from bc.gateway.sessions import Gateway, GatewayConfig
from bc.jobs.engine import JobEngine
from bc.pki.ca import CertificateAuthority
from bc.pki.identity import PeerIdentity, make_csr, peer_identity
from bc.pki.secrets_source import SeededSecrets, p256_key
from bc.pki.signing import SigningKeys
from bc.protocol import closing
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.store import Store
from bc.store import events as events_sql
from bc.store import nodes as nodes_sql
from bc.store.sqlite import InlineSqliteStore
from bc.testing import MemoryLink, link_pair
from bc.virtual_time import run as run_virtual
from bc.virtual_time import virtual_clock
from bc.wire.link import Link

In = TypeVar("In")
Out = TypeVar("Out")


class FaultyLink(Generic[In, Out]):
    """One end of a link whose frames are lost while `cut()` says so (a partition, not a close)."""

    def __init__(self, inner: Link[In, Out], cut: Callable[[], bool]) -> None:
        self._inner, self._cut = inner, cut

    async def send(self, msg: Out) -> None:
        if not self._cut():
            await self._inner.send(msg)

    async def recv(self) -> In | None:
        while True:
            msg = await self._inner.recv()
            if msg is None or not self._cut():
                return msg
            # A frame sent before the cut that arrives after it is lost too.

    async def close(self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED) -> None:
        await self._inner.close(code, details, reason)


@dataclass
class Network:
    """Which nodes are cut off, and the gateway every dial reaches (None while the control plane is down)."""

    partitioned: set[str] = field(default_factory=set)
    gateway: Gateway | None = None
    peers: dict[str, PeerIdentity] = field(default_factory=dict)
    sessions: set[asyncio.Task[None]] = field(default_factory=set)
    dials: Counter[str] = field(default_factory=Counter)
    # What a compromised gateway would run between its session driver and the node: wraps the gateway's end.
    wrap: Callable[[str, Link[NodeMessage, GatewayMessage]], Link[NodeMessage, GatewayMessage]] | None = None

    def dialer(self, node_id: str) -> Callable[[], Awaitable[Link[GatewayMessage, NodeMessage]]]:
        async def dial() -> Link[GatewayMessage, NodeMessage]:
            self.dials[node_id] += 1
            gateway = self.gateway
            if gateway is None or node_id in self.partitioned:
                raise ConnectionRefusedError(f"no route to the gateway from {node_id}")
            pair: tuple[MemoryLink[GatewayMessage, NodeMessage], MemoryLink[NodeMessage, GatewayMessage]]
            pair = link_pair()
            node_end, gateway_end = pair

            def cut() -> bool:
                return node_id in self.partitioned

            served: Link[NodeMessage, GatewayMessage] = FaultyLink[NodeMessage, GatewayMessage](gateway_end, cut)
            if self.wrap is not None:
                served = self.wrap(node_id, served)
            task = asyncio.create_task(gateway.serve(served, self.peers[node_id]), name=f"session-{node_id}")
            self.sessions.add(task)
            task.add_done_callback(self.sessions.discard)
            return FaultyLink[GatewayMessage, NodeMessage](node_end, cut)

        return dial


@dataclass(frozen=True)
class PairConfig:
    heartbeat_interval_s: float = 10.0
    lease_ttl_s: float = 40.0
    unreachable_grace_s: float = 120.0
    profile: str = "hgx-h100-8"
    signing: bool = True
    jobs: bool = False
    """Run the job queue as `bc serve` does (`ControlPlane.jobs`, its pass as a task)."""
    reboot_s: float | None = None
    """A fake reboot takes this long (on the loop's clock) and then calls the pair's hook, which records
    it (`SessionPair.reboots`); None: the fake hardware as it is (a reboot re-executes the process)."""


class ControlPlane:
    """The control plane's workers and one gateway over a store, as `bc serve` wires them, minus gRPC."""

    def __init__(
        self, store: Store, signer: Signer, intent: Intent, clock: LoopClock, rng: random.Random, cfg: PairConfig
    ) -> None:
        self.store, self.signer, self.intent, self.clock, self.rng, self.cfg = store, signer, intent, clock, rng, cfg
        self.bus = Bus()
        self.gateway_id = f"gw-sim-{rng.getrandbits(24):06x}"
        self.gateway = Gateway(
            store,
            self.bus,
            clock,
            self.gateway_id,
            signer,
            intent,
            GatewayConfig(heartbeat_interval_s=cfg.heartbeat_interval_s),
        )
        self.liveness = Liveness(
            store,
            self.bus,
            self.gateway_id,
            LivenessConfig(
                lease_ttl_ms=int(cfg.lease_ttl_s * 1000), unreachable_grace_ms=int(cfg.unreachable_grace_s * 1000)
            ),
        )
        self.sweeper = CommandSweeper(store, self.bus, self.gateway_id)
        # Drawn only when the queue runs: a pair without one draws what it always drew.
        self.jobs = (
            JobEngine(store, self.bus, signer, random.Random(rng.getrandbits(64)), holder=self.gateway_id)
            if cfg.jobs
            else None
        )
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.gateway.renew_lease()
        self._tasks = [
            asyncio.create_task(self.gateway.lease_loop(), name="gateway-lease"),
            asyncio.create_task(self.gateway.revocation_loop(), name="revocation-feed"),
            asyncio.create_task(self._liveness_loop(), name="liveness"),
            asyncio.create_task(self.sweeper.run_forever(self.clock), name="command-sweeper"),
        ]
        if self.jobs is not None:
            self._tasks.append(asyncio.create_task(self.jobs.run_forever(self.clock), name="jobs"))

    async def _liveness_loop(self) -> None:
        while True:
            await self.liveness.sweep_once()
            await self.clock.sleep(self.liveness.cfg.interval_s)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        async with asyncio.timeout(30):
            await self.gateway.drain()
        await self.gateway.release_lease()


class SessionPair:
    """A control plane, a gateway and N agents over in-memory links; see the module docstring."""

    def __init__(self, root: Path, *, seed: int, agents: int, cfg: PairConfig | None = None) -> None:
        self.root, self.seed, self.n, self.cfg = root, seed, agents, cfg or PairConfig()
        self.rng = random.Random(seed)
        self.secrets = SeededSecrets(self.rng.getrandbits(64))
        self.clock = virtual_clock()
        self.network = Network()
        self.agents: dict[str, Agent] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.cp: ControlPlane | None = None
        self.reboots: list[tuple[str, float]] = []  # (node, loop time) of each fake reboot, with `reboot_s`

    @property
    def store(self) -> Store:
        assert self.cp is not None, "the control plane is down"
        return self.cp.store

    # -- the control plane ---------------------------------------------------------

    async def _open_control_plane(self) -> ControlPlane:
        store = InlineSqliteStore(self.root / "bc.db", self.clock)
        await store.open()
        signer: Signer = KeySigner(self.signing_keys) if self.signing_keys is not None else NullSigner()
        intent = Intent(signer, self.ca.ca_pem)
        await intent_ctl.register(store, signer)
        intent.set_quorum(*await approvers.trust_state(store))
        cp = ControlPlane(store, signer, intent, self.clock, random.Random(self.rng.getrandbits(64)), self.cfg)
        await cp.start()
        self.network.gateway = cp.gateway
        return cp

    async def restart_control_plane(self, down_s: float = 0.0) -> None:
        """Stop the gateway and the workers, close the store, stay down `down_s`, open everything again."""
        assert self.cp is not None
        self.network.gateway = None
        await self.cp.stop()
        await self.cp.store.close()
        self.cp = None
        if down_s:
            await asyncio.sleep(down_s)
        self.cp = await self._open_control_plane()

    # -- nodes -----------------------------------------------------------------------

    async def _enroll(self, node_id: str) -> Agent:
        """Join as `bc join` does on the server's side (token, CSR, certificate), then build the agent."""
        cp = self.cp
        assert cp is not None
        tok = await identity.create_token(
            cp.store, cp.bus, self.ca, self.clock, node_id, "node", 3600, rng=cp.rng, secrets=self.secrets
        )
        key = p256_key(self.secrets)
        csr = make_csr(key, node_id).public_bytes(serialization.Encoding.DER)
        joined = await identity.join(cp.store, cp.bus, cp.signer, self.ca, tok.token_id, csr, f"host-{node_id}")
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
        parts = AgentParts(
            clock=self.clock,
            rng=rng,
            identity=ident,
            ca_pem=self.ca.ca_pem,
            identity_store=HeldIdentity(),
            node_key=NodeKey(None, key),
            hw=self._hardware(node_id, node_dir, rng),
            dial=self.network.dialer(node_id),
            open_journal=_memory_journal(rng),
            offload=inline,
            renewal=False,
        )
        return Agent(AgentOptions(data_dir=node_dir, heartbeat_interval_s=self.cfg.heartbeat_interval_s), parts)

    def _hardware(self, node_id: str, node_dir: Path, rng: random.Random) -> FakeHardware:
        if self.cfg.reboot_s is None:
            return FakeHardware(self.cfg.profile, node_id, state_dir=node_dir, rng=rng, offload=inline)
        hw = SlowRebootHardware(self.cfg.profile, node_id, state_dir=node_dir, rng=rng, offload=inline)
        hw.reboot_s = self.cfg.reboot_s

        def hook() -> None:
            self.reboots.append((node_id, asyncio.get_running_loop().time()))

        hw.reboot_hook = hook
        return hw

    def node_ids(self) -> list[str]:
        return [f"n{i:03d}" for i in range(self.n)]

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        pki = self.root / "pki"
        self.ca = CertificateAuthority.create(self.clock, self.rng, self.secrets)
        self.signing_keys = SigningKeys.create(pki, self.clock, self.rng, self.secrets) if self.cfg.signing else None
        self.cp = await self._open_control_plane()
        for node_id in self.node_ids():
            self.agents[node_id] = await self._enroll(node_id)
        for node_id, agent in self.agents.items():
            self.tasks[node_id] = asyncio.create_task(agent.run(), name=f"agent-{node_id}")

    async def stop(self) -> None:
        for agent in self.agents.values():
            agent.stopped.set()
        async with asyncio.timeout(60):
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        if self.cp is not None:
            self.network.gateway = None
            await self.cp.stop()
            await self.cp.store.close()
            self.cp = None
        for t in list(self.network.sessions):
            t.cancel()
        await asyncio.gather(*self.network.sessions, return_exceptions=True)

    # -- faults ----------------------------------------------------------------------

    def partition(self, node_ids: list[str]) -> None:
        self.network.partitioned.update(node_ids)

    def heal(self, node_ids: list[str] | None = None) -> None:
        if node_ids is None:
            self.network.partitioned.clear()
        else:
            self.network.partitioned.difference_update(node_ids)

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


class SlowRebootHardware(FakeHardware):
    """Fake hardware whose reboot takes `reboot_s` on the loop's clock, then calls its `reboot_hook`
    (which the pair always sets, so the process is never re-executed)."""

    reboot_s = 0.0

    async def reboot(self, *, allow: bool = False) -> tuple[bool, str]:
        await asyncio.sleep(self.reboot_s)
        return await super().reboot(allow=allow)


def _memory_journal(rng: random.Random) -> Callable[[], Awaitable[MemoryJournal]]:
    async def open_journal() -> MemoryJournal:
        return MemoryJournal(new_journal_id(rng))

    return open_journal


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
    p = argparse.ArgumentParser(prog="python -m bc.session_pair")
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
