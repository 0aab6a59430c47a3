"""The identity lifecycle over real processes: revocation, cloned identities, signed intent, `bc doctor`."""

from __future__ import annotations

import shutil
import time
from typing import Any

import pytest

from .harness import Lab, assert_no_tracebacks, bring_up


def events(lab: Lab, type_prefix: str, subject: str = "") -> list[dict[str, Any]]:
    docs = lab.bc("events", "--type", type_prefix)
    assert isinstance(docs, list), docs
    return [d for d in docs if not subject or d.get("subject") == subject]


@pytest.mark.e2e
def test_a_revoked_node_is_out_within_5_seconds_and_does_not_redial(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    res = lab.bc("reserve", "--gpus", "1", "--node", "n1")
    lab.wait_reservation_state(res["id"], "active")
    epoch = lab.show("n1")["session_epoch"]

    started = time.monotonic()
    doc = lab.bc("nodes", "revoke", "n1", "--reason", "stolen laptop")
    assert doc["revoked"] is True and doc["revoke_reason"] == "stolen laptop"
    lab.wait_for("n1 disconnected", lambda: lab.show("n1")["state"] != "connected", timeout=5.0)
    elapsed = time.monotonic() - started
    assert elapsed < 5.0, elapsed

    # The agent was told why and stops using the certificate: it exits rather than redial.
    code = lab.procs["node-n1"].popen.wait(timeout=10)
    assert code != 0
    assert "certificate revoked: stolen laptop" in lab.log("node-n1")
    assert lab.show("n1")["session_epoch"] == epoch  # no new session was ever opened
    assert events(lab, "security.node.revoked", "n1")

    # Started again, it refuses to dial with a revoked identity and says how to recover.
    again = lab.run("node", "--data-dir", str(lab.node_dir("n1")), "--fake-hw", "hgx-h100-8")
    assert again.returncode != 0
    assert "revoked" in again.stderr and "bc join --reset --yes" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    # Nothing was released: the reservation and its CDI hold are still there.
    assert lab.reservation(res["id"])["state"] == "active"  # type: ignore[index]
    assert lab.cdi_path("n1", res["allocation_id"]).exists()
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_two_machines_with_one_identity_are_quarantined(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    res = lab.bc("reserve", "--gpus", "1", "--node", "n1")
    lab.wait_reservation_state(res["id"], "active")

    # A copied key: the identity and certificate go to another "machine" (its own journal and boot id).
    clone = lab.root / "clone"
    clone.mkdir()
    for name in ("identity.json", "node.key", "node.crt", "ca.crt"):
        shutil.copy2(lab.node_dir("n1") / name, clone / name)
    lab.spawn("clone", "node", "--data-dir", str(clone), "--fake-hw", "hgx-h100-8", "--heartbeat-interval", "1")

    def quarantined() -> list[dict[str, Any]]:
        return events(lab, "security.node.quarantined", "n1")

    lab.wait_for("n1 quarantined", quarantined, timeout=90)
    assert len(events(lab, "security.node.duplicate-session", "n1")) > 3
    assert quarantined()[0]["data"]["reason"] == "duplicate-identity"
    lab.wait_for("both clones out", lambda: not lab.running("node-n1") and not lab.running("clone"), timeout=15)
    assert lab.show("n1")["revoked"] is True
    # Nothing is released (I5): the real machine's workload keeps its hold.
    assert lab.reservation(res["id"])["state"] == "active"  # type: ignore[index]
    assert lab.cdi_path("n1", res["allocation_id"]).exists()


@pytest.mark.e2e
def test_commands_and_specs_are_signed_and_doctor_passes(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    pki = lab.bc("pki", "show")
    assert pki["command_signing"] is True and pki["attested_bindings"] is True
    assert pki["worker"]["key_id"].startswith("sha256:")
    done = lab.bc("cmd", "run", "n1", "diag.nvml", "--wait")
    assert done["state"] == "succeeded"

    rotated = lab.bc("pki", "rotate")
    assert rotated["worker"]["key_id"] != pki["worker"]["key_id"]
    assert rotated["resigned_specs"] >= 1
    # After a rotation the node still takes new intent: specs and commands signed by the new key.
    lab.bc("spec", "set", "n1", "telemetry", '{"export_interval_s": 15}')
    lab.wait_converged("n1", lab.show("n1")["generation"])
    assert lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait")["state"] == "succeeded"

    node_doctor = lab.bc("doctor", "--data-dir", str(lab.node_dir("n1")))
    assert node_doctor["ok"] is True, node_doctor
    roots = next(c for c in node_doctor["checks"] if c["name"] == "trust-bundle")
    assert roots["status"] == "pass", roots
    server_doctor = lab.bc("doctor", "--data-dir", str(lab.root / "server"))
    assert server_doctor["ok"] is True, server_doctor
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_deleting_a_node_needs_yes_a_cordon_and_no_live_reservation(lab: Lab) -> None:
    bring_up(lab, {"n1": "hgx-h100-8"})
    res = lab.bc("reserve", "--gpus", "1", "--node", "n1")

    no_yes = lab.run("nodes", "delete", "n1")
    assert no_yes.returncode == 2 and "add --yes" in no_yes.stderr
    not_cordoned = lab.run("nodes", "delete", "n1", "--yes")
    assert not_cordoned.returncode != 0 and "not cordoned" in not_cordoned.stderr
    assert lab.bc("nodes", "cordon", "n1")["cordoned"] is True
    waiting = lab.bc("reserve", "--gpus", "1", "--node", "n1")  # issue 13: it waits, pending (was refused)
    assert (waiting["state"], waiting["reason"]) == ("pending", "node n1 is cordoned"), waiting
    lab.bc("release", waiting["id"])
    busy = lab.run("nodes", "delete", "n1", "--yes")
    assert busy.returncode != 0 and "release them first" in busy.stderr
    assert lab.show("n1")["state"] == "connected"  # every refusal left the node as it was

    lab.bc("release", res["id"])
    lab.wait_reservation_state(res["id"], "released")
    gone = lab.bc("nodes", "delete", "n1", "--yes")
    assert gone["node_id"] == "n1" and gone["revoked_certificates"] >= 1
    assert all(n["node_id"] != "n1" for n in lab.bc("nodes"))
    assert lab.show("n1")["state"] == "deleted"  # a tombstone: its history still reads (6e30187)
    code = lab.procs["node-n1"].popen.wait(timeout=15)  # its session was ended by the revocation feed
    assert code != 0
