"""`bc.control.capacity.placement_rows`: whatever a stored pending row holds, `admit` never raises, and what it lets
through the planner plans without raising, every instant it computes fitting an int64."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bc.control.capacity.placement_pass import request_of
from bc.control.capacity.placement_plan import GpuInfo, NodeInfo, Placement, plan
from bc.control.capacity.placement_rows import admit, row_problem

INT64 = st.integers(-(2**63), 2**63 - 1)
NUMBERS = st.one_of(INT64, st.integers(-5, 5), st.none(), st.integers(2**63, 2**80), st.text(max_size=5))
NOW = 1_796_000_000_000
NODE = NodeInfo("n1", gpus=tuple(GpuInfo(i, f"GPU-{i}") for i in range(8)))

rows = st.fixed_dictionaries(
    {
        "id": st.just("res-x"),
        "seq": st.integers(1, 10),
        "gpus": NUMBERS,
        "device_class": st.sampled_from(["gpu", "gpu.mig", "gpu.slot", "tpu", ""]),
        "want_node_id": st.sampled_from([None, "n1", "n9"]),
        "selector": st.sampled_from(["{}", '{"pool": "a"}', "not json", None, "[1]"]),
        "start_ms": NUMBERS,
        "end_ms": NUMBERS,
        "duration_ms": NUMBERS,
        "cpus": NUMBERS,
        "memory_bytes": NUMBERS,
        "hugepages_1g": NUMBERS,
        "binding": st.sampled_from(["hold", "kubernetes", "lease"]),
        "avoid_nodes": st.sampled_from([None, "[]", '["n1"]', "{"]),
        "created_at_ms": st.one_of(st.just(NOW), INT64),
    }
)


@given(row=rows)
def test_any_row_is_admitted_or_set_aside_and_the_planner_takes_what_is_admitted(row: dict[str, Any]) -> None:
    queue, aside = admit([row], request_of)
    assert len(queue) + len(aside) == 1
    if aside:
        assert aside[0].reservation_id == "res-x" and aside[0].problem
        return
    assert row_problem(row) is None
    p = plan([NODE], [], queue, NOW)
    for o in p.outcomes:
        if isinstance(o, Placement):
            assert 0 <= o.start_ms < 2**63 and (o.end_ms is None or o.start_ms < o.end_ms < 2**63)
    assert p.next_wake_ms is None or p.next_wake_ms < 2**63
