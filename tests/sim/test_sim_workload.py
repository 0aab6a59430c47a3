"""The simulator's workload through `bc.sim.fleet`: the production control plane, gateway and agents.

What an operator would read in the summary: every part of the mix happened (reservations with and
without windows, spec writes, each command kind the fake hardware runs, signed batches that ran, the
three job templates), refusals are counted and never crash the workload, the invariants hold under it,
and one seed draws the same mix and writes the same events log twice.
"""

from __future__ import annotations

import json
import random
from collections import Counter

from bc.sim.fleet import SimConfig, SimResult, run_sync
from bc.sim.workload import NODE_KINDS, Rates, make_workload

BUSY = Rates(reservations=4.0, releases=2.0, specs=2.0, commands=8.0, batches_per_hour=12.0, jobs_per_hour=12.0)


def simulate(seed: int, minutes: float) -> SimResult:
    """One run on its own virtual loop (a run's clock starts where its loop's does: a fresh loop each time)."""
    cfg = SimConfig(nodes=6, seed=seed, chaos="none", duration_s=minutes * 60, quiet_s=120.0)
    return run_sync(cfg, workload=make_workload(random.Random(seed), BUSY))


def test_the_mix_reaches_every_part_of_the_fleet() -> None:
    result = simulate(seed=6, minutes=45)  # seed 3 stopped writing `host` once `access` got a converger
    work = result.work
    assert work["reservations"] > 0 and work["releases"] > 0, work
    assert work["reservations.window"] > 0 and work["reservations.duration"] > 0, work
    assert work["spec.devices"] > 0, work
    for section in ("access", "host", "telemetry"):
        assert work[f"spec.{section}"] > 0, work
    for kind in NODE_KINDS:
        assert work[f"command.{kind}"] > 0, (kind, work)
    assert work["batches"] > 0 and work["approvals"] > 0, work
    for template in ("reboot", "remediate", "rollout"):
        assert work[f"jobs.{template}"] > 0, (template, work)
    assert work["quorum.changes"] == 6, work  # three approvers, k, the allowance and approver0's second key
    assert work["approvals.second-key"] > 0, work  # approver0 signed with both keys (Q1's situation)
    # The production code held every promise under the workload.
    assert result.ok, [i for i in result.invariants if not i.ok]
    # The approvers' signatures counted: batches were approved, and destructive commands ran on the nodes.
    facts = result.facts
    assert facts is not None
    kinds_run = Counter(e.kind for e in facts.side_effects)
    assert kinds_run["gpu.reset"] > 0 and kinds_run["node.reboot"] > 0, kinds_run


def test_one_seed_draws_the_same_mix_and_the_same_log() -> None:
    first = simulate(seed=5, minutes=10)
    second = simulate(seed=5, minutes=10)
    assert first.work == second.work and first.digest == second.digest
    assert sum(first.work.values()) > 20, first.work
    other = simulate(seed=6, minutes=10)
    assert other.work != first.work


def test_the_section_values_are_valid_json() -> None:
    from bc.control.nodes.specs import section_mutation
    from bc.sim.workload import SPEC_SECTIONS, section_json

    rng = random.Random(1)
    for _ in range(30):
        for section in SPEC_SECTIONS:
            text = section_json(section, rng)
            json.loads(text)
            section_mutation(section, text)  # parses and passes the spec's content checks
