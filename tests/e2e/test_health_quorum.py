"""The health reconciler under the quorum end to end (issue 34): `bc serve`, a fake-GPU `bc node` and two
approvers' own `bc approve` processes, each with their own key file and operator config.

* An injected XID leads to exactly one remediation job, held within the limits, whose `gpu.reset` batch waits
  in `bc approve list` (its reason names the condition) until two real `bc approve sign` processes signed it;
  then the reset runs on the node once.
* A health policy version that pre-approves `gpu.reset` for the node's pool, once the same two approvers
  signed it, lets the reset run with no approver step: no batch of its own, and the node checked the signed
  version itself (its log says so).

The fake GPUs count their resets in the node's data dir (`FakeHardware.read_resets`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up
from .test_commands import log_lines, node_log
from .test_health import write_faults
from .test_quorum import add_approvers, resets, sign, wait_approvers_held


def health(lab: Lab) -> dict[str, Any]:
    doc = lab.bc("health")
    assert isinstance(doc, dict), doc
    return doc


def wait_done(lab: Lab, node: str, timeout: float = 90) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        h = health(lab)
        ended = [e for e in h["recent"] if e["node_id"] == node]
        return ended[0] if ended and not h["running"] and not h["queue"] else None

    return lab.wait_for(f"{node}'s remediation to end", done, timeout)


def remediate_jobs(lab: Lab) -> list[dict[str, Any]]:
    return [j for j in lab.bc("jobs", "list", "--all") if j["template"] == "remediate"]


def reset_commands(lab: Lab, node: str) -> list[dict[str, Any]]:
    return [c for c in lab.bc("cmd", "list", "--node", node) if c["kind"] == "gpu.reset"]


@pytest.mark.e2e
def test_an_xids_remediation_batch_is_approved_by_two_real_approvers_then_the_reset_runs_once(lab: Lab) -> None:
    docs = bring_up(lab, {"n1": "hgx-h100-8"})
    people = add_approvers(lab, ("alice", "bob"), k=2)
    wait_approvers_held(lab, ["n1"], 2, 2)
    lab.bc("health", "policy", "set", json.dumps({"limits": {"max_nodes": 1}}), "--reason", "e2e")
    gpu = docs["n1"]["inventory"]["gpus"][0]["uuid"]
    write_faults(lab, "n1", f"xid79:{gpu}")

    def batch_waiting() -> dict[str, Any] | None:
        waiting = [b for b in lab.bc("approve", "list") if b.get("kind") == "gpu.reset"]
        return waiting[0] if waiting else None

    batch = lab.wait_for("the remediation's batch in bc approve list", batch_waiting, 30)
    assert "xid:79" in batch["reason"] and gpu in batch["reason"] and batch["requested_by"] == "health-reconciler"
    assert [leaf["node_id"] for leaf in batch["leaves"]] == ["n1"]
    h = health(lab)
    assert [e["node_id"] for e in h["running"]] == ["n1"] and h["limits"]["nodes"] == 1  # within the limits
    (job,) = remediate_jobs(lab)
    assert job["state"] == "running" and job["subjects"] == ["n1"]

    one = sign(lab, batch["id"], people["alice"])  # a real `bc approve` process, as alice, with her key
    assert (one["state"], one["approvals"], one["threshold"]) == ("pending", 1, 2), one
    assert resets(lab, "n1") == {} and [c["state"] for c in reset_commands(lab, "n1")] == ["pending"]
    two = sign(lab, batch["id"], people["bob"])
    assert (two["state"], two["approvals"]) == ("approved", 2), two

    ended = wait_done(lab, "n1")
    assert ended["state"] == "done", ended
    assert resets(lab, "n1") == {gpu: 1}  # the reset ran on the node once
    (cmd,) = reset_commands(lab, "n1")
    assert cmd["state"] == "succeeded" and cmd["batch_id"] == batch["id"]
    assert len(log_lines(lab, cmd["id"], "command.accepted", node_id="n1")) == 1
    (job,) = remediate_jobs(lab)  # exactly one job for the condition
    assert job["state"] == "done"
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_a_signed_pre_approval_lets_the_pools_reset_run_with_no_approver_step(lab: Lab) -> None:
    docs = bring_up(lab, {"n1": "hgx-h100-8"})
    lab.bc("nodes", "label", "n1", "pool=a")
    people = add_approvers(lab, ("alice", "bob"), k=2)
    wait_approvers_held(lab, ["n1"], 2, 2)
    expires = int(time.time() * 1000) + 3_600_000
    policy = {
        "limits": {"max_nodes": 1},
        "preapprove": [{"kind": "gpu.reset", "pool": {"pool": "a"}, "expires_at_ms": expires}],
    }
    lab.bc("health", "policy", "set", json.dumps(policy), "--reason", "pool a heals itself")
    shown = lab.bc("health", "policy", "show")
    pending = shown["preapproval"]
    assert (pending["state"], pending["approvals"], pending["threshold"]) == ("pending", 0, 2), shown
    assert [e["state"] for e in pending["entries"]] == ["waiting-for-approvals"]
    text = lab.bc("approve", "list", json=False)
    assert pending["batch_id"] in text and "health policy v1 pre-approves gpu.reset in pool pool=a" in text

    # The same two people sign the version, each with their own `bc approve`, before anything is sick.
    sign(lab, pending["batch_id"], people["alice"])
    assert lab.bc("health", "policy", "show")["preapproval"]["state"] == "pending"
    sign(lab, pending["batch_id"], people["bob"])
    signed = lab.bc("health", "policy", "show")["preapproval"]
    assert (signed["state"], [e["state"] for e in signed["entries"]]) == ("approved", ["in-force"]), signed

    gpu = docs["n1"]["inventory"]["gpus"][0]["uuid"]
    write_faults(lab, "n1", f"xid79:{gpu}")
    ended = wait_done(lab, "n1")
    assert ended["state"] == "done", ended
    assert resets(lab, "n1") == {gpu: 1}
    (cmd,) = reset_commands(lab, "n1")
    assert cmd["state"] == "succeeded" and not cmd.get("batch_id")  # no batch of its own: no approver step
    assert [b["kind"] for b in lab.bc("batch", "list")] == ["health.preapprove"]
    (started,) = [e for e in lab.events("health.remediation.started")]
    assert started["data"]["approval"].startswith("pre-approved by health policy v1 (gpu.reset in pool pool=a")
    assert f"event=quorum.preapproved command={cmd['id']}" in node_log(lab, "n1")  # the node checked it itself
    assert_no_tracebacks(lab)
