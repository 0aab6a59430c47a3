"""List replies stay under the frame budget (`views.fit_command_results`, `views.events_within`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bc.control.reads.views import events_within, fit_command_results
from bc.protocol.pb import admin_pb2


def reply_size(infos: list[admin_pb2.CommandInfo]) -> int:
    return admin_pb2.ListCommandsResponse(commands=infos).ByteSize()


@given(sizes=st.lists(st.integers(0, 50_000), max_size=30), budget=st.integers(20_000, 400_000))
def test_results_are_kept_in_order_while_they_fit(sizes: list[int], budget: int) -> None:
    infos = [admin_pb2.CommandInfo(id=f"c{i}", kind="diag.nvml", result_json="x" * n) for i, n in enumerate(sizes)]
    fitted = fit_command_results([admin_pb2.CommandInfo.FromString(i.SerializeToString()) for i in infos], budget)
    assert [f.id for f in fitted] == [i.id for i in infos]  # every command is listed
    assert reply_size(fitted) <= budget
    for orig, f in zip(infos, fitted, strict=True):
        assert (f.result_json == orig.result_json and not f.result_omitted) or (f.result_omitted and not f.result_json)
    # when everything fits (with the per-command slack the estimate allows), nothing is left out
    if reply_size(infos) + 10 * len(infos) <= budget:
        assert not any(f.result_omitted for f in fitted)


@given(sizes=st.lists(st.integers(0, 30_000), min_size=1, max_size=30), budget=st.integers(1, 200_000))
def test_events_stop_at_the_budget_and_never_return_nothing(sizes: list[int], budget: int) -> None:
    records = [admin_pb2.EventRecord(seq=i + 1, type="t", data_json="d" * n) for i, n in enumerate(sizes)]
    out = events_within(records, budget)
    assert out == records[: len(out)] and out
    assert len(out) == 1 or admin_pb2.ListEventsResponse(events=out).ByteSize() <= budget
