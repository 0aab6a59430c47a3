"""The chaos schedule: a function of its seed, empty at `none`, every kind at `heavy`, all inside the run."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.sim import chaos

NODES = [f"n{i:03d}" for i in range(100)]


def test_one_seed_one_schedule() -> None:
    a = chaos.schedule("heavy", random.Random(7), NODES, 3600)
    b = chaos.schedule("heavy", random.Random(7), NODES, 3600)
    c = chaos.schedule("heavy", random.Random(8), NODES, 3600)
    assert a == b
    assert a != c


def test_none_injects_nothing() -> None:
    assert chaos.schedule("none", random.Random(7), NODES, 3600) == []


@pytest.mark.parametrize("seed", range(5))
def test_heavy_at_a_hundred_nodes_for_an_hour(seed: int) -> None:
    faults = chaos.schedule("heavy", random.Random(seed), NODES, 3600)
    kinds = Counter(f.kind for f in faults)
    assert set(kinds) == set(chaos.KINDS)
    assert kinds[chaos.CP_RESTART] == 1
    assert 50 <= len(faults) <= 150  # on the order of a hundred
    light = chaos.schedule("light", random.Random(seed), NODES, 3600)
    assert len(light) < len(faults) / 4


@given(
    st.sampled_from(chaos.LEVELS),
    st.integers(0, 2**32),
    st.integers(1, 40),
    st.floats(0, 7200),
)
def test_faults_are_sorted_inside_the_run_on_known_nodes(
    level: chaos.Level, seed: int, n: int, duration: float
) -> None:
    nodes = NODES[:n]
    faults = chaos.schedule(level, random.Random(seed), nodes, duration)
    assert faults == sorted(faults, key=lambda f: (f.t_s, f.kind, f.targets))
    for f in faults:
        assert chaos.WARMUP_S <= f.t_s < duration
        assert set(f.targets) <= set(nodes)
        assert f.kind in chaos.KINDS
        lasting = f.params.get("duration_s", f.params.get("down_s", 0.0))
        assert isinstance(lasting, float)
        if f.kind != chaos.CP_RESTART:
            assert f.t_s + lasting <= max(duration, f.t_s + 1.0)
        if f.kind == chaos.CP_CLOCK_SKEW:
            offset = f.params["offset_s"]
            assert isinstance(offset, float) and abs(offset) < 1.0
        if f.kind == chaos.PARTITION:
            assert f.targets and f.params["direction"] in ("both", "to_node", "from_node")
        elif f.kind != chaos.CP_CLOCK_SKEW and f.kind != chaos.CP_RESTART:
            assert len(f.targets) == 1


def test_only_one_gateway_is_built() -> None:
    with pytest.raises(ValueError, match="gateway"):
        chaos.schedule("heavy", random.Random(1), NODES, 3600, gateways=3)
