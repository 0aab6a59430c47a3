"""Issue 14's gate, seeds 4-5 of five (tests/sim/heavy_seed.py says what each run checks)."""

from __future__ import annotations

import pytest

from tests.sim.heavy_seed import SEEDS, TIMEOUT_METHOD, TIMEOUT_S, check_heavy_seed


@pytest.mark.timeout(TIMEOUT_S, method=TIMEOUT_METHOD)
@pytest.mark.parametrize("seed", SEEDS[3:])
def test_heavy_chaos_at_100_nodes_for_an_hour_passes_every_invariant(seed: int) -> None:
    check_heavy_seed(seed)
