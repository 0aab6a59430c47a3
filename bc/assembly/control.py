"""The one place a control-plane process's components are built, from the seams it is handed.

`bc serve` (`bc.assembly.server.Server`), the in-process harness (`bc.sim.pair`)
and `bc sim`'s gateway processes (`bc.sim.gateways`) call `build_control`;
what differs between them is only what they pass: the store (a file, a
server, an outage-injecting wrapper), the clock (the host's or virtual), the
Random (seeded or not), the signer and trust, and `ControlFactories`, the
classes the simulator swaps for a deliberately broken one (`bc.sim.breaks`).
Nothing here reads a flag: a component is built whether or not this process
runs its loop (an api-only process still submits jobs through the engine,
a worker-only one still answers a drain), and `bc.assembly.loops` decides
from the roles which loops run.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from bc.assembly.loops import Parts
from bc.control.base.bus import Bus
from bc.control.capacity.placement_pass import PlacementPass
from bc.control.commands.sweeper import CommandSweeper
from bc.control.doctor.clock_skew import ClockSkewMonitor
from bc.control.nodes.liveness import Liveness, LivenessConfig
from bc.control.nodes.spec_signing import SpecSigner
from bc.control.quorum import spec_changes as spec_quorum
from bc.control.signing.signer import Signer
from bc.control.trust.intent import Intent
from bc.control.trust.sources import TrustSource
from bc.gateway.session_driver import SecretPort
from bc.gateway.sessions import Gateway, GatewayConfig
from bc.jobs.engine import JobEngine
from bc.jobs.health import HealthReconciler
from bc.seams.clock import Clock
from bc.store import Store
from bc.store.leases import Claim


def production_liveness(store: Store, bus: Bus, holder: str, cfg: LivenessConfig, signer: Signer) -> Liveness:
    del signer  # production liveness releases nothing, so it signs nothing
    return Liveness(store, bus, holder, cfg)


@dataclass(frozen=True)
class ControlFactories:
    """The classes and factories the control plane is built from: production's, unless a simulation swaps
    one for a deliberately broken component (`bc.sim.breaks`); nothing in them reads a flag."""

    gateway_cls: type[Gateway] = Gateway
    liveness: Callable[[Store, Bus, str, LivenessConfig, Signer], Liveness] = production_liveness
    placement_cls: type[PlacementPass] = PlacementPass
    health_cls: type[HealthReconciler] = HealthReconciler


@dataclass(frozen=True)
class ControlSettings:
    heartbeat_interval_s: float = 10.0
    lease_ttl_s: float = 40.0
    unreachable_grace_s: float = 120.0


def build_control(
    store: Store,
    bus: Bus,
    clock: Clock,
    rng: random.Random,
    signer: Signer,
    trust: Intent | TrustSource,
    *,
    gateway_id: str,
    worker_id: str,
    settings: ControlSettings,
    factories: ControlFactories | None = None,
    gateway: Gateway | None = None,
    claim: Claim | None = None,
    secrets: SecretPort | None = None,
) -> Parts:
    """Every component a control-plane process has (its gateway too, unless `gateway` is given: a
    simulated gateway process's own). `worker_id` holds the singleton workers' leases; `claim` is
    this process's hold on its gateway's lease (`bc serve`'s, taken before anything acts as the gateway);
    `secrets` where this process's gateway takes its nodes' secret requests (docs/secrets.md): the broker
    when the process holds the at-rest key beside the CA, a forwarder to an api process when it is a
    gateway without one; left out, they are answered `unavailable`."""
    f = factories or ControlFactories()
    if gateway is None:
        gateway = f.gateway_cls(
            store,
            bus,
            clock,
            gateway_id,
            signer,
            trust,
            GatewayConfig(heartbeat_interval_s=settings.heartbeat_interval_s),
            claim,
            secrets=secrets,
        )
    liveness = f.liveness(
        store,
        bus,
        worker_id,
        LivenessConfig(
            lease_ttl_ms=int(settings.lease_ttl_s * 1000),
            unreachable_grace_ms=int(settings.unreachable_grace_s * 1000),
        ),
        signer,
    )
    jobs = JobEngine(store, bus, signer, random.Random(rng.getrandbits(64)), holder=worker_id)
    return Parts(
        store=store,
        clock=clock,
        trust=gateway.trust,
        gateway=gateway,
        liveness=liveness,
        sweeper=CommandSweeper(
            store, bus, worker_id, each_pass=functools.partial(spec_quorum.apply_pending, store, bus, signer)
        ),
        jobs=jobs,
        placement=f.placement_cls(store, bus, signer, random.Random(rng.getrandbits(64)), holder=worker_id),
        # The job engine's Random: no draw of its own here, so every seeded run's ids stay as they were.
        health=f.health_cls(store, bus, jobs, jobs.rng, holder=worker_id),
        spec_signer=SpecSigner(store, bus, signer),
        clock_skew=ClockSkewMonitor(store, clock),
    )


__all__ = ["ControlFactories", "ControlSettings", "build_control", "production_liveness"]
