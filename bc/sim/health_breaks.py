"""The health reconciler's deliberate breaks (`bc sim --health --break RULE`, `bc.sim.breaks`), each caught by H1.

Each is the production `bc.jobs.health.HealthReconciler` with one small defect of the shape a real one would
have, swapped in through `ControlFactories.health_cls` (nothing in production reads a flag):

    RULE                      the defect                                                    the clause of H1
    health-ignore-limits      its decision is shown no limits (`decider` seam): a storm     the limits
                              starts every remediation at once
    health-release-holds      it evicts instead of waiting: as it starts a GPU's            no hold released
                              remediation it releases the holds on the GPU (reason
                              `health-evicted`), so the drain finds none
    health-reset-under-hold   its remediation job's reset does not wait for the drain       no reset under a hold
                              (the template's dependency left out, through its job
                              engine's `build` seam): the GPU is reset under the holds
                              the drain is still waiting for
    health-forget-repeats     its decision is shown no recent episodes (`decider` seam):    each condition acted on
                              a GPU sick again within the repeat window is remediated       once
                              again instead of quarantined

Each shows only where a run meets what it is wrong about: a storm bigger than the cap; an episode on a GPU a
booking holds (`bc.sim.storms` aims some XIDs at held GPUs); a GPU struck again after its episode ended (and
some XIDs are aimed there).
"""

from __future__ import annotations

import dataclasses
import random

from bc.control.base.bus import Bus
from bc.control.health import decide as health_decide
from bc.control.health.policy import Limits
from bc.control.health.world import Loaded
from bc.jobs import templates
from bc.jobs.engine import JobEngine
from bc.jobs.health import HealthReconciler
from bc.jobs.model import DagSpec
from bc.jobs.views import JobRequest
from bc.sim.releases import release_reservation
from bc.store import Row, Store, Tx
from bc.store import health as health_sql
from bc.store import reservations as res_sql

# ---- health-ignore-limits ----

NO_LIMITS = Limits(max_nodes=1 << 30, max_fleet_percent=100, per_label="", max_actions_per_hour=1 << 30)


def decide_without_limits(world: health_decide.World) -> list[health_decide.Decision]:
    """The production decision shown a policy without limits."""
    return health_decide.decide(dataclasses.replace(world, policy=dataclasses.replace(world.policy, limits=NO_LIMITS)))


class LimitlessReconciler(HealthReconciler):
    """The production reconciler deciding with `decide_without_limits` (its `decider` seam)."""

    decider = staticmethod(decide_without_limits)


# ---- health-release-holds ----

EVICT_REASON = "health-evicted"


class EvictingReconciler(HealthReconciler):
    """The production reconciler that, as it starts a GPU's remediation, releases every live hold on the GPU
    (the whole reservation, as a release does) instead of leaving its job's drain to wait for them."""

    async def _start(self, tx: Tx, x: health_decide.Start, row: Row, loaded: Loaded, now_ms: int) -> None:
        await super()._start(tx, x, row, loaded, now_ms)
        node_id, gpu = x.key
        if not gpu:
            return
        held = {str(r["id"]) for r in await health_sql.reservations_on_gpus(tx, node_id, [gpu], now_ms)}
        for r in await res_sql.list_(tx, node_id, state="active"):
            if str(r["id"]) in held and str(r["node_id"] or "") == node_id:
                lock = self.store.for_update()
                await release_reservation(tx, self.bus, self.jobs.signer, r, EVICT_REASON, now_ms, lock=lock)


# ---- health-reset-under-hold ----


def remediate_without_drain_wait(req: JobRequest, dag_id: str, facts: templates.Facts) -> DagSpec:
    """`bc.jobs.templates.build`, with a remediate job's reset not waiting for its drain: the drain still runs
    (and waits, and fails at its deadline), but the reset starts beside it."""
    spec = templates.build(req, dag_id, facts)
    if spec.template != "remediate":
        return spec
    nodes = tuple(
        dataclasses.replace(n, deps=tuple(d for d in n.deps if not d.node.startswith("drain:")))
        if n.id.startswith("reset:")
        else n
        for n in spec.nodes
    )
    return dataclasses.replace(spec, nodes=nodes)


class DrainlessEngine(JobEngine):
    """A job engine building DAGs with `remediate_without_drain_wait` (its `build` seam)."""

    build = staticmethod(remediate_without_drain_wait)


class HastyReconciler(HealthReconciler):
    """The production reconciler submitting its jobs through a `DrainlessEngine` (on the same store, bus, signer
    and Random as the control plane's engine, which runs them)."""

    def __init__(self, store: Store, bus: Bus, jobs: JobEngine, rng: random.Random, *, holder: str) -> None:
        drainless = DrainlessEngine(jobs.store, jobs.bus, jobs.signer, jobs.rng, holder=jobs.holder, tokens=jobs.tokens)
        super().__init__(store, bus, drainless, rng, holder=holder)


# ---- health-forget-repeats ----


def decide_forgetting_repeats(world: health_decide.World) -> list[health_decide.Decision]:
    """The production decision shown no episode that ended (`World.recent`): a GPU sick again within the repeat
    window opens an ordinary episode, which is started again, instead of one quarantined at once."""
    return health_decide.decide(dataclasses.replace(world, recent=()))


class RepeatBlindReconciler(HealthReconciler):
    """The production reconciler deciding with `decide_forgetting_repeats` (its `decider` seam)."""

    decider = staticmethod(decide_forgetting_repeats)


__all__ = [
    "EVICT_REASON",
    "NO_LIMITS",
    "DrainlessEngine",
    "EvictingReconciler",
    "HastyReconciler",
    "LimitlessReconciler",
    "RepeatBlindReconciler",
    "decide_forgetting_repeats",
    "decide_without_limits",
    "remediate_without_drain_wait",
]
