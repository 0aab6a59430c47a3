"""The one table of a process's loops: which role runs each, what it needs, in what order they start.

`bc serve`, the in-process harness (`bc.sim.pair`) and `bc sim`'s gateway
processes all start their loops from this table (`start_loops`), under one
`Supervisor`; they differ only in what they built (`Parts`) and what they
have (`Has`): a listener, a CA, signing keys, a gateway certificate, an OTLP
endpoint. A loop runs when the process has one of its `roles` (and none of
its `unless`) and everything it `needs`; its `run` then finds its part built
(a missing one is a wiring bug, raised at start). `tests/unit/assembly`
checks that the three list the same loops for the same roles, and
`build/check_wiring.py` (in `make lint`) that nothing outside this package
starts one of them.

Loops start in table order and stop together (the supervisor cancels them
all); what a process must do after its loops stop (drain, release leases) is
its own `stop`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from bc.assembly.supervisor import LoopFactory, Supervisor
from bc.control.capacity.placement_pass import PlacementPass
from bc.control.commands.sweeper import CommandSweeper
from bc.control.doctor.clock_skew import ClockSkewMonitor
from bc.control.nodes.liveness import Liveness
from bc.control.nodes.spec_signing import SpecSigner
from bc.control.trust import sources as trust_ctl
from bc.control.trust.sources import TrustSource
from bc.gateway.sessions import Gateway
from bc.jobs.engine import JobEngine
from bc.jobs.health import HealthReconciler
from bc.seams.clock import Clock
from bc.store import Store

API, GATEWAY, WORKER = "api", "gateway", "worker"
ROLES = frozenset({API, GATEWAY, WORKER})

# What a process may have beyond its roles (`Has`).
LISTENER = "listener"  # it answers calls on an address of its own (gRPC)
CA = "ca"  # it holds the CA key
SIGNING_KEYS = "signing-keys"  # it holds a worker key and signs intent
GATEWAY_CERT = "gateway-cert"  # a keyless gateway: its serving certificate comes from an api process
OTLP = "otlp"  # it exports metrics


@dataclass
class Parts:
    """The built components of one process that its loops run over; None: this process has none."""

    store: Store
    clock: Clock
    trust: TrustSource | None = None
    gateway: Gateway | None = None
    liveness: Liveness | None = None
    sweeper: CommandSweeper | None = None
    jobs: JobEngine | None = None
    placement: PlacementPass | None = None
    health: HealthReconciler | None = None
    spec_signer: SpecSigner | None = None
    clock_skew: ClockSkewMonitor | None = None
    # Loops that only `bc serve` has the state for (a listening address, the CA, TLS identities).
    api_registry: LoopFactory | None = None
    gateway_registry: LoopFactory | None = None
    keyless: LoopFactory | None = None
    telemetry: LoopFactory | None = None


@dataclass(frozen=True)
class Loop:
    name: str
    roles: frozenset[str]
    """It runs in a process with any of these roles…"""
    run: Callable[[Parts], LoopFactory | None]
    """…made from the process's parts (None: the part is missing, a wiring bug)."""
    needs: frozenset[str] = field(default_factory=frozenset)
    """…that has all of these."""
    unless: frozenset[str] = field(default_factory=frozenset)
    """Roles that make it unnecessary (a gateway publishes the trust on its own feed)."""
    why: str = ""


ANY = ROLES


class RunsOnAClock(Protocol):
    """A worker role's controller: its loop runs on the process's clock."""

    def run_forever(self, clock: Clock) -> Awaitable[None]: ...


def _on_clock(part: RunsOnAClock | None, clock: Clock) -> LoopFactory | None:
    """The controller's loop on `clock`; None when this process does not run it."""
    return None if part is None else functools.partial(part.run_forever, clock)


def _publish(p: Parts) -> LoopFactory | None:
    return None if p.trust is None else functools.partial(trust_ctl.publish_forever, p.trust, p.store, p.clock)


LOOPS: tuple[Loop, ...] = (
    Loop(
        "api-registry",
        frozenset({API}),
        lambda p: p.api_registry,
        frozenset({CA, LISTENER}),
        why="registers where this api answers; issues keyless gateways' serving certificates",
    ),
    Loop(
        "gateway-registry",
        frozenset({GATEWAY}),
        lambda p: p.gateway_registry,
        frozenset({LISTENER}),
        why="registers where this gateway answers (api processes relay tunnels to its nodes through it)",
    ),
    Loop(
        "spec-signer",
        ANY,
        lambda p: None if p.spec_signer is None else p.spec_signer.run_forever,
        frozenset({SIGNING_KEYS}),
        why="signs the specs stored unsigned (a rotation, an import)",
    ),
    Loop(
        "trust-publish",
        ANY,
        _publish,
        frozenset({SIGNING_KEYS}),
        unless=frozenset({GATEWAY}),
        why="keeps the trust bundle current and published for keyless gateways",
    ),
    Loop(
        "keyless",
        ANY,
        lambda p: p.keyless,
        frozenset({GATEWAY_CERT}),
        why="renews a keyless gateway's serving certificate",
    ),
    Loop(
        "gateway-lease",
        frozenset({GATEWAY}),
        lambda p: None if p.gateway is None else p.gateway.lease_loop,
        why="renews the gateway's lease, or fences it",
    ),
    Loop(
        "revocation-feed",
        frozenset({GATEWAY}),
        lambda p: None if p.gateway is None else p.gateway.revocation_loop,
        why="ends revoked nodes' sessions; refreshes the trust",
    ),
    Loop(
        "gateway-stats",
        frozenset({GATEWAY}),
        lambda p: None if p.gateway is None else p.gateway.stats_loop,
        why="writes the gateway's counters",
    ),
    Loop(
        "liveness",
        frozenset({WORKER}),
        lambda p: _on_clock(p.liveness, p.clock),
        why="marks nodes unreachable after their grace, never releasing a workload",
    ),
    Loop(
        "command-sweeper",
        frozenset({WORKER}),
        lambda p: _on_clock(p.sweeper, p.clock),
        why="expires commands past their deadline",
    ),
    Loop(
        "jobs",
        frozenset({WORKER}),
        lambda p: _on_clock(p.jobs, p.clock),
        why="runs the DAG job queue",
    ),
    Loop(
        "placement",
        frozenset({WORKER}),
        lambda p: _on_clock(p.placement, p.clock),
        why="places pending reservations",
    ),
    Loop(
        "health",
        frozenset({WORKER}),
        lambda p: _on_clock(p.health, p.clock),
        why="turns GPU conditions into remediation jobs within the health policy's limits",
    ),
    Loop(
        "clock-skew",
        ANY,
        lambda p: None if p.clock_skew is None else p.clock_skew.run,
        why="compares this host's clock with the store's",
    ),
    Loop("telemetry", ANY, lambda p: p.telemetry, frozenset({OTLP}), why="exports metrics"),
)
"""Every loop a control-plane process may run, in start order."""


def planned(roles: Collection[str], has: Collection[str]) -> list[Loop]:
    """The loops a process with `roles` and `has` runs, in start order."""
    r, h = frozenset(roles), frozenset(has)
    return [lp for lp in LOOPS if lp.roles & r and not lp.unless & r and lp.needs <= h]


def loops_for(roles: Collection[str], has: Collection[str]) -> list[str]:
    """The names of the loops `start_loops` starts for `roles` and `has`, in start order (a pure function:
    tests/unit/assembly/test_same_loops.py compares `bc serve`'s, the harness's and `bc sim`'s by it)."""
    unknown = set(roles) - ROLES
    if unknown:
        raise ValueError(f"unknown roles: {', '.join(sorted(unknown))}")
    return [lp.name for lp in planned(roles, has)]


def start_loops(supervisor: Supervisor, roles: Collection[str], has: Collection[str], parts: Parts) -> list[str]:
    """Start every loop `loops_for` names for this process under `supervisor`; returns their names."""
    by_name = {lp.name: lp for lp in LOOPS}
    loops = [by_name[name] for name in loops_for(roles, has)]
    factories: list[tuple[str, LoopFactory]] = []
    for lp in loops:  # every part first: a wiring bug starts nothing
        factory = lp.run(parts)
        if factory is None:
            raise RuntimeError(f"wiring: loop {lp.name} runs in this process, but its part was not built")
        factories.append((lp.name, factory))
    for name, factory in factories:
        supervisor.spawn(name, factory)
    return [name for name, _ in factories]


__all__ = [
    "API",
    "CA",
    "GATEWAY",
    "GATEWAY_CERT",
    "LISTENER",
    "LOOPS",
    "OTLP",
    "ROLES",
    "SIGNING_KEYS",
    "WORKER",
    "Loop",
    "Parts",
    "loops_for",
    "planned",
    "start_loops",
]
