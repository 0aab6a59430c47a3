"""Find a seed for a `--break` case of test_sim_breaks_e2e.py whose run meets the broken component's situation.

`python -m tests.sim.find_break_seed RULE`: runs are exact, so a change to session timing can move a case;
this walks seeds with the case's size and rates until the rule's checker fails, and prints it.
"""

from __future__ import annotations

import random
import sys

from bc.sim.breaks import seams_for
from bc.sim.fleet import SimConfig, run_sync
from bc.sim.workload import make_workload
from tests.sim.test_sim_breaks_e2e import CASES


def main(rule: str, seeds: int = 30) -> int:
    case = CASES[rule]
    for seed in range(1, seeds + 1):
        cfg = SimConfig(
            nodes=case.nodes, seed=seed, chaos="heavy", duration_s=case.minutes * 60, break_rule=rule, quiet_s=120.0
        )
        result = run_sync(cfg, workload=make_workload(random.Random(seed), case.rates))
        failed = [r.id for r in result.invariants if not r.ok]
        print(f"seed {seed}: failed {failed or 'nothing'}", flush=True)
        if seams_for(rule).checker in failed:
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
