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
    replays = kinds[chaos.SPEC_REPLAY]
    assert 50 <= replays <= 150  # one per node-hour
    assert 50 <= len(faults) - replays <= 150  # the rest: on the order of a hundred
    light = chaos.schedule("light", random.Random(seed), NODES, 3600)
    assert len(light) < len(faults) / 4


@given(
    st.sampled_from([level for level in chaos.LEVELS if level != chaos.STORM]),  # storm needs gateways: below
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


def test_a_run_needs_a_gateway() -> None:
    with pytest.raises(ValueError, match="gateway"):
        chaos.schedule("heavy", random.Random(1), NODES, 3600, gateways=0)


@pytest.mark.parametrize("seed", range(5))
def test_several_gateways_add_their_faults_after_the_one_gateway_schedule(seed: int) -> None:
    """The gateway kinds are drawn after every other draw: the rest of the schedule is the one-gateway one, so
    a one-gateway run's digest does not move; heavy strikes with each of them too."""
    one = chaos.schedule("heavy", random.Random(seed), NODES, 3600)
    three = chaos.schedule("heavy", random.Random(seed), NODES, 3600, gateways=3)
    replay = chaos.SPEC_REPLAY
    assert [f for f in three if f.kind not in chaos.GATEWAY_KINDS and f.kind != replay] == [
        f for f in one if f.kind != replay
    ]
    assert not {f.kind for f in one} & set(chaos.GATEWAY_KINDS)
    assert {f.kind for f in three} == set(chaos.kinds_for(3))
    for f in three:
        if f.kind == chaos.STORE_OUTAGE:
            assert f.targets == (chaos.STORE,) and 5 <= float(f.params["duration_s"]) <= 45
        elif f.kind in (chaos.GATEWAY_KILL, chaos.GATEWAY_STALL):
            assert f.targets[0] in {"gw-0", "gw-1", "gw-2"}


@given(st.integers(0, 2**32), st.integers(2, 8), st.floats(60, 7200))
def test_a_gateway_is_always_up(seed: int, gateways: int, duration: float) -> None:
    """Kills and stalls never overlap on one gateway, and never take down the last one up."""
    faults = chaos.schedule("heavy", random.Random(seed), NODES[:5], duration, gateways=gateways)
    spans = [
        (f.t_s, f.t_s + float(f.params.get("down_s", f.params.get("duration_s", 0.0))), f.targets[0])
        for f in faults
        if f.kind in (chaos.GATEWAY_KILL, chaos.GATEWAY_STALL)
    ]
    for t, end, _ in spans:
        assert end <= max(duration, t + 1.0)
        down = [g for a, b, g in spans if a <= t <= b]
        assert len(down) == len(set(down)) and len(down) < gateways


@pytest.mark.parametrize("seed", range(5))
def test_storm_is_heavy_with_the_store_out_far_more_often(seed: int) -> None:
    """The store-outage chaos at its heaviest: the node and control-plane faults are heavy's, the gateway kinds
    come on top, and the store goes out several times an hour (10 on average) where heavy takes it out once."""
    heavy = chaos.schedule("heavy", random.Random(seed), NODES, 3600, gateways=3)
    storm = chaos.schedule("storm", random.Random(seed), NODES, 3600, gateways=3)
    assert [f for f in storm if f.kind not in (*chaos.GATEWAY_KINDS, chaos.SPEC_REPLAY)] == [
        f for f in heavy if f.kind not in (*chaos.GATEWAY_KINDS, chaos.SPEC_REPLAY)
    ]
    outages = Counter(f.kind for f in storm)[chaos.STORE_OUTAGE]
    assert outages >= 4 and outages > Counter(f.kind for f in heavy)[chaos.STORE_OUTAGE]
    with pytest.raises(ValueError, match="at least two gateways"):
        chaos.schedule("storm", random.Random(seed), NODES, 3600)


@pytest.mark.parametrize(("seed", "gateways"), [(1, 1), (2, 3)])
def test_the_spec_replays_are_drawn_last_so_the_rest_of_a_schedule_is_what_it_was(
    seed: int, gateways: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = chaos.schedule("heavy", random.Random(seed), NODES, 1800, gateways)
    replays = [f for f in full if f.kind == chaos.SPEC_REPLAY]
    assert 25 <= len(replays) <= 80 and all(len(f.targets) == 1 and f.targets[0] in NODES for f in replays)
    monkeypatch.setattr(chaos, "_replays", lambda *_: [])
    assert chaos.schedule("heavy", random.Random(seed), NODES, 1800, gateways) == [
        f for f in full if f.kind != chaos.SPEC_REPLAY
    ]
