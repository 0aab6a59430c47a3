"""The self-update swap as a pure state machine: a crash (kill -9) after every step of the swap, and of the
rollback, leaves a node that starts on exactly one of its two binaries, and that start decides the outcome
from upgrade.json and the `current` link alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.upgrade.swap_rules import (
    FAILED_BEFORE,
    FORWARD,
    INTERRUPTED,
    NOT_NEWER,
    ROLLBACK,
    UPDATE_FAILED,
    WRONG_NAME,
    WRONG_PLATFORM,
    Disk,
    Installed,
    Offer,
    Plan,
    Record,
    Refused,
    Start,
    Step,
    SwapError,
    already_running,
    apply,
    on_start,
    refusal,
    remembered,
    run_steps,
    runnable,
    running_sequence,
)

OLD = Installed("1.0.0", 1)
PLAN = Plan(command_id="c1", version="1.1.0", sequence=2, deadline=100.0)


def fresh() -> Disk:
    return Disk(current="a", slots=frozenset({"a"}), record=Record(slots={"a": OLD}))


def boot(disk: Disk, now: float, welcomed: bool) -> tuple[Disk, str, tuple[str, str] | None]:
    """Start processes as Restart=always would until one stays up; (disk, slot it runs, what it reports)."""
    settle: tuple[str, str] | None = None
    for _ in range(5):
        d = on_start(disk, now)
        assert d.start is not Start.REFUSE, d.why
        disk = run_steps(disk, d.steps, PLAN)
        assert runnable(disk)
        settle = d.settle or settle
        if d.start is Start.ROLL_BACK:
            continue  # the steps ended in RESTART: the next process starts on the old binary
        if d.start is Start.PENDING:
            if welcomed:
                disk = apply(disk, Step.CONFIRM)
                return disk, disk.current, ("succeeded", "")
            now = disk.record.deadline  # the deadline passes in the running process: the rollback steps
            disk = run_steps(disk, ROLLBACK)
            continue
        return disk, disk.current, settle
    raise AssertionError("the node never settled on a binary")


@pytest.mark.parametrize("crash_after", range(len(FORWARD) + 1))
@pytest.mark.parametrize("welcomed", [True, False])
def test_a_crash_after_each_forward_step_starts_exactly_one_binary(crash_after: int, welcomed: bool) -> None:
    disk = run_steps(fresh(), FORWARD[:crash_after], PLAN)
    assert runnable(disk)
    disk, slot, settle = boot(disk, now=10.0, welcomed=welcomed)
    armed = crash_after >= FORWARD.index(Step.SWITCH) + 1
    if not armed and crash_after == FORWARD.index(Step.ARM) + 1:
        # armed but never switched: the old binary runs and the command is interrupted, not failed
        assert (slot, settle, disk.record.state) == ("a", ("failed", INTERRUPTED), "aborted")
        assert "1.1.0" not in disk.record.failed_versions
    elif not armed:
        assert (slot, settle, disk.record.state) == ("a", None, "idle")
    elif welcomed:
        assert (slot, settle, disk.record.state, disk.record.floor) == ("b", ("succeeded", ""), "confirmed", 2)
    else:
        assert (slot, settle, disk.record.state) == ("a", ("failed", UPDATE_FAILED), "failed")
        assert disk.record.failed_versions == ("1.1.0",)


@pytest.mark.parametrize("crash_after", range(len(ROLLBACK) + 1))
def test_a_crash_after_each_rollback_step_ends_on_the_old_binary(crash_after: int) -> None:
    disk = run_steps(fresh(), FORWARD, PLAN)
    disk = run_steps(disk, ROLLBACK[:crash_after])
    assert runnable(disk)
    disk, slot, settle = boot(disk, now=10.0, welcomed=True)
    if crash_after == 0:  # nothing of the rollback happened yet and the deadline has not passed
        assert (slot, settle) == ("b", ("succeeded", ""))
    else:
        assert (slot, settle, disk.record.state) == ("a", ("failed", UPDATE_FAILED), "failed")


def test_a_start_after_the_deadline_rolls_back_without_waiting() -> None:
    disk = run_steps(fresh(), FORWARD, PLAN)
    d = on_start(disk, now=PLAN.deadline)
    assert d.start is Start.ROLL_BACK and d.steps == ROLLBACK


def test_the_outcome_comes_from_the_link_not_the_binary() -> None:
    # A new binary that restarts itself repeatedly still finds pending + current on `to`: it never
    # reaches `failed` nor `confirmed` by itself; only a Welcome or the deadline decides.
    disk = run_steps(fresh(), FORWARD, PLAN)
    for _ in range(3):
        assert on_start(disk, now=1.0).start is Start.PENDING


def test_confirm_raises_the_floor_and_an_older_slot_is_refused() -> None:
    disk = apply(run_steps(fresh(), FORWARD, PLAN), Step.CONFIRM)
    assert disk.record.floor == 2
    flipped = replace(disk, current="a")  # someone points `current` back at the old slot by hand
    d = on_start(flipped, now=1.0)
    assert d.start is Start.REFUSE and "below this node's release floor 2" in d.why


HERE = "linux-x86_64"


def offer(version: str, sequence: int, name: str = "bc", platform: str = HERE) -> Offer:
    return Offer(name, version, sequence, platform)


def test_refusals() -> None:
    r = Record(floor=5, failed_versions=("2.0.0",), slots={"a": Installed("3.0.0", 5, "bc")})
    assert refusal(r, "a", offer("1.0.0", 4), HERE) == (
        NOT_NEWER,
        "release bc 1.0.0 (sequence 4) is not newer than the sequence 5 this node runs; a node never goes back"
        " (publish a newer release)",
    )
    assert refusal(r, "a", offer("2.0.0", 6), HERE)[0] == FAILED_BEFORE  # type: ignore[index]
    assert refusal(r, "a", offer("4.0.0", 7), HERE) is None
    assert refusal(replace(r, state="pending"), "a", offer("4.0.0", 7), HERE)[0] == UPDATE_FAILED  # type: ignore[index]


@pytest.mark.parametrize("sequence", [1, 4, 5])
def test_a_sequence_at_or_below_the_one_the_node_runs_is_refused(sequence: int) -> None:
    """TUF's rollback rule: the same sequence is refused as well as an older one (a replay)."""
    r = Record(floor=5, slots={"a": Installed("3.0.0", 5, "bc")})
    assert refusal(r, "a", offer("9.9.9", sequence), HERE)[0] == NOT_NEWER  # type: ignore[index]
    assert refusal(r, "a", offer("9.9.9", 6), HERE) is None


def test_the_sequence_a_node_runs_is_its_floor_or_its_slots_own() -> None:
    assert running_sequence(Record(floor=3, slots={"a": Installed("1", 2)}), "a") == 3
    assert running_sequence(Record(floor=3, slots={"a": Installed("1", 4)}), "a") == 4
    assert running_sequence(Record(), "a") == 0  # a first install: any signed release is newer
    assert refusal(Record(slots={"a": Installed("1.0.0", 0)}), "a", offer("1.0.0", 1), HERE) is None


def test_only_the_exact_release_the_node_runs_is_already_there() -> None:
    r = Record(floor=5, slots={"a": Installed("3.0.0", 5, "bc")})
    assert already_running(r, "a", offer("3.0.0", 5))
    assert not already_running(r, "a", offer("3.0.1", 5))  # the same sequence, another version: a replay
    assert not already_running(r, "a", offer("3.0.0", 6))
    assert not already_running(r, "a", offer("3.0.0", 5, name="other"))
    assert not already_running(Record(slots={"a": Installed("3.0.0", 0)}), "a", offer("3.0.0", 0))


def test_another_platform_or_release_name_is_refused() -> None:
    r = Record(floor=1, slots={"a": Installed("1.0.0", 1, "bc")})
    assert refusal(r, "a", offer("2.0.0", 2, platform="linux-aarch64"), HERE)[0] == WRONG_PLATFORM  # type: ignore[index]
    assert refusal(r, "a", offer("2.0.0", 2, name="bc-beta"), HERE)[0] == WRONG_NAME  # type: ignore[index]
    first = Record(slots={"a": Installed("1.0.0", 0)})  # a first install names no release: any name
    assert refusal(first, "a", offer("2.0.0", 2, name="bc-beta"), HERE) is None


def test_a_refusal_is_remembered_for_its_name_and_sequence_only() -> None:
    no = Refused("bc", 7, "2.0.0", "version-mismatch", "the staged binary says it is '1.9'")
    r = Record(refused=no)
    assert remembered(r, offer("2.0.0", 7)) == no
    assert remembered(r, offer("2.0.0", 8)) is None  # another release is offered
    assert remembered(r, offer("2.0.0", 7, name="bc-beta")) is None
    assert remembered(Record(), offer("2.0.0", 7)) is None
    assert Record.from_json(r.to_json()) == r


def test_place_records_the_release_name_of_the_slot() -> None:
    plan = replace(PLAN, name="bc")
    disk = run_steps(fresh(), FORWARD, plan)
    assert disk.record.slots["b"] == Installed("1.1.0", 2, "bc")
    assert Record.from_json(disk.record.to_json()) == disk.record


@pytest.mark.parametrize(
    ("disk", "step"),
    [
        (fresh(), Step.SWITCH),
        (fresh(), Step.CONFIRM),
        (fresh(), Step.PLACE),
        (fresh(), Step.FAIL),
        (run_steps(fresh(), FORWARD, PLAN), Step.ARM),
    ],
)
def test_illegal_steps_say_the_step_and_state(disk: Disk, step: Step) -> None:
    with pytest.raises(SwapError, match=f"can't {step.value.replace('-', ' ')} in state"):
        apply(disk, step, PLAN)


def test_the_record_round_trips_through_json() -> None:
    disk = run_steps(run_steps(fresh(), FORWARD, PLAN), ROLLBACK)
    assert Record.from_json(disk.record.to_json()) == disk.record
    with pytest.raises(ValueError, match="unknown state"):
        Record.from_json({"state": "sideways"})


@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=6), st.booleans())
def test_crashes_anywhere_even_during_recovery_keep_one_runnable_binary(crashes: list[int], welcomed: bool) -> None:
    """Crash after a few steps, then crash again part-way through each recovery: the link always names a
    whole binary, and once the crashes stop the node ends on `b` confirmed or on `a` with the version failed."""
    disk = run_steps(fresh(), FORWARD[: crashes[0] % (len(FORWARD) + 1)], PLAN)
    now = 10.0
    for k in crashes[1:]:
        d = on_start(disk, now)
        disk = run_steps(disk, d.steps[: k % (len(d.steps) + 1)], PLAN)
        assert runnable(disk)
    disk, slot, _settle = boot(disk, now, welcomed)
    assert runnable(disk)
    state = disk.record.state
    assert (slot, state) in {("a", "idle"), ("a", "aborted"), ("a", "failed"), ("b", "confirmed")}
    assert (slot == "b") == (state == "confirmed")
