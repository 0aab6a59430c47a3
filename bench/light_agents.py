"""The simulator's agents on the real-time loop, over real gRPC: thousands of nodes in one process.

`bc sim` runs the production `Agent` with the parts `SessionPair` gives it: a memory journal, work done
inline, fake hardware, no renewal loop, no health or telemetry. Here the same agent dials for real
(`agent.session.grpc_dial`: mutual TLS to the addresses it joined with, the multi-gateway `Rotation`),
so a benchmark can hold 1,000 or 10,000 sessions against real `bc serve` processes from one process,
where 10,000 production agents, each with its own fsynced SQLite journal and loops, would not fit.
What the gateway sees is a node like any other: the same Hello, heartbeats, status and reconnects.

One thing differs, and only because a thousand agents share this process: the drift pass (every 10 s on
a real node, re-reading its CDI and host files) runs every `drift_pass_s`, by default every 5 minutes,
so the benchmark's own process does not starve the gateways it measures of the machine's two cores.
A spec change still runs the pass at once.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

from agent.app import Agent, AgentOptions, AgentParts
from agent.hw.fake import FakeHardware
from agent.identity import Identity, IdentityFile
from agent.journal_api import AgentJournal, new_journal_id
from agent.memory_journal import MemoryJournal
from agent.node_key import NodeKey
from agent.offload import inline, to_thread
from agent.session.dialing import SessionLoop
from agent.session.grpc_dial import grpc_dial
from agent.tunnel.service import TunnelService
from bc.protocol.pb import session_pb2
from bc.seams.clock import SystemClock

PROFILE = "hgx-h100-8"
DRIFT_PASS_S = 300.0
TUNNELS_ENV = "BENCH_TUNNELS"
"""How the agents take their tunnel offers (`light_agent`): `session` (the default, as a node does: on the
session stream), `listen` (on a `NodeTunnels.Listen` stream beside it, as an older agent does) or `none`."""


def light_agent(
    data_dir: Path, seed: int, *, heartbeat_interval_s: float = 10.0, drift_pass_s: float = DRIFT_PASS_S
) -> Agent:
    """A joined node's agent (identity files in `data_dir`) with the simulator's light parts."""
    identity = Identity.load(data_dir)
    ca_pem = identity.read(data_dir, "ca")
    rng = random.Random(seed)
    journal: list[AgentJournal] = []

    async def open_journal() -> AgentJournal:
        if not journal:  # one machine, one journal: a restarted session finds what it left
            journal.append(MemoryJournal(new_journal_id(rng)))
        return journal[0]

    parts = AgentParts(
        clock=SystemClock(),
        rng=rng,
        identity=identity,
        ca_pem=ca_pem,
        identity_store=IdentityFile(data_dir, to_thread),
        node_key=NodeKey(data_dir / identity.files["key"]),
        hw=FakeHardware(PROFILE, identity.node_id, state_dir=data_dir, rng=rng, offload=inline),
        dial=grpc_dial(data_dir, identity, ca_pem, inline, rng),
        open_journal=open_journal,
        offload=inline,
        renewal=False,
    )
    opts = AgentOptions(data_dir=data_dir, heartbeat_interval_s=heartbeat_interval_s, drift_pass_s=drift_pass_s)
    tunnels = os.environ.get(TUNNELS_ENV, "session")
    if tunnels == "none":
        # A measurement only (bench.session_mem --no-tunnels): a node that takes no offers at all. A real node
        # always does.
        TunnelService.serve = _no_tunnels  # type: ignore[method-assign]
    if tunnels in ("listen", "none"):
        # `listen`: what an older agent's second stream, its tunnels' Listen beside the session, costs a gateway
        # (bench.session_mem --listen); `none`: and no `tunnel.offers` in the Hello either. Every agent of this
        # process alike.
        SessionLoop.tunnel_offers = False
    return Agent(opts, parts)


async def _no_tunnels(_self: TunnelService, _channel: object, _offers: object = None) -> None:
    """In place of `TunnelService.serve`: no Listen stream, until the session ends (and cancels this)."""
    await asyncio.get_running_loop().create_future()


async def offer_status(agents: list[Agent], every_s: float, for_s: float) -> int:
    """Each agent sends a new status every `every_s` (paced over the interval), for `for_s`.

    A fleet whose every node's status changes at every drift pass, the worst case (an agent does not send a
    status that says nothing new, so each offered report carries a `BenchTick` condition with the tick in
    its reason), without running the passes themselves in this one process: the same outbox, session
    writer, gRPC stream and gateway write path.
    """
    sent = 0
    tick_n = 0
    t0 = time.monotonic()
    step = every_s / max(1, len(agents))
    while time.monotonic() - t0 < for_s:
        tick = time.monotonic()
        tick_n += 1
        for k, a in enumerate(agents):
            out = a.outbox
            if out.status is not None and a.connected.is_set():
                report = session_pb2.StatusReport()
                report.CopyFrom(out.status)
                kept = [c for c in report.conditions if c.type != "BenchTick"]
                del report.conditions[:]
                report.conditions.extend(kept)
                report.conditions.add(type="BenchTick", status="True", reason=f"tick-{tick_n}")
                out.put_status(report, out.inventory, out.inventory_hash)
                sent += 1
            if k % 100 == 99:
                await asyncio.sleep(max(0.0, tick + (k + 1) * step - time.monotonic()))
        await asyncio.sleep(max(0.0, tick + every_s - time.monotonic()))
    return sent
