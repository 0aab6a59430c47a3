"""V1 (`bc.sim.checkers.check_v1`), pure: no sample in which a GPU a CDI hold names is passed through to a VM."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bc.sim.checkers import HeldAndPassed, check_all, check_v1
from bc.sim.facts import FactLog, GpuUse
from bc.sim.instances import section_for

GPUS = ["GPU-a", "GPU-b", "GPU-c"]


def use(at: int, node: str, held: set[str], passed: dict[str, str]) -> GpuUse:
    return GpuUse(at, node, frozenset(held), tuple(sorted(passed.items())))


def test_the_first_sample_with_a_gpu_both_held_and_passed_through() -> None:
    uses = [
        use(3_000, "n2", {"GPU-a"}, {"GPU-a": "vm-2"}),
        use(1_000, "n1", {"GPU-a"}, {"GPU-b": "vm-1"}),  # two GPUs of one node: fine
        use(2_000, "n1", {"GPU-b"}, {"GPU-b": "vm-1"}),
    ]
    found = check_v1(uses)
    assert found == HeldAndPassed(uses[2], "GPU-b", "vm-1")
    assert (
        found.sentence == "V1: GPU GPU-b on n1 is both held (a CDI hold names it) and passed through to instance vm-1"
    )


def test_v1_is_checked_only_when_the_run_sampled_gpus() -> None:
    facts = FactLog()
    assert "V1" not in [r.id for r in check_all(facts)]
    facts.gpu_uses = [use(5, "n1", {"GPU-a"}, {"GPU-a": "vm"})]
    (v1,) = [r for r in check_all(facts) if r.id == "V1"]
    assert not v1.ok and v1.at_ms == 5 and v1.entities == ("n1",)


samples = st.builds(
    use,
    st.integers(0, 100),
    st.sampled_from(["n1", "n2"]),
    st.sets(st.sampled_from(GPUS)),
    st.dictionaries(st.sampled_from(GPUS), st.sampled_from(["vm-1", "vm-2"])),
)


@given(st.lists(samples, max_size=8))
def test_v1_fails_exactly_when_some_sample_overlaps(uses: list[GpuUse]) -> None:
    overlaps = [u for u in uses if u.held & {g for g, _ in u.passed}]
    assert (check_v1(uses) is None) == (not overlaps)


def test_the_synced_section_names_each_live_instance_reservation_once() -> None:
    text = section_for([("res-2", "alloc-2", ("GPU-b",)), ("res-1", "alloc-1", ("GPU-a", "GPU-c"))])
    assert text.index('"alloc-1"') < text.index('"alloc-2"') and '"gpus": ["GPU-a", "GPU-c"]' in text
