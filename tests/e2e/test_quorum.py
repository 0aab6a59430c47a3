"""The destructive-batch quorum end to end: `bc serve`, `bc node` and the approvers' `bc`, all real processes.

What docs/quorum.md promises, through the CLI only (`--json`):

* a 2-of-3 batch of `gpu.reset` stays held with one approval, runs after the
  second, and runs exactly once per node even when `bc serve` is killed while
  the resets are in flight and the restarted gateway resumes them;
* once approvers exist, an unbatched destructive command is refused
  `UNBATCHED_LIMIT`, before and after the agent restarts;
* `bc approve list` / `show` show the waiting batch and every leaf, and one
  `bc approve reject` fails the batch: its commands end `cancelled`
  (`batch-rejected`) and never reach a node.

The fake GPUs count their resets in the node's data dir
(`FakeHardware.read_resets`); what a node did is read from its log.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.hw.fake import FakeHardware
from bc.protocol.pb import common_pb2

from .harness import Lab, assert_no_tracebacks, bring_up
from .test_commands import (
    assert_outcome,
    first_gpu,
    log_lines,
    node_log,
    show,
    wait_reconnected,
    wait_settled,
    wait_state,
)

APPROVERS = ("alice", "bob", "carol")


# -- helpers ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Approver:
    """A person: their approver key file and the client config `bc operators add` wrote for them."""

    name: str
    key: Path
    config: Path

    def env(self) -> dict[str, str]:
        return {"BC_CONFIG": str(self.config)}


def add_operator(lab: Lab, name: str, role: str = "operator") -> Path:
    """`bc operators add NAME --role ROLE --out FILE`: the config to hand to that person."""
    out = lab.root / "operators" / f"{name}.bc-config.json"
    out.parent.mkdir(exist_ok=True)
    doc = lab.bc("operators", "add", name, "--role", role, "--out", str(out))
    assert doc["operator"]["role"] == role and out.stat().st_mode & 0o777 == 0o600, doc
    return out


def approve_change(lab: Lab, change_id: str, signers: list[Approver]) -> dict[str, Any]:
    """`bc approve sign q-…` by each signer, as themselves, until the change applies."""
    doc: dict[str, Any] = {}
    for a in signers:
        doc = lab.bc("approve", "sign", change_id, "--key", str(a.key), "--yes", env=a.env())
        if doc["state"] == "applied":
            break
    assert doc.get("state") == "applied", doc
    return doc


def settle(lab: Lab, doc: dict[str, Any], signers: list[Approver]) -> dict[str, Any]:
    """After `bc approvers …`: a pending quorum change is signed by the approvers already there."""
    change = doc.get("change") or {}
    if change.get("state") == "pending":
        approve_change(lab, change["id"], signers)
        return dict(lab.bc("approvers"))
    return doc


def add_approvers(lab: Lab, names: tuple[str, ...] = APPROVERS, k: int = 2) -> dict[str, Approver]:
    """For each person: `bc operators add`, `bc approve keygen` (on "their own machine"), `bc approvers add`
    (a quorum change the approvers already there sign), then `bc approvers threshold k`."""
    people: dict[str, Approver] = {}
    for name in names:
        config = add_operator(lab, name)
        path = lab.root / "approvers" / f"{name}.key"
        path.parent.mkdir(exist_ok=True)
        key = lab.bc("approve", "keygen", "--out", str(path))
        assert key["key_id"].startswith("sha256:") and path.stat().st_mode & 0o777 == 0o600, key
        settle(lab, lab.bc("approvers", "add", name, key["public_key"]), list(people.values()))
        people[name] = Approver(name, path, config)
    doc = settle(lab, lab.bc("approvers", "threshold", str(k)), list(people.values()))
    assert doc["threshold"] == k and sorted(a["name"] for a in doc["approvers"]) == sorted(names), doc
    return people


def held_bundle(lab: Lab, node_id: str) -> common_pb2.TrustBundle:
    """The trust bundle the node holds (identity.json, written whole by the agent)."""
    doc = json.loads((lab.node_dir(node_id) / "identity.json").read_text())
    return common_pb2.TrustBundle.FromString(base64.b64decode(doc.get("trust_bundle_b64", "")))


def wait_approvers_held(lab: Lab, node_ids: list[str], n: int, k: int) -> None:
    """The approver set reached the running nodes (pushed to live sessions within a second)."""
    for node_id in node_ids:

        def holds(node_id: str = node_id) -> bool:
            b = held_bundle(lab, node_id)
            return len(b.approver_keys) == n and b.quorum_k == k

        lab.wait_for(f"{node_id} to hold {n} approver keys with k={k}", holds, timeout=15)


def create_reset_batch(lab: Lab, gpus: dict[str, str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """`bc batch create --kind gpu.reset --nodes … --payload @p.json`: one payload naming each node's GPU."""
    payload = lab.root / "p.json"
    payload.write_text(json.dumps({"gpu_uuids": sorted(gpus.values())}))
    nodes = ",".join(gpus)
    doc = lab.bc(
        "batch",
        "create",
        "--kind",
        "gpu.reset",
        "--nodes",
        nodes,
        "--payload",
        f"@{payload}",
        "--reason",
        "XID 79",
        env=env,
    )
    assert doc["id"].startswith("b-") and doc["state"] == "pending", doc
    assert [leaf["node_id"] for leaf in doc["leaves"]] == list(gpus), doc
    return dict(doc)


def sign(lab: Lab, batch_id: str, who: Approver) -> dict[str, Any]:
    """`bc approve sign` on the approver's own machine: their key, their operator config."""
    doc = lab.bc("approve", "sign", batch_id, "--key", str(who.key), "--yes", env=who.env())
    assert doc["id"] == batch_id, doc
    return dict(doc)


def resets(lab: Lab, node_id: str) -> dict[str, int]:
    return FakeHardware.read_resets(lab.node_dir(node_id))


def start_nodes(lab: Lab, node_ids: list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """Serve, join and start each node (hgx-h100-8) with `env`; wait until all converge; their first GPUs."""
    lab.serve()
    for node_id in node_ids:
        lab.join(node_id)
        lab.node(node_id, env=env)
    for node_id in node_ids:
        lab.wait_converged(node_id)
    return {node_id: first_gpu(lab, node_id) for node_id in node_ids}


# -- a 2-of-3 batch --------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_2_of_3_reset_batch_is_held_then_runs_once_per_node_across_a_gateway_restart(lab: Lab) -> None:
    nodes = ["n1", "n2"]
    gpus = start_nodes(lab, nodes, env={"BC_FAKE_GPU_RESET_S": "4"})  # long enough to kill serve mid-reset
    keys = add_approvers(lab)
    wait_approvers_held(lab, nodes, 3, 2)

    batch = create_reset_batch(lab, gpus)
    bid = batch["id"]
    cmds = {leaf["node_id"]: leaf["command_id"] for leaf in batch["leaves"]}

    one = sign(lab, bid, keys["alice"])
    assert (one["state"], one["approvals"], one["threshold"]) == ("pending", 1, 2), one
    for n in nodes:
        doc = show(lab, cmds[n])
        assert (doc["state"], doc["batch_id"]) == ("pending", bid), doc
    # Held, not merely slow: a later command on each node is dispatched, runs and succeeds past it.
    for n in nodes:
        assert lab.bc("cmd", "run", n, "inventory.refresh", "--wait")["state"] == "succeeded"
        assert show(lab, cmds[n])["state"] == "pending"
        assert resets(lab, n) == {}

    epochs = {n: lab.show(n)["session_epoch"] for n in nodes}
    two = sign(lab, bid, keys["bob"])
    assert (two["state"], two["approvals"]) == ("approved", 2), two
    for n in nodes:
        wait_state(lab, cmds[n], "running", timeout=15)

    # The gateway dies with both resets in flight; the restarted one resumes the sessions and their commands.
    lab.kill("serve")
    assert {n: resets(lab, n) for n in nodes} == {n: {gpus[n]: 1} for n in nodes}
    lab.restart("serve")
    for n in nodes:
        assert_outcome(wait_settled(lab, cmds[n], timeout=30), "succeeded")
        wait_reconnected(lab, n, epochs[n])

    for n in nodes:
        assert resets(lab, n) == {gpus[n]: 1}, f"{n} reset {resets(lab, n)}"
        accepted = log_lines(lab, cmds[n], "command.accepted", node_id=n)
        assert len(accepted) == 1, f"{n} accepted the reset {len(accepted)} times:\n" + "\n".join(accepted)
        assert len(log_lines(lab, cmds[n], "command.running", node_id=n)) == 1
    final = lab.bc("batch", "show", bid)
    assert final["state"] == "approved" and {leaf["command_state"] for leaf in final["leaves"]} == {"succeeded"}
    assert {d["name"] for d in final["decisions"]} == {"alice", "bob"}
    assert_no_tracebacks(lab)


# -- unbatched destructive commands ----------------------------------------------------------------


def unbatched_refused(lab: Lab, kind: str, *args: str) -> dict[str, Any]:
    r = lab.run("cmd", "run", "n1", kind, *args, "--wait", "--json", timeout=60)
    assert r.returncode == 8, f"exited {r.returncode}: stdout={r.stdout!r} stderr={r.stderr!r}"
    doc = json.loads(r.stdout)
    assert_outcome(doc, "rejected", "UNBATCHED_LIMIT")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rejected: UNBATCHED_LIMIT" in errors[0], r.stderr
    return dict(doc)


@pytest.mark.e2e
def test_an_unbatched_reboot_is_refused_once_approvers_exist_also_after_an_agent_restart(lab: Lab) -> None:
    before = bring_up(lab, {"n1": "hgx-h100-8"})["n1"]
    boot_file = lab.node_dir("n1") / "fake-boot-id"
    boot = boot_file.read_text() if boot_file.exists() else ""
    add_approvers(lab)
    wait_approvers_held(lab, ["n1"], 3, 2)

    refused = [unbatched_refused(lab, "node.reboot")["id"]]
    gpu = first_gpu(lab)
    refused.append(unbatched_refused(lab, "gpu.reset", "--payload", json.dumps({"gpu_uuids": [gpu]}))["id"])

    # The agent restarts (its allowance lives in its data dir, its approver set in identity.json).
    lab.kill("node-n1")
    lab.restart("node-n1")
    after = wait_reconnected(lab, "n1", before["session_epoch"])
    refused.append(unbatched_refused(lab, "node.reboot")["id"])

    assert after["boot_id"] == before["boot_id"], "the node rebooted"
    assert (boot_file.read_text() if boot_file.exists() else "") == boot
    assert resets(lab, "n1") == {}
    for cid in refused:
        assert log_lines(lab, cid, "command.accepted") == [], f"{cid} was accepted"
    # Non-destructive kinds are not limited.
    assert lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait")["state"] == "succeeded"
    assert_no_tracebacks(lab)


# -- list, show, reject ----------------------------------------------------------------------------


@pytest.mark.e2e
def test_approvers_see_the_waiting_batch_and_one_rejection_cancels_it(lab: Lab) -> None:
    nodes = ["n1", "n2"]
    gpus = start_nodes(lab, nodes)
    keys = add_approvers(lab)
    wait_approvers_held(lab, nodes, 3, 2)
    batch = create_reset_batch(lab, gpus)
    bid = batch["id"]
    cmds = {leaf["node_id"]: leaf["command_id"] for leaf in batch["leaves"]}

    waiting = [b for b in lab.bc("approve", "list") if b["id"] == bid]
    assert len(waiting) == 1, lab.bc("approve", "list")
    assert (waiting[0]["state"], waiting[0]["approvals"], waiting[0]["threshold"]) == ("pending", 0, 2)
    assert waiting[0]["requested_by"] == "local" and waiting[0]["reason"] == "XID 79"

    shown = lab.bc("approve", "show", bid)
    assert len(shown["scope_root"]) == 64 and shown["kind"] == "gpu.reset"
    assert [(leaf["index"], leaf["node_id"], leaf["kind"]) for leaf in shown["leaves"]] == [
        (0, "n1", "gpu.reset"),
        (1, "n2", "gpu.reset"),
    ]
    digests = {leaf["payload_digest"] for leaf in shown["leaves"]}
    assert len(digests) == 1 and len(digests.pop()) == 64  # one payload, one digest for every leaf
    assert {leaf["command_id"]: leaf["command_state"] for leaf in shown["leaves"]} == {
        c: "pending" for c in cmds.values()
    }
    text = lab.bc("approve", "show", bid, json=False)
    assert "LEAVES" in text and shown["scope_root"] in text
    for n in nodes:
        assert n in text and cmds[n] in text

    sign(lab, bid, keys["alice"])
    bob = keys["bob"]
    rejected = lab.bc("approve", "reject", bid, "--key", str(bob.key), "--reason", "wrong nodes", env=bob.env())
    assert rejected["state"] == "rejected", rejected
    assert {(d["name"], d["decision"], d["reason"]) for d in rejected["decisions"]} == {
        ("alice", "approve", ""),
        ("bob", "reject", "wrong nodes"),
    }
    for n in nodes:
        doc = show(lab, cmds[n])
        assert_outcome(doc, "cancelled", "batch-rejected")
    assert not [b for b in lab.bc("approve", "list") if b["id"] == bid]
    carol = keys["carol"]
    late = lab.run("approve", "sign", bid, "--key", str(carol.key), "--yes", env=carol.env())
    assert late.returncode == 2 and "is rejected; there is nothing to sign" in late.stderr, late.stderr

    # Later commands reach both nodes; the batch's never did.
    for n in nodes:
        assert lab.bc("cmd", "run", n, "inventory.refresh", "--wait")["state"] == "succeeded"
        assert resets(lab, n) == {}
        assert cmds[n] not in node_log(lab, n), f"{n} saw the rejected batch's command"
    assert_no_tracebacks(lab)
