"""Aimed XIDs (`bc.sim.storms.aimed`, `bc.sim.storm_aim`): drawn after the storms, from the same Random, and moved
at their time to a GPU a booking holds or a GPU whose episode ended, never one with an open episode or kept out."""

from __future__ import annotations

import random

from bc.sim import chaos, storms
from bc.sim.chaos import Fault
from bc.sim.storm_aim import choose, ended, held

NODES = [f"n{i:03d}" for i in range(50)]


def test_aimed_xids_are_drawn_after_the_storms_and_replay() -> None:
    rng = random.Random(7)
    chaos.schedule("heavy", rng, NODES, 1800.0)
    before = storms.schedule(rng, NODES, 1800.0)
    aimed = storms.aimed(rng, NODES, 1800.0)
    again = random.Random(7)
    chaos.schedule("heavy", again, NODES, 1800.0)
    assert storms.schedule(again, NODES, 1800.0) == before  # the storms are what they were without the aims
    assert storms.aimed(again, NODES, 1800.0) == aimed
    assert {f.params["aim"] for f in aimed} == set(storms.AIMS) and all(f.kind == storms.GPU_XID for f in aimed)
    assert len(aimed) >= 20 and all(chaos.WARMUP_S <= f.t_s < 1800.0 for f in aimed)
    assert min(f.t_s for f in aimed if f.params["aim"] == storms.AIM_AGAIN) >= chaos.WARMUP_S + 240
    assert storms.aimed(random.Random(1), NODES, 100.0) == [] and storms.aimed(random.Random(1), [], 1800.0) == []


def booking(node: str, gpu: str, state: str = "active", start: int = 0, end: int | None = None) -> dict[str, object]:
    return {"node_id": node, "gpu_uuid": gpu, "state": state, "start_ms": start, "end_ms": end}


def test_held_gpus_are_an_active_reservations_live_bookings() -> None:
    rows = [
        booking("n1", "G0"),
        booking("n1", "G1", state="releasing"),
        booking("n2", "G0", start=1500),  # not started yet
        booking("n3", "G0", end=100),  # over
        booking("n4", "G2", start=0, end=2000),
    ]
    assert held(rows, 1000) == {("n1", "G0"), ("n4", "G2")}


def test_ended_takes_each_gpus_newest_episode() -> None:
    rows = [  # newest first, as `recent_episodes` returns them
        {"node_id": "n1", "gpu_uuid": "G0", "state": "quarantined"},
        {"node_id": "n1", "gpu_uuid": "G0", "state": "done"},
        {"node_id": "n2", "gpu_uuid": "G0", "state": "done"},
        {"node_id": "n3", "gpu_uuid": "G0", "state": "cleared"},
        {"node_id": "n4", "gpu_uuid": "", "state": "done"},  # a node episode: no GPU to strike
    ]
    assert ended(rows, "done") == {("n2", "G0")} and ended(rows, "cleared") == {("n3", "G0")}


def test_choose_moves_the_fault_to_the_first_pool_that_fits_or_leaves_it() -> None:
    f = Fault(100.0, storms.GPU_XID, ("n9",), {"gpu": 3, "xid": 79, "aim": storms.AIM_AGAIN})
    rng = random.Random(1)
    moved = choose(f, [{("n1", "G0")}, {("n2", "G5")}], {("n1", "G0")}, rng)
    assert moved.targets == ("n2",) and moved.params == {**f.params, "gpu": "G5"} and moved.t_s == f.t_s
    assert choose(f, [{("n1", "G0")}], {("n1", "G0")}, rng) == f
