"""`bc cmd fanout` end to end: one `EnqueueCommands` call to real `bc node` processes, followed to the end.

* `--wait --json` exits 0 once every node's command succeeded, each object as `bc cmd show --json`
  prints it, with progress lines on stderr;
* a call naming a node that does not exist is refused whole: one sentence naming the member, exit 3,
  and no node runs anything;
* `--all --wait` exits 8 when a command fails on the nodes (an empty `gpu.reset` is `invalid-payload`),
  still printing the table, and no GPU is reset.
"""

from __future__ import annotations

import json

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up
from .test_commands import resets


@pytest.mark.e2e
def test_fanout_wait_all_or_nothing_and_exit_codes(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8", "n2": "l4-slots-4"})

    ok = lab.run("cmd", "fanout", "inventory.refresh", "--nodes", "n1,n2", "--wait", "--json", timeout=60)
    assert ok.returncode == 0, f"exited {ok.returncode}: {ok.stderr!r}"
    docs = json.loads(ok.stdout)
    assert [(d["node_id"], d["state"]) for d in docs] == [("n1", "succeeded"), ("n2", "succeeded")], docs
    assert all(d["id"] and isinstance(d["result"], dict) for d in docs), docs
    progress = ok.stderr.strip().splitlines()
    assert progress and progress[-1] == "inventory.refresh on 2 nodes: 2 succeeded", ok.stderr

    before = [c["id"] for c in lab.bc("cmd", "list")]
    refused = lab.run("cmd", "fanout", "inventory.refresh", "--nodes", "n1,ghost,n2")
    lines = refused.stderr.splitlines()
    assert refused.returncode == 3, f"exited {refused.returncode}: {refused.stderr!r}"
    assert lines == ["error: command 2 of 3 (inventory.refresh on 'ghost'): no node named 'ghost'"], lines
    assert [c["id"] for c in lab.bc("cmd", "list")] == before, "a refused fanout stored commands"

    bad = lab.run("cmd", "fanout", "gpu.reset", "--all", "--payload", '{"gpu_uuids": []}', "--wait", timeout=60)
    assert bad.returncode == 8, f"exited {bad.returncode}: {bad.stderr!r}"
    rows = [line.split() for line in bad.stdout.splitlines()]
    assert rows[0] == ["ID", "NODE", "SEQ", "STATE"], bad.stdout
    assert sorted((r[1], r[3], r[4]) for r in rows[1:]) == [
        ("n1", "failed", "(invalid-payload)"),
        ("n2", "failed", "(invalid-payload)"),
    ], bad.stdout
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: 2 of 2 commands did not succeed (2 failed)"), bad.stderr
    assert resets(lab, "n1") == {} and resets(lab, "n2") == {}
    assert_no_tracebacks(lab)
