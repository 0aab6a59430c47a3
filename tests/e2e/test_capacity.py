"""A window end to end (issue 13): reserved to start in 5 s it is pending, goes active on time, ends on
time, and its usage matches the window to the millisecond."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up

ON_TIME_MS = 2000  # the bound: active within 2 s of the start, ended within 2 s of the end


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.e2e
def test_a_window_goes_active_and_ends_on_time_and_bills_exactly(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    start_ms = (int(time.time() * 1000) // 1000 + 5) * 1000
    res = lab.bc("reserve", "--gpus", "2", "--node", "n1", "--start", iso(start_ms), "--duration", "5s")
    assert res["state"] == "pending" and res["reason"].startswith("starts at "), res
    assert (int(res["start_ms"]), int(res["end_ms"])) == (start_ms, start_ms + 5000), res

    lab.wait_reservation_state(res["id"], "active", timeout=15)
    (placed,) = [e for e in lab.events("reservation.placed") if e["subject"] == res["id"]]
    assert 0 <= int(placed["at_ms"]) - start_ms <= ON_TIME_MS, placed

    ended = lab.wait_reservation_state(res["id"], "ended", timeout=15)
    assert ended["reason"] == "window-ended", ended
    (end,) = [e for e in lab.events("reservation.ended") if e["subject"] == res["id"]]
    assert 0 <= int(end["at_ms"]) - (start_ms + 5000) <= ON_TIME_MS, end

    (row,) = lab.bc("usage", "--by", "reservation")
    assert (row["reservation"], row["atom_ms"], row["atom_seconds"]) == (res["id"], 2 * 5000, 10.0), row
    assert_no_tracebacks(lab)
