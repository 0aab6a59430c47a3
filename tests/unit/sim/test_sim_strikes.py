"""The strikes' draws (`bc.sim.strikes`): chances by moment and kind, one draw per moment, nothing at `none`."""

from __future__ import annotations

import random
from collections import Counter

from bc.sim import strikes
from bc.sim.strikes import ACCEPT, START, Strikes


def tally(s: Strikes, moment: str, n: int, once_only: bool = False) -> Counter[str]:
    out: Counter[str] = Counter()
    for i in range(n):
        hit = s.at(moment, f"n{i % 7}", f"c{i}", once_only=once_only)
        out[hit.kind if hit is not None else "none"] += 1
    return out


def test_heavy_strikes_acceptances_and_starts_at_their_chances() -> None:
    n = 20_000
    accept = tally(Strikes("heavy", random.Random(1), gateways=3), ACCEPT, n)
    assert abs(accept[strikes.DUPLICATE_AFTER_ACCEPT] / n - 0.15) < 0.01
    assert abs(accept[strikes.CUT_AT_ACCEPT] / n - 0.10) < 0.01
    assert abs(accept[strikes.GATEWAY_KILL_AT_ACCEPT] / n - 0.05) < 0.01
    start = tally(Strikes("heavy", random.Random(2)), START, n)
    assert set(start) == {strikes.CRASH_WHILE_RUNNING, strikes.POWER_LOSS_WHILE_RUNNING, "none"}
    once = tally(Strikes("heavy", random.Random(3)), START, n, once_only=True)
    assert once["none"] / n < 0.15  # a command that must not run twice is struck as it starts, mostly


def test_one_gateway_is_never_killed_and_light_strikes_a_tenth_and_none_never() -> None:
    n = 20_000
    one = tally(Strikes("heavy", random.Random(4), gateways=1), ACCEPT, n)
    assert strikes.GATEWAY_KILL_AT_ACCEPT not in one
    light = tally(Strikes("light", random.Random(5)), ACCEPT, n)
    assert 0.02 < 1 - light["none"] / n < 0.04  # a tenth of heavy's 0.30
    assert tally(Strikes("none", random.Random(6)), ACCEPT, 1000) == Counter({"none": 1000})


def test_the_same_seed_strikes_the_same_moments_with_the_same_params() -> None:
    def run(seed: int) -> list[object]:
        s = Strikes("heavy", random.Random(seed), gateways=2)
        return [s.at(ACCEPT if i % 2 else START, "n1", f"c{i}") for i in range(500)]

    assert run(9) == run(9) and run(9) != run(10)
    hits = [h for h in run(9) if h is not None]
    assert hits and all(h.node_id == "n1" for h in hits)
    power = [h for h in hits if h.kind == strikes.POWER_LOSS_WHILE_RUNNING]
    assert power and all(30 <= float(h.params["down_s"]) <= 120 for h in power)
