"""`bc sim --instances`: VMs with passed-through GPUs through the production converger (the fake runtime and
the fake sysfs tree), instance reservations beside the holds, V1 checked; `--break instance-as-hold` is
caught by V1 and only by it. A run without `--instances` keeps its digest (tests/sim/test_sim_health.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bc.sim.fleet import SimConfig, run_sync, workload_for

pytestmark = pytest.mark.slow  # two 10-minute fleets: 15-20 s each on the shared 2 cores

SHAPE = SimConfig(nodes=6, seed=1, chaos="light", duration_s=600.0, instances=True)


def test_vms_run_with_their_gpus_and_no_gpu_is_both_held_and_passed_through() -> None:
    result = run_sync(SHAPE, workload=workload_for(SHAPE))
    assert result.ok, [i.counterexample for i in result.invariants if not i.ok]
    assert [i.id for i in result.invariants][-1] == "V1"
    assert result.work["instances.reservations"] > 0 and result.work["spec.instances"] > 0
    assert result.work["instances.samples-with-gpus-passed"] >= 10  # V1's situation happened, often
    assert result.repro.endswith("--instances")


def test_a_devices_converger_that_writes_a_cdi_spec_for_an_instance_is_caught_by_v1() -> None:
    broken = replace(SHAPE, break_rule="instance-as-hold")
    result = run_sync(broken, workload=workload_for(broken))
    failed = [i for i in result.invariants if not i.ok]
    assert [i.id for i in failed] == ["V1"], failed
    assert "is both held (a CDI hold names it) and passed through to instance vm-" in (failed[0].counterexample or "")
