"""`bc sim --health`: XID storms under heavy chaos with the health reconciler's policy set, H1 checked (its
break's run is in test_sim_breaks_e2e.py); and a run without `--health` exactly as before (its digest
pinned from the commit before the storms existed, 1fe984d)."""

from __future__ import annotations

import random
from dataclasses import replace

from bc.sim import chaos, storms
from bc.sim.coverage import coverage
from bc.sim.fleet import SimConfig, run_sync, workload_for

SHAPE = SimConfig(nodes=12, seed=1, chaos="heavy", duration_s=600.0, health=True)


def test_a_health_run_remediates_within_the_limits_and_holds_every_invariant() -> None:
    result = run_sync(SHAPE, workload=workload_for(SHAPE))
    assert [i.id for i in result.invariants][-1] == "H1"
    assert result.ok, [i.counterexample for i in result.invariants if not i.ok]
    h = result.facts.health if result.facts is not None else None
    assert h is not None and h.limits is not None and h.limits.node_cap == 1
    assert sum(h.injected.values()) > 0 and any(e.starts for e in h.episodes)
    assert {s.what for s in coverage(result.facts) if s.invariant == "H1"}  # counted (result.facts is set)
    assert result.repro.endswith("--health")


def test_storms_are_drawn_after_the_rest_of_the_schedule() -> None:
    nodes = [f"n{i:03d}" for i in range(50)]
    plain = chaos.schedule("heavy", random.Random(5), nodes, 1800.0)
    rng = random.Random(5)
    same = chaos.schedule("heavy", rng, nodes, 1800.0)
    more = storms.schedule(rng, nodes, 1800.0)
    assert plain == same and more and {f.kind for f in more} <= set(storms.KINDS)
    assert all(chaos.WARMUP_S <= f.t_s < 1800.0 for f in more)
    again = random.Random(5)
    chaos.schedule("heavy", again, nodes, 1800.0)
    assert storms.schedule(again, nodes, 1800.0) == more  # the same seed, the same storms


def test_a_run_without_health_keeps_its_digest() -> None:
    cfg = SimConfig(nodes=10, seed=3, chaos="heavy", duration_s=300.0)
    result = run_sync(cfg, workload=workload_for(cfg))
    assert "H1" not in [i.id for i in result.invariants]
    assert result.digest == "6796c1e09cb361f525656780fabd69a3bd244fbfceca179a23e457fcf41097f6"
    three = replace(cfg, gateways=3)
    assert run_sync(three, workload=workload_for(three)).digest == (
        "4f7dc75d5aa7b8f12defae7fa73989c8b05785c05b05d4e1065e1d7062fcf0e8"
    )
