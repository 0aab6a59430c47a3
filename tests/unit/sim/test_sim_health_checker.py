"""H1, the health reconciler's checker, on hand-made health facts: it passes a good set and names the
counterexample of each kind of bad one; a Hypothesis property holds its node cap against a brute-force count."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bc.sim.checkers import check_all
from bc.sim.facts import FactLog
from bc.sim.health_checker import (
    ActedTwice,
    OverHourly,
    OverNodeCap,
    ReleasedByReconciler,
    ResetUnderHold,
    SameLabel,
    check_h1,
)
from bc.sim.health_facts import (
    EpisodeRun,
    GpuHold,
    HealthFacts,
    HealthLimits,
    HealthReset,
    HoldReleased,
)

T0 = 1_800_000_000_000
LIM = HealthLimits(max_nodes=2, max_fleet_percent=10, per_label="", max_actions_per_hour=4, fleet_size=50)


def ep(eid: str, node: str, gpu: str = "GPU-a", *, q: int = 0, start: int | None = 10, end: int | None = 100,
       esc: tuple[int, ...] = ()) -> EpisodeRun:  # fmt: skip
    starts = () if start is None else (T0 + start * 1000,)
    return EpisodeRun(eid, node, gpu, T0 + q * 1000, starts, tuple(T0 + e * 1000 for e in esc),
                      None if end is None else T0 + end * 1000, "done" if end is not None else "")  # fmt: skip


def test_a_good_run_holds_and_h1_is_checked_only_with_health_facts() -> None:
    h = HealthFacts(limits=LIM, episodes=[ep("h1", "n1"), ep("h2", "n2"), ep("h3", "n3", start=100, end=200)])
    assert check_h1(h) is None
    assert "H1" not in [r.id for r in check_all(FactLog())]
    results = check_all(FactLog(health=h))
    assert [r.id for r in results][-1] == "H1" and results[-1].ok


def test_more_nodes_than_the_cap_at_one_instant() -> None:
    h = HealthFacts(limits=LIM, episodes=[ep("h1", "n1"), ep("h2", "n2", start=20), ep("h3", "n3", start=30)])
    found = check_h1(h)
    assert isinstance(found, OverNodeCap)
    assert found.node_ids == ("n1", "n2", "n3") and found.cap == 2 and found.at_ms == T0 + 30_000
    assert "3 nodes in remediation at once" in found.sentence and "n3" in found.sentence


def test_two_gpus_of_one_node_count_the_node_once_and_an_end_frees_its_place() -> None:
    h = HealthFacts(
        limits=LIM,
        episodes=[ep("h1", "n1"), ep("h2", "n1", "GPU-b"), ep("h3", "n2"), ep("h4", "n3", start=100, end=None)],
    )
    assert check_h1(h) is None


def test_fleet_percent_caps_a_small_fleet_to_one_node() -> None:
    small = HealthLimits(max_nodes=5, max_fleet_percent=10, per_label="", max_actions_per_hour=9, fleet_size=12)
    assert small.node_cap == 1
    found = check_h1(HealthFacts(limits=small, episodes=[ep("h1", "n1"), ep("h2", "n2", start=50)]))
    assert isinstance(found, OverNodeCap) and found.cap == 1


def test_per_label() -> None:
    lim = HealthLimits(5, 100, "rack", 9, 50)
    labels = {"n1": {"rack": "r1"}, "n2": {"rack": "r1"}, "n3": {"rack": "r2"}}
    ok = HealthFacts(limits=lim, labels=labels, episodes=[ep("h1", "n1"), ep("h3", "n3")])
    assert check_h1(ok) is None
    bad = HealthFacts(limits=lim, labels=labels, episodes=[ep("h1", "n1"), ep("h2", "n2", start=40)])
    found = check_h1(bad)
    assert isinstance(found, SameLabel) and {found.node_id, found.other} == {"n1", "n2"}
    assert "rack=r1" in found.sentence


def test_hourly_actions_count_starts_and_escalations_in_a_rolling_hour() -> None:
    eps = [ep(f"h{i}", f"n{i}", start=i * 100, end=i * 100 + 50) for i in range(1, 5)]
    assert check_h1(HealthFacts(limits=LIM, episodes=eps)) is None  # 4 in the hour
    eps.append(ep("h9", "n9", start=3000, end=3100, esc=(3050,)))
    found = check_h1(HealthFacts(limits=LIM, episodes=eps))
    assert isinstance(found, OverHourly) and found.actions == 5 and found.at_ms == T0 + 3_000_000
    later = [ep(f"h{i}", f"n{i}", start=i * 2000, end=i * 2000 + 50) for i in range(1, 8)]
    assert check_h1(HealthFacts(limits=LIM, episodes=later)) is None  # never more than 4 in any hour


def test_a_hold_released_under_an_open_episode_without_an_operator() -> None:
    e = ep("h1", "n1", q=5, start=10, end=100)
    rel = HoldReleased(T0 + 50_000, "r-1", "n1", ("GPU-a",), by_operator=False)
    found = check_h1(HealthFacts(limits=LIM, episodes=[e], releases=[rel]))
    assert isinstance(found, ReleasedByReconciler)
    assert "r-1" in found.sentence and "h1" in found.sentence and "no operator" in found.sentence
    asked = HoldReleased(T0 + 50_000, "r-1", "n1", ("GPU-a",), by_operator=True)
    other_gpu = HoldReleased(T0 + 50_000, "r-2", "n1", ("GPU-b",), by_operator=False)
    after = HoldReleased(T0 + 200_000, "r-3", "n1", ("GPU-a",), by_operator=False)
    assert check_h1(HealthFacts(limits=LIM, episodes=[e], releases=[asked, other_gpu, after])) is None


def test_a_reset_under_a_live_hold() -> None:
    hold = GpuHold("r-1", "n1", "GPU-a", T0, T0 + 60_000)
    reset = HealthReset(T0 + 30_000, "n1", "GPU-a", "c-1", "h1")
    found = check_h1(HealthFacts(limits=LIM, resets=[reset], holds=[hold]))
    assert isinstance(found, ResetUnderHold) and found.at_ms == T0 + 30_000
    assert "c-1" in found.sentence and "r-1" in found.sentence
    after = HealthReset(T0 + 60_000, "n1", "GPU-a", "c-2", "h1")  # the hold's end is not held
    elsewhere = HealthReset(T0 + 30_000, "n1", "GPU-b", "c-3", "h1")
    assert check_h1(HealthFacts(limits=LIM, resets=[after, elsewhere], holds=[hold])) is None
    refused = HealthReset(T0 + 30_000, "n1", "GPU-a", "c-4", "h1", done=False)  # sent; the node said gpu-busy
    found = check_h1(HealthFacts(limits=LIM, resets=[refused], holds=[hold]))
    assert isinstance(found, ResetUnderHold) and "was sent to reset (the node refused it" in found.sentence


def test_each_episode_is_acted_on_once() -> None:
    twice = EpisodeRun("h1", "n1", "GPU-a", T0, (T0 + 1, T0 + 2), (), T0 + 10, "done")
    found = check_h1(HealthFacts(limits=LIM, episodes=[twice]))
    assert isinstance(found, ActedTwice) and "started 2 remediations" in found.sentence
    overlap = [ep("h1", "n1", q=0, end=100), ep("h2", "n1", q=50, start=None, end=60)]
    found = check_h1(HealthFacts(limits=LIM, episodes=overlap))
    assert isinstance(found, ActedTwice) and "while episode h1 was still open" in found.sentence
    after = EpisodeRun("h2", "n1", "GPU-a", T0 + 100_000, (), (), T0 + 100_000, "quarantined")  # a repeat
    again = [ep("h1", "n1", q=0, end=100), after]
    assert check_h1(HealthFacts(limits=LIM, episodes=again)) is None


def test_a_gpu_sick_again_within_the_repeat_window_is_quarantined_as_it_opens() -> None:
    window = HealthLimits(2, 10, "", 4, 50, repeat_window_s=600)
    first = ep("h1", "n1", q=0, start=10, end=100)
    queued = EpisodeRun("h2", "n1", "GPU-a", T0 + 300_000, (), (), None, "")  # waiting to be remediated again
    found = check_h1(HealthFacts(limits=window, episodes=[first, queued]))
    assert isinstance(found, ActedTwice) and found.episode.episode_id == "h2" and found.at_ms == T0 + 300_000
    assert "queued to be remediated again within the repeat window of episode h1's start" in found.sentence
    started = [first, ep("h2", "n1", q=300, start=320, end=400)]
    assert isinstance(check_h1(HealthFacts(limits=window, episodes=started)), ActedTwice)
    at_once = EpisodeRun("h2", "n1", "GPU-a", T0 + 300_000, (), (), T0 + 300_000, "quarantined")
    assert check_h1(HealthFacts(limits=window, episodes=[first, at_once])) is None
    past = [first, ep("h2", "n1", q=610, start=620, end=700)]  # 600 s after h1's start
    assert check_h1(HealthFacts(limits=window, episodes=past)) is None
    cleared = [ep("h1", "n1", q=0, start=None, end=100), ep("h2", "n1", q=300, start=320, end=400)]  # never started
    other_gpu = [first, ep("h2", "n1", "GPU-b", q=300, start=320, end=400)]
    assert check_h1(HealthFacts(limits=window, episodes=cleared)) is None
    assert check_h1(HealthFacts(limits=window, episodes=other_gpu)) is None


def test_the_first_violation_in_time_is_named() -> None:
    hold = GpuHold("r-1", "n1", "GPU-a", T0, None)
    late = HealthReset(T0 + 90_000, "n1", "GPU-a", "c-1", "h1")
    eps = [ep("h1", "n1"), ep("h2", "n2", start=20), ep("h3", "n3", start=30)]
    found = check_h1(HealthFacts(limits=LIM, episodes=eps, resets=[late], holds=[hold]))
    assert isinstance(found, OverNodeCap)


spans = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 500), st.integers(1, 300), st.booleans()), min_size=0, max_size=12
)


@given(spans, st.integers(1, 4))
def test_the_node_cap_matches_a_brute_force_count_at_every_second(
    runs: list[tuple[int, int, int, bool]], cap: int
) -> None:
    lim = HealthLimits(cap, 100, "", 1 << 30, 50)
    eps = [
        ep(f"h{i}", f"n{node}", f"GPU-{i}", q=start, start=start, end=None if open_ else start + length)
        for i, (node, start, length, open_) in enumerate(runs)
    ]
    over = False
    for t in range(900):
        at = T0 + t * 1000
        if len({e.node_id for e in eps if e.running_at(at)}) > cap:
            over = True
            break
    found = check_h1(HealthFacts(limits=lim, episodes=eps))
    assert isinstance(found, OverNodeCap) == over
    if found is not None:
        assert len(found.node_ids) > cap
