"""`bc usage` in the units people bill in: a whole GPU, a MIG instance (by profile) and a shared slot are
three classes, never added together as GPU-hours; JSON and CSV carry the class (every older key kept), and
`bc nodes show` says the same. Real `bc serve` and two `bc node` processes: n1 with MIG (mig-a100-4: GPU 0
split 3g.40gb + 2g.20gb + 2g.20gb, GPUs 2 and 3 whole), n2 with shared slots (l4-slots-4).
"""

from __future__ import annotations

import csv
import io

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up

OLD_KEYS = ["atom_ms", "atom_seconds", "windows"]


@pytest.mark.e2e
def test_usage_is_reported_per_class_in_its_own_unit(lab: Lab) -> None:
    bring_up(lab, {"n1": "mig-a100-4", "n2": "l4-slots-4"})
    whole = lab.bc("reserve", "--gpus", "1", "--node", "n1", "--tenant", "acme")
    mig = lab.bc("reserve", "--gpus", "2", "--class", "gpu.mig", "--node", "n1", "--tenant", "acme")
    slots = lab.bc("reserve", "--gpus", "2", "--class", "gpu.slot", "--node", "n2", "--tenant", "acme")
    for r in (whole, mig, slots):
        lab.wait_reservation_state(r["id"], "active")
    for r in (whole, mig, slots):  # usage ends at each release's commit: the figures stay put from here
        lab.bc("release", r["id"])

    by_res = lab.bc("usage", "--by", "reservation")
    for row in by_res:
        assert list(row)[:4] == ["reservation", *OLD_KEYS], row  # the older keys first, as they were
        assert row["hours"] == pytest.approx(row["atom_ms"] / 3_600_000), row
    classes = {(r["reservation"], r["class"], r["profile"], r["unit"]) for r in by_res}
    assert classes == {
        (whole["id"], "gpu", "", "GPU-hours"),
        (mig["id"], "gpu.mig", "2g.20gb", "instance-hours"),
        (mig["id"], "gpu.mig", "3g.40gb", "instance-hours"),
        (slots["id"], "gpu.slot", "", "slot-hours"),
    }
    mig_rows = [r for r in by_res if r["reservation"] == mig["id"]]
    assert mig_rows[0]["atom_ms"] == mig_rows[1]["atom_ms"] > 0  # one instance of each profile, side by side

    by_tenant = lab.bc("usage", "--by", "tenant")
    assert [(r["tenant"], r["class"], r["profile"]) for r in by_tenant] == [
        ("acme", "gpu", ""),
        ("acme", "gpu.mig", "2g.20gb"),
        ("acme", "gpu.mig", "3g.40gb"),
        ("acme", "gpu.slot", ""),
    ]
    per_class = {(r["class"], r["profile"]): r["atom_ms"] for r in by_tenant}
    assert per_class == {(r["class"], r["profile"]): r["atom_ms"] for r in by_res}

    table = lab.bc("usage", "--by", "tenant", json=False)
    lines = [line.split() for line in table.splitlines()]
    assert lines[0] == ["TENANT", "CLASS", "USAGE", "ATOM-SECONDS", "WINDOWS"], table
    assert [line[1:4] for line in lines[1:]] == [
        ["gpu", f"{per_class[('gpu', '')] / 3_600_000:.3f}", "GPU-hours"],
        ["gpu.mig", "2g.20gb", f"{per_class[('gpu.mig', '2g.20gb')] / 3_600_000:.3f}"],
        ["gpu.mig", "3g.40gb", f"{per_class[('gpu.mig', '3g.40gb')] / 3_600_000:.3f}"],
        ["gpu.slot", f"{per_class[('gpu.slot', '')] / 3_600_000:.3f}", "slot-hours"],
    ], table

    rows = list(csv.reader(io.StringIO(lab.bc("usage", "--by", "node", "--csv", json=False))))
    assert rows[0] == ["node", "atom_seconds", "windows", "class", "profile", "hours", "unit"]
    assert sorted((r[0], r[3], r[4], r[6]) for r in rows[1:]) == [
        ("n1", "gpu", "", "GPU-hours"),
        ("n1", "gpu.mig", "2g.20gb", "instance-hours"),
        ("n1", "gpu.mig", "3g.40gb", "instance-hours"),
        ("n2", "gpu.slot", "", "slot-hours"),
    ]

    shown = lab.bc("nodes", "show", "n1", json=False)
    usage = shown.split("USAGE (all recorded)\n", 1)[1].split("\n\n", 1)[0].splitlines()
    hours = {(c, p): f"{ms / 3_600_000:.3f}" for (c, p), ms in per_class.items()}
    assert [line.split() for line in usage] == [
        ["CLASS", "USED"],
        ["gpu", hours[("gpu", "")], "GPU-hours"],
        ["gpu.mig", "2g.20gb", hours[("gpu.mig", "2g.20gb")], "instance-hours", "(2g.20gb)"],
        ["gpu.mig", "3g.40gb", hours[("gpu.mig", "3g.40gb")], "instance-hours", "(3g.40gb)"],
    ], shown
    assert_no_tracebacks(lab)
