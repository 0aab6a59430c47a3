"""`bc cmd fanout` and the nodes that are away: named at once, left out with `--skip-away`, and `--wait`
ending at the commands' `not_after` with each one's state, against real `bc serve` and `bc node` processes.

n1 runs; n2 joined and never started (`new`). A fan-out to all names n2 on stderr before it queues anything;
`--wait --not-after 3s` ends a few seconds later (not at the 10-minute default it used to wait out) with n1
succeeded and n2 expired, exit 8; `--skip-away` queues nothing for n2 and exits 0.
"""

from __future__ import annotations

import time

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up


@pytest.mark.e2e
def test_away_nodes_are_named_skipped_on_request_and_waited_for_until_not_after(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    lab.join("n2")  # joined, never connected
    assert {n["node_id"]: n["state"] for n in lab.bc("nodes")} == {"n1": "connected", "n2": "new"}

    t0 = time.monotonic()
    r = lab.run("cmd", "fanout", "inventory.refresh", "--all", "--wait", "--not-after", "3s", timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 8, r.stderr
    err = r.stderr.splitlines()
    assert err[0] == (
        "1 node away: n2 (new: never connected); their commands wait for them until --not-after (3s), "
        "--skip-away leaves them out"
    ), r.stderr
    rows = sorted(line.split()[1:] for line in r.stdout.splitlines()[1:])
    assert [(row[0], row[2]) for row in rows] == [("n1", "succeeded"), ("n2", "expired")], r.stdout
    assert err[-1].startswith("error: 1 of 2 commands did not succeed (1 expired); the first, "), r.stderr
    assert took < 30, f"--wait took {took:.0f} s for a 3 s not_after"

    skipped = lab.run("cmd", "fanout", "inventory.refresh", "--all", "--skip-away", "--wait", "--json", timeout=60)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stderr.splitlines()[0] == "skipping 1 node away (--skip-away): n2 (new: never connected)"
    assert [c["node_id"] for c in lab.bc("cmd", "list", "--node", "n2")] == ["n2"]  # only the first fan-out's
    assert_no_tracebacks(lab)
