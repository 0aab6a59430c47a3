"""Named operators, approver keys bound to them, and quorum changes, end to end: `bc serve`, `bc node` and
each person's own `bc` (`BC_CONFIG=<their config>`), all real processes.

What docs/quorum.md promises, through the CLI only:

* `bc operators add bob --role viewer` writes a config bob uses as is; bob
  lists nodes but `bc reserve` and `bc cmd run` are refused exit 6 with a
  sentence naming the role; an operator-role person makes no join tokens; a
  revoked operator is refused; `BC_CONFIG` naming a missing file is exit 2;
* an approval counts only when sent under the certificate of the operator its
  key is registered to: not under another operator's, and not by a requester
  whose own key was re-added under another name for another operator;
* with approvers present, a threshold change waits for k approvals of the
  current approvers and only then reaches the nodes.
"""

from __future__ import annotations

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up
from .test_quorum import (
    Approver,
    add_approvers,
    add_operator,
    approve_change,
    create_reset_batch,
    held_bundle,
    sign,
    wait_approvers_held,
)


def refused(lab: Lab, code: int, env: dict[str, str], *args: str) -> str:
    """`bc ARGS` as someone else: exit `code`, one `error:` line on stderr, which is returned."""
    r = lab.run(*args, env=env)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == code, f"`bc {' '.join(args)}` exited {r.returncode}: {r.stderr!r}"
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    return errors[0]


@pytest.mark.e2e
def test_roles_decide_what_each_person_may_do_and_a_revoked_operator_is_refused(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")  # joined, never started: enough to list and to aim at

    bob_cfg = add_operator(lab, "bob", role="viewer")
    bob = {"BC_CONFIG": str(bob_cfg)}
    assert [n["node_id"] for n in lab.bc("nodes", env=bob)] == ["n1"]
    assert lab.bc("nodes", "show", "n1", env=bob)["node_id"] == "n1"
    line = refused(lab, 6, bob, "reserve", "--gpus", "1")
    assert line == "error: reserving GPUs needs the operator role; operator bob has the viewer role", line
    line = refused(lab, 6, bob, "cmd", "run", "n1", "diag.nvml")
    assert line == "error: running a command needs the operator role; operator bob has the viewer role", line
    assert lab.bc("cmd", "list") == [] and lab.bc("reservations") == []

    carol = {"BC_CONFIG": str(add_operator(lab, "carol", role="operator"))}
    line = refused(lab, 6, carol, "token", "create", "--node-id", "n2")
    assert line == "error: creating a join token needs the admin role; operator carol has the operator role", line
    queued = lab.bc("cmd", "run", "n1", "inventory.refresh", env=carol)
    assert queued["requested_by"] == "carol" and lab.bc("cmd", "show", queued["id"])["requested_by"] == "carol"
    enqueued = [e for e in lab.bc("events", "--type", "command.enqueued") if e["subject"] == queued["id"]]
    assert enqueued[0]["data"]["operator"] == "carol", enqueued

    lab.bc("operators", "revoke", "bob", "--reason", "left the team")
    line = refused(lab, 6, bob, "nodes")
    assert line == "error: operator bob was revoked (left the team); ask an admin for a new config", line
    listed = {o["name"]: o for o in lab.bc("operators")}
    assert listed["bob"]["revoked"] and not listed["carol"]["revoked"] and listed["local"]["role"] == "admin"

    missing = lab.root / "missing.json"
    line = refused(lab, 2, {"BC_CONFIG": str(missing)}, "nodes")
    assert line == f"error: BC_CONFIG names {missing}, which is not a file; fix BC_CONFIG or unset it", line
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_an_approval_counts_only_under_the_certificate_of_the_keys_own_operator(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    lab.join("n2")
    people = add_approvers(lab)  # alice, bob, carol; k = 2
    signers = list(people.values())

    # mallory (an operator) holds an approver key; it is removed, then re-added as "m2" for operator dave.
    mallory = Approver("mallory", lab.root / "approvers" / "mallory.key", add_operator(lab, "mallory"))
    pub = lab.bc("approve", "keygen", "--out", str(mallory.key))["public_key"]
    add_operator(lab, "dave")
    approve_change(lab, lab.bc("approvers", "add", "mallory", pub)["change"]["id"], signers)
    approve_change(lab, lab.bc("approvers", "remove", "mallory")["change"]["id"], signers)
    readded = lab.bc("approvers", "add", "m2", pub, "--operator", "dave")
    assert "add approver m2" in readded["change"]["summary"] and "operator dave" in readded["change"]["summary"]
    approve_change(lab, readded["change"]["id"], signers)
    assert {a["name"]: a["operator"] for a in lab.bc("approvers")["approvers"]}["m2"] == "dave"

    # mallory asks for a batch and signs it with her old key: it is dave's now, and the requester's anyway.
    gpus = {"n1": "GPU-aaaa", "n2": "GPU-bbbb"}
    batch = create_reset_batch(lab, gpus, env=mallory.env())
    assert batch["requested_by"] == "mallory"
    line = refused(lab, 6, mallory.env(), "approve", "sign", batch["id"], "--key", str(mallory.key), "--yes")
    assert "approver key m2 is registered to operator dave" in line and "not mallory's" in line, line

    # bob holds a copy of alice's key file: under bob's certificate it counts for nothing.
    alice, bob = people["alice"], people["bob"]
    line = refused(lab, 6, bob.env(), "approve", "sign", batch["id"], "--key", str(alice.key), "--yes")
    assert "approver key alice is registered to operator alice" in line and "not bob's" in line, line
    assert lab.bc("batch", "show", batch["id"])["approvals"] == 0
    assert sign(lab, batch["id"], alice)["approvals"] == 1
    done = sign(lab, batch["id"], bob)
    assert done["state"] == "approved" and {d["operator"] for d in done["decisions"]} == {"alice", "bob"}
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_a_threshold_change_needs_k_approvals_and_only_then_reaches_the_nodes(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    people = add_approvers(lab)
    wait_approvers_held(lab, ["n1"], 3, 2)

    doc = lab.bc("approvers", "threshold", "3")
    change = doc["change"]
    assert (doc["threshold"], change["state"], change["threshold"]) == (2, "pending", 2), doc
    assert [c["id"] for c in lab.bc("approve", "list")] == [change["id"]]
    text = lab.bc("approve", "show", change["id"], json=False)
    assert "set k from 2 to 3" in text and "WHO MAY SIGN" in text, text

    one = lab.bc("approve", "sign", change["id"], "--key", str(people["alice"].key), "--yes", env=people["alice"].env())
    assert (one["state"], one["approvals"]) == ("pending", 1), one
    assert lab.bc("approvers")["threshold"] == 2 and held_bundle(lab, "n1").quorum_k == 2

    two = lab.bc("approve", "sign", change["id"], "--key", str(people["carol"].key), "--yes", env=people["carol"].env())
    assert two["state"] == "applied", two
    assert lab.bc("approvers")["threshold"] == 3
    wait_approvers_held(lab, ["n1"], 3, 3)
    last = held_bundle(lab, "n1").quorum_changes[-1]
    assert last.change_id == change["id"] and len(last.signatures) == 2
    changed = [e for e in lab.bc("events", "--type", "quorum.changed") if e["subject"] == change["id"]]
    assert changed and changed[0]["data"]["operator"] == "carol", changed  # the write the last approval made
    assert_no_tracebacks(lab)
