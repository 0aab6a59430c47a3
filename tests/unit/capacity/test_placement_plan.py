"""The placement pass, case by case: first fit, backfill, windows, NUMA, capabilities, NoSchedule, never-fits."""

from __future__ import annotations

import random

import pytest

from bc.control.capacity.placement_plan import (
    CAP_INSTANCE,
    CAP_KUBERNETES,
    CAP_LIMITS,
    GIB,
    INSTANCE_WHOLE_GPUS,
    Failure,
    HostResources,
    Wait,
    plan,
)
from tests.unit.capacity.fleet import H, M, booking, indexes, node, outcome, placed, req, waiting

T0 = 1_800_000_000_000  # a store-clock instant on a whole hour


def test_first_fit_fills_the_lowest_node_in_gpu_order() -> None:
    p = plan([node("n2"), node("n1")], [], [req("r1", 2), req("r2", 2), req("r3", 2)], T0)
    assert [(placed(p, r).node_id, indexes(placed(p, r))) for r in ("r1", "r2", "r3")] == [
        ("n1", [0, 1]),
        ("n1", [2, 3]),
        ("n2", [0, 1]),
    ]
    assert placed(p, "r1").start_ms == T0 and placed(p, "r1").end_ms is None and placed(p, "r1").reason is None


def test_a_booking_takes_its_atoms_only_over_its_interval() -> None:
    held = [booking("x", "n1", [0, 1], T0, T0 + H)]
    p = plan([node("n1", 2)], held, [req("r1", 2, duration_ms=H), req("r2", 1, start_ms=T0 + H, duration_ms=H)], T0)
    assert waiting(p, "r1").earliest_start_ms == T0 + H  # fits when x ends
    # r2's window is exactly when r1 is held for: it may not delay r1, and its window is fixed, so it waits
    # with no start in sight; without r1 in front it is booked now for later.
    assert waiting(p, "r2") == Wait("r2", "no node with 1 free GPU from 2027-01-15T09:00:00Z")
    alone = plan([node("n1", 2)], held, [req("r2", 1, start_ms=T0 + H, duration_ms=H)], T0)
    assert placed(alone, "r2").reason == "starts at 2027-01-15T09:00:00Z"


def test_backfill_goes_first_only_when_it_delays_no_one() -> None:
    # n1: x holds GPUs 0-1 for 2 h, y holds GPU 2 for 1 h, GPU 3 is free now.
    held = [booking("x", "n1", [0, 1], T0, T0 + 2 * H), booking("y", "n1", [2], T0, T0 + H)]
    big = req("big", 4)  # open-ended; all four are free at T0+2h
    short = req("short", 1, duration_ms=30 * M)  # done long before big can start: backfilled
    long = req("long", 1, duration_ms=3 * H)  # would still hold GPU 3 at T0+2h: would delay big
    p = plan([node("n1")], held, [big, short, long], T0)
    assert waiting(p, "big").earliest_start_ms == T0 + 2 * H
    assert indexes(placed(p, "short")) == [3]
    w = waiting(p, "long")
    assert w.earliest_start_ms is None and w.held is None  # behind big's open-ended hold: no bounded start
    assert w.reason == "no node with 1 free GPU"
    # The earlier reservation's earliest start is what it would be without the later ones.
    alone = plan([node("n1")], held, [big], T0)
    assert waiting(alone, "big") == waiting(p, "big")


def test_an_unbounded_wait_protects_no_one() -> None:
    """Behind an open-ended hold, a big reservation cannot freeze the fleet for the small ones after it."""
    held = [booking("forever", "n1", [0, 1])]
    p = plan([node("n1")], held, [req("big", 4), req("small", 2)], T0)
    assert waiting(p, "big") == Wait("big", "no node with 4 free GPUs")
    assert indexes(placed(p, "small")) == [2, 3]


def test_a_window_that_starts_later_is_booked_now_and_waits_to_start() -> None:
    tonight = T0 + 10 * H
    p = plan([node("n1", 1)], [], [req("night", 1, start_ms=tonight, end_ms=tonight + 12 * H), req("now", 1)], T0)
    night = placed(p, "night")
    assert (night.start_ms, night.end_ms, night.reason) == (tonight, tonight + 12 * H, "starts at 2027-01-15T18:00:00Z")
    # The open-ended hold asked after it would overlap the window, so it waits until the window ends.
    assert waiting(p, "now").earliest_start_ms == tonight + 12 * H
    assert p.next_wake_ms == tonight


def test_disjoint_windows_share_a_gpu_and_a_short_hold_fits_before_a_window() -> None:
    a = req("a", 1, start_ms=T0 + 2 * H, duration_ms=H)
    b = req("b", 1, start_ms=T0 + 3 * H, duration_ms=H)
    c = req("c", 1, duration_ms=2 * H)
    p = plan([node("n1", 1)], [], [a, b, c], T0)
    assert [indexes(placed(p, r)) for r in "abc"] == [[0], [0], [0]]
    assert placed(p, "c").reason is None


def test_a_late_window_is_placed_for_what_is_left_of_it() -> None:
    held = [booking("x", "n1", [0], T0 - H, T0 + H)]
    r = req("r", 1, start_ms=T0 - 30 * M, end_ms=T0 + 3 * H)
    w = waiting(plan([node("n1", 1)], held, [r], T0), "r")
    assert w.earliest_start_ms == T0 + H and w.held is not None and w.held.end_ms == T0 + 3 * H
    p = placed(plan([node("n1", 1)], [], [r], T0 + H), "r")
    assert (p.start_ms, p.end_ms, p.reason) == (T0 + H, T0 + 3 * H, None)


def test_a_window_that_is_over_fails_and_a_booked_one_that_is_over_is_ended() -> None:
    held = [booking("done", "n1", [0], T0 - 2 * H, T0), booking("on", "n1", [1], T0 - H, T0 + H)]
    p = plan([node("n1")], held, [req("late", 1, start_ms=T0 - 2 * H, duration_ms=H)], T0)
    assert outcome(p, "late") == Failure(
        "late", "window-passed", "its window ended at 2027-01-15T07:00:00Z before it could be placed"
    )
    assert p.ended == ("done",)
    assert p.next_wake_ms == T0 + H


def test_never_fits_fails_at_once() -> None:
    fleet = [node("n1", 8), node("n2", 4, unhealthy=[0, 1, 2, 3])]
    p = plan(
        fleet,
        [],
        [
            req("nine", 9),
            req("named", 5, node_id="n2"),
            req("cpus", 1, host=HostResources(cpus=64)),
            req("sick", 4, node_id="n2"),  # unhealthy GPUs may heal: it waits
        ],
        T0,
    )
    assert outcome(p, "nine") == Failure("nine", "never-fits", "no node in the fleet has 9 GPUs")
    assert outcome(p, "named") == Failure("named", "never-fits", "node n2 has 4; 5 GPUs asked")
    assert outcome(p, "cpus") == Failure("cpus", "never-fits", "no node in the fleet has 1 GPU and 64 CPUs")
    assert waiting(p, "sick").reason == "node n2 does not have 4 free GPUs"


def test_numa_fit_pins_cpus_and_memory_to_the_gpus_numa_node() -> None:
    n1 = node("n1", 4, numa=2, cpus=32, mem_gib=128)  # GPUs 0-1 on NUMA 0, 2-3 on NUMA 1; 16 CPUs and 64 GiB each
    numa0_busy = booking("x", "n1", [0], host=HostResources(cpus=12), cpu_numa=(0,))
    r = req("r", 1, host=HostResources(cpus=8, memory_bytes=32 * GIB))
    p = placed(plan([n1], [numa0_busy], [r], T0), "r")
    assert (indexes(p), p.cpu_numa, p.mem_numa) == ([2], (1,), (1,))  # GPU 1 is free, but its NUMA node is not
    # With room on NUMA 0 it takes the first GPU there.
    p = placed(plan([n1], [], [r], T0), "r")
    assert (indexes(p), p.cpu_numa, p.mem_numa) == ([0], (0,), (0,))


def test_numa_pins_only_what_fits_and_spans_numa_nodes_when_it_must() -> None:
    n1 = node("n1", 4, numa=2, cpus=32, mem_gib=128)
    wide = placed(plan([n1], [], [req("wide", 1, host=HostResources(cpus=24, memory_bytes=8 * GIB))], T0), "wide")
    assert (wide.cpu_numa, wide.mem_numa) == ((), (0,))  # 24 CPUs fit the node, not one NUMA node
    split = [booking("a", "n1", [0]), booking("b", "n1", [2])]
    both = placed(plan([n1], split, [req("both", 2, host=HostResources(cpus=8))], T0), "both")
    assert (indexes(both), both.cpu_numa) == ([1, 3], (0, 1))


def test_host_resources_must_fit_the_node_at_every_instant() -> None:
    n1 = node("n1", 4, cpus=32)
    held = [booking("x", "n1", [0], T0 + H, T0 + 2 * H, host=HostResources(cpus=24))]
    p = plan([n1], held, [req("r", 1, duration_ms=3 * H, host=HostResources(cpus=16))], T0)
    assert waiting(p, "r").earliest_start_ms == T0 + 2 * H
    assert waiting(p, "r").reason == "no node with 1 free GPU and 16 CPUs"
    assert placed(plan([n1], held, [req("r", 1, duration_ms=H, host=HostResources(cpus=16))], T0), "r").end_ms == T0 + H


def test_capabilities_decide_which_nodes_take_limits_and_kubernetes() -> None:
    old = node("n1", caps=frozenset())
    limits = node("n2", caps=frozenset({CAP_LIMITS}))
    kube = node("n3", caps=frozenset({CAP_KUBERNETES}))
    fleet = [old, limits, kube]
    p = plan(
        fleet,
        [],
        [
            req("plain", 1),
            req("cpus", 1, host=HostResources(cpus=2)),
            req("k8s", 1, binding="kubernetes"),
            req("both", 1, binding="kubernetes", host=HostResources(cpus=2)),
        ],
        T0,
    )
    assert [placed(p, r).node_id for r in ("plain", "cpus", "k8s")] == ["n1", "n2", "n3"]
    assert waiting(p, "both").reason == "no node advertises binding.kubernetes and devices.limits"


def test_an_instance_binding_goes_only_where_vms_run_and_shares_the_holds_ledger() -> None:
    plain = node("n1", 2, caps=frozenset())
    vms = node("n2", 2, caps=frozenset({CAP_INSTANCE}))
    held = [booking("h", "n2", [0])]  # a hold on n2's GPU 0: an instance reservation never gets that GPU
    p = plan([plain, vms], held, [req("vm", 1, binding="instance"), req("vm2", 1, binding="instance")], T0)
    assert (placed(p, "vm").node_id, indexes(placed(p, "vm"))) == ("n2", [1])
    assert waiting(p, "vm2").reason == "no node with 1 free GPU"
    mig = plan([vms], [], [req("m", 1, binding="instance", device_class="gpu.mig")], T0)
    assert outcome(mig, "m") == Failure("m", "refused", INSTANCE_WHOLE_GPUS)


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        ({"connectivity": "disconnected"}, "node n1 is disconnected"),
        ({"connectivity": "unreachable"}, "node n1 is unreachable"),
        ({"connectivity": "new"}, "node n1 is new"),
        ({"cordoned": True}, "node n1 is cordoned"),
        ({"job_hold": "job-7"}, "node n1 is held by job job-7"),
    ],
)
def test_a_node_that_is_away_or_cordoned_takes_no_new_hold(facts: dict[str, object], why: str) -> None:
    held = [booking("kept", "n1", [0])]  # a hold it has stays booked: the pass never releases (I5)
    p = plan([node("n1", **facts), node("n2")], held, [req("auto", 1), req("named", 1, node_id="n1")], T0)
    assert placed(p, "auto").node_id == "n2"
    assert waiting(p, "named") == Wait("named", why)
    p = plan([node("n1", **facts)], held, [req("auto", 1)], T0)
    assert waiting(p, "auto").reason == f"no schedulable node: {why}"
    assert p.ended == ()


@pytest.mark.parametrize(
    ("facts", "why"),
    [({"revoked": True}, "node n1 is revoked; it can never bind a hold"), ({"deleted": True}, "node n1 is deleted")],
)
def test_naming_a_revoked_or_deleted_node_is_refused(facts: dict[str, object], why: str) -> None:
    p = plan([node("n1", **facts), node("n2")], [], [req("named", 1, node_id="n1"), req("auto", 4)], T0)
    assert outcome(p, "named") == Failure("named", "refused", why)
    assert placed(p, "auto").node_id == "n2"
    assert outcome(plan([node("n1")], [], [req("x", 1, node_id="n9")], T0), "x") == Failure(
        "x", "refused", "no node named 'n9'"
    )


def test_an_unhealthy_gpu_offers_nothing() -> None:
    p = plan([node("n1", 2, unhealthy=[0])], [], [req("a", 1), req("b", 1)], T0)
    assert indexes(placed(p, "a")) == [1]
    assert waiting(p, "b").reason == "no node with 1 free GPU"


def test_selectors_and_their_reasons() -> None:
    fleet = [node("n1", labels={"pool": "a100"}), node("n2", labels={"pool": "h100"})]
    p = plan(
        fleet,
        [booking("x", "n1", [0, 1, 2])],
        [req("a", 2, selector={"pool": "a100"}), req("t", 1, selector={"pool": "t4"})],
        T0,
    )
    assert waiting(p, "a").reason == "no node with 2 free GPUs in pool=a100"
    assert waiting(p, "t").reason == "no node matches pool=t4"


def test_the_same_facts_give_the_same_plan_in_any_order() -> None:
    fleet = [node(f"n{i}", 4, numa=2) for i in range(4)]
    held = [booking("x", "n0", [0, 1], T0, T0 + H), booking("y", "n2", [3], T0, None)]
    reqs = [req(f"r{i}", 1 + i % 4, duration_ms=(i % 3) * H or None, host=HostResources(cpus=i % 5)) for i in range(12)]
    first = plan(fleet, held, reqs, T0)
    rng = random.Random(3)
    for _ in range(5):
        assert (
            plan(rng.sample(fleet, len(fleet)), rng.sample(held, len(held)), rng.sample(reqs, len(reqs)), T0) == first
        )


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"device_class": "tpu"}, "unknown device class 'tpu'"),
        ({"binding": "vm"}, "unknown binding 'vm'; bindings are hold, kubernetes, instance"),
        ({"count": 0}, "a reservation needs at least one atom, not 0"),
        ({"duration_ms": 0}, "a duration must be positive, not 0 ms"),
        (
            {"start_ms": T0 + H, "end_ms": T0},
            "its window ends at 2027-01-15T08:00:00Z, before it starts at 2027-01-15T09:00:00Z",
        ),
        ({"host": HostResources(cpus=-1)}, "host resources cannot be negative"),
    ],
)
def test_the_pass_refuses_what_submit_should_have_refused(kw: dict[str, object], why: str) -> None:
    """Bad input is the API's to refuse at submit; the pass is total, so a row that slipped through fails."""
    fields: dict[str, object] = {"count": 1} | kw
    p = plan([node("n1")], [], [req("bad", **fields), req("good", 1)], T0)
    assert outcome(p, "bad") == Failure("bad", "refused", why)
    assert placed(p, "good").node_id == "n1"
