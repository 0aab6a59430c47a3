"""The health reconciler end to end (issue 34): `bc serve` and fake-GPU `bc node` processes, faults injected
through the fake hardware's faults file (agent/hw/fake_faults.py), everything read back through the CLI as an
operator would: `bc health --json`, `bc jobs`, `bc nodes show`, `bc events`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up
from .test_health import write_faults


def health(lab: Lab) -> dict[str, Any]:
    doc = lab.bc("health")
    assert isinstance(doc, dict), doc
    return doc


@pytest.mark.e2e
def test_an_injected_xid_leads_to_exactly_one_remediation_job_held_within_the_limits(lab: Lab) -> None:
    docs = bring_up(lab, {"n1": "hgx-h100-8", "n2": "hgx-h100-8"})
    before = health(lab)
    assert before["policy_version"] == 0 and before["enabled"] is False  # nothing acts before a policy is set
    policy = lab.bc("health", "policy", "set", json.dumps({"limits": {"max_nodes": 1}}), "--reason", "e2e")
    assert policy["version"] == 1 and policy["policy"]["limits"]["max_nodes"] == 1

    sick = {n: docs[n]["inventory"]["gpus"][0]["uuid"] for n in ("n1", "n2")}
    held = lab.wait_reservation_state(lab.bc("reserve", "--gpus", "8", "--node", "n1")["id"], "active")
    write_faults(lab, "n1", f"xid79:{sick['n1']}")

    # n1's remediation starts and its drain waits for the hold on the GPU: no reset, and the hold stays.
    def n1_running() -> dict[str, Any] | None:
        h = health(lab)
        return h if [e["node_id"] for e in h["running"]] == ["n1"] else None

    h = lab.wait_for("n1's remediation running", n1_running, 30)
    first = h["running"][0]
    assert first["rule"] == "xid:79" and first["gpu_uuid"] == sick["n1"] and first["stage"] == "reset"
    assert f"GPU {sick['n1']} cordoned" in lab.show("n1")["no_schedule"]
    job = lab.wait_job(first["dag_id"], "its drain waiting for the hold", lambda d: held["id"] in json.dumps(d), 30)
    assert {n["id"]: n["state"] for n in job["nodes"]}["reset:n1"] == "queued"

    # Beyond max_nodes, n2's condition waits in the queue with the reason.
    write_faults(lab, "n2", f"xid79:{sick['n2']}")

    def n2_queued() -> dict[str, Any] | None:
        h = health(lab)
        return h if [e["node_id"] for e in h["queue"]] == ["n2"] and h["queue"][0]["wait_reason"] else None

    h = lab.wait_for("n2's remediation queued", n2_queued, 30)
    assert h["queue"][0]["wait_reason"] == "1 of at most 1 node(s) are in remediation"
    assert h["limits"]["nodes"] == 1 and h["limits"]["node_cap"] == 1
    assert lab.reservation(held["id"])["state"] == "active"  # type: ignore[index]
    assert [c for c in lab.bc("cmd", "list", "--node", "n1") if c["kind"] == "gpu.reset"] == []

    lab.bc("release", held["id"])  # a person ends the hold; the reconciler never does

    # Both end done, one after the other: each GPU reset once, and returned to placement.
    def both_done() -> dict[str, Any] | None:
        h = health(lab)
        return h if not h["running"] and not h["queue"] and len(h["recent"]) == 2 else None

    h = lab.wait_for("both remediations done", both_done, 90)
    assert {e["state"] for e in h["recent"]} == {"done"}
    assert h["cordons"] == []
    resets = [c for n in ("n1", "n2") for c in lab.bc("cmd", "list", "--node", n) if c["kind"] == "gpu.reset"]
    assert sorted(c["node_id"] for c in resets) == ["n1", "n2"]  # each sick GPU reset once
    jobs = [j for j in lab.bc("jobs", "list", "--all") if j["template"] == "remediate"]
    assert sorted(j["subjects"][0] for j in jobs) == ["n1", "n2"]  # exactly one job per condition
    assert {j["state"] for j in jobs} == {"done"}
    assert {j["requested_by"] for j in jobs} == {"health-reconciler"}

    events = lab.events("health.remediation.")
    order = [
        (e["type"], e["data"]["node"])
        for e in events
        if e["type"] in ("health.remediation.started", "health.remediation.done")
    ]
    # never two nodes in remediation at once: each start follows the previous one's end
    assert [t for t, _ in order] == [
        "health.remediation.started",
        "health.remediation.done",
        "health.remediation.started",
        "health.remediation.done",
    ], order
    for n in ("n1", "n2"):
        doc = lab.show(n)
        assert not [r for r in doc["no_schedule"] if "cordoned" in r or "unhealthy" in r], doc["no_schedule"]
    assert_no_tracebacks(lab)
