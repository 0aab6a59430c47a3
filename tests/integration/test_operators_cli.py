"""Named operators with roles, through the real CLI against a real `bc serve` (the lab of test_quorum_cli).

`bc operators add` writes a config a person can use as is (`BC_CONFIG=FILE`);
a role below the one a call needs is refused exit 6 with a sentence naming
the role; a revoked operator is refused; every write names who made it; and
approver keys count only under their own operator's certificate.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import (
    Approver,
    Lab,
    approvers,
    as_operator,
    assert_held,
    create_batch,
    keygen,
    operator_config,
    refused,
    running_lab,
    sign,
)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def as_json(config: Path, *args: str) -> object:
    r = as_operator(config, *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# -- bc operators add / list / revoke ------------------------------------------------------------


def test_operators_add_writes_a_config_that_works_and_is_never_overwritten(lab: Lab, tmp_path: Path) -> None:
    out = tmp_path / "bob.bc-config.json"
    doc = ok_json("operators", "add", "bob", "--role", "viewer", "--out", str(out))
    assert doc["operator"]["name"] == "bob" and doc["operator"]["role"] == "viewer" and doc["config"] == str(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    cfg = json.loads(out.read_text())
    # The format of <data-dir>/operator/config.json, with the PEMs inline: one file to hand over.
    assert set(cfg) == {"server", "ca", "cert", "key", "data_dir"}
    assert cfg["server"] == lab.server.address and "PRIVATE KEY" in cfg["key"]
    assert [n["node_id"] for n in as_json(out, "nodes")] == ["n1", "n2"]  # type: ignore[index]
    before = out.read_bytes()
    refused(bc("operators", "add", "bob2", "--out", str(out)), 2, "already exists", "refusing to overwrite")
    assert out.read_bytes() == before
    assert [o["name"] for o in ok_json("operators")] == ["bob", "local"]  # nothing made for bob2
    refused(bc("operators", "add", "bob", "--out", str(tmp_path / "again.json")), 4, "operator bob already exists")
    assert not (tmp_path / "again.json").exists()


@pytest.mark.parametrize("name", ["Bob", "b ob", "p\u0430ul", "_x", "a" * 64, "../evil"])
def test_operator_names_are_a_safe_ascii_set(lab: Lab, tmp_path: Path, name: str) -> None:
    refused(bc("operators", "add", name, "--out", str(tmp_path / "x.json")), 2, "is not valid", "lowercase ASCII")
    assert not (tmp_path / "x.json").exists()
    assert [o["name"] for o in ok_json("operators")] == ["local"]


def test_the_local_operator_is_an_admin(lab: Lab) -> None:
    (local,) = ok_json("operators")
    assert (local["name"], local["role"], local["revoked"], local["certificates"]) == ("local", "admin", False, 1)


# -- roles ----------------------------------------------------------------------------------------


def test_a_viewer_lists_and_shows_but_writes_nothing(lab: Lab, tmp_path: Path) -> None:
    viewer = operator_config(tmp_path, "bob", role="viewer")
    assert [n["node_id"] for n in as_json(viewer, "nodes")] == ["n1", "n2"]  # type: ignore[index]
    for args in (
        ("nodes", "show", "n1"),
        ("events",),
        ("approvers",),
        ("operators",),
        ("cmd", "list"),
        ("pki", "show"),
    ):
        r = as_operator(viewer, *args)
        assert r.exit_code == 0, (args, r.output)
    refusals = [
        (("reserve", "--gpus", "1"), "reserving GPUs needs the operator role; operator bob has the viewer role"),
        (("cmd", "run", "n1", "diag.nvml"), "running a command needs the operator role"),
        (("cmd", "fanout", "diag.nvml", "--nodes", "n1,n2"), "running commands needs the operator role"),
        (("spec", "set", "n1", "telemetry", "{}"), "setting a spec section needs the operator role"),
        (("token", "create", "--node-id", "n9"), "creating a join token needs the admin role"),
        (("nodes", "cordon", "n1"), "cordoning a node needs the admin role"),
        (("operators", "revoke", "local"), "revoking an operator needs the admin role"),
    ]
    for args, sentence in refusals:
        refused(as_operator(viewer, *args), 6, sentence)
    assert ok_json("cmd", "list") == [] and ok_json("reservations") == []


def test_an_operator_runs_commands_but_makes_no_tokens_approvers_or_operators(lab: Lab, tmp_path: Path) -> None:
    carol = operator_config(tmp_path, "carol", role="operator")
    c = as_json(carol, "cmd", "run", "n1", "diag.nvml")
    assert c["requested_by"] == "carol"  # type: ignore[index]
    assert ok_json("cmd", "show", c["id"])["requested_by"] == "carol"  # type: ignore[index]
    fanned = as_json(carol, "cmd", "fanout", "diag.nvml", "--nodes", "n1,n2")
    assert [f["requested_by"] for f in fanned] == ["carol", "carol"]  # type: ignore[index,union-attr]
    _, public = keygen(tmp_path, "carol")
    for args, sentence in (
        (("token", "create", "--node-id", "n9"), "creating a join token needs the admin role"),
        (("approvers", "add", "carol", public), "adding an approver needs the admin role"),
        (("operators", "add", "dave", "--out", str(tmp_path / "d.json")), "adding an operator needs the admin role"),
        (("nodes", "revoke", "n1"), "revoking a node needs the admin role"),
    ):
        refused(as_operator(carol, *args), 6, sentence)
    assert ok_json("approvers")["approvers"] == []


def test_every_write_names_its_operator(lab: Lab, tmp_path: Path) -> None:
    carol = operator_config(tmp_path, "carol", role="operator")
    c = as_json(carol, "cmd", "run", "n1", "inventory.refresh")
    ok_json("token", "create", "--node-id", "n9")
    ok_json("nodes", "cordon", "n2")
    events = {(e["type"], e["subject"]): e["data"] for e in ok_json("events", "--limit", "1000")}
    assert events[("command.enqueued", c["id"])]["operator"] == "carol"  # type: ignore[index]
    assert events[("token.created", "n9")]["operator"] == "local"
    assert events[("node.cordoned", "n2")]["operator"] == "local"
    assert events[("operator.added", "carol")]["operator"] == "local"
    # The control plane's own writes (a node joining, the liveness sweep) name nobody.
    assert all("operator" not in d for (t, _), d in events.items() if t.startswith("node.connectivity"))


def test_a_revoked_operator_is_refused_and_the_last_admin_stays(lab: Lab, tmp_path: Path) -> None:
    bob = operator_config(tmp_path, "bob", role="admin")
    assert as_json(bob, "nodes")
    done = ok_json("operators", "revoke", "bob", "--reason", "left the team")
    assert done["revoked"] is True and done["revoked_by"] == "local"
    refused(as_operator(bob, "nodes"), 6, "operator bob was revoked (left the team)")
    refused(as_operator(bob, "operators", "revoke", "local"), 6, "was revoked")
    refused(bc("operators", "revoke", "local"), 4, "operator local is the last admin")
    refused(bc("operators", "revoke", "bob"), 4, "already revoked")
    refused(bc("operators", "add", "bob", "--out", str(tmp_path / "b2.json")), 4, "a name is never reused")
    assert ok_json("nodes")  # local is untouched


def test_bc_config_naming_a_missing_file_is_an_error_not_a_fall_back(lab: Lab, tmp_path: Path) -> None:
    # A working config is there to fall back to (the data dir's and ~/.config/bc's), and must not be used.
    r = as_operator(tmp_path / "missing.json", "nodes")
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert (
        r.stderr.strip()
        == f"error: BC_CONFIG names {tmp_path / 'missing.json'}, which is not a file; fix BC_CONFIG or unset it"
    )
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    refused(as_operator(junk, "nodes"), 2, f"the operator config {junk} is unreadable")


# -- approvals under the key's own operator ---------------------------------------------------------


def test_an_approval_sent_under_another_operators_certificate_does_not_count(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, "alice", "bob", "carol")
    batch = create_batch(tmp_path)
    stolen = Approver(keys["alice"].key, keys["bob"].config)  # bob holds a copy of alice's key file
    refused(sign(batch["id"], stolen), 6, "approver key alice is registered to operator alice", "not bob's")
    assert_held(lab, batch["id"], approvals=0)
    assert sign(batch["id"], keys["alice"]).exit_code == 0
    assert_held(lab, batch["id"], approvals=1)


def test_a_quorum_change_is_listed_shown_and_one_rejection_fails_it(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, "alice", "bob", "carol")
    doc = ok_json("approvers", "threshold", "3")
    assert doc["threshold"] == 2 and doc["change"]["state"] == "pending", doc
    cid = doc["change"]["id"]
    listed = ok_json("approve", "list")
    assert [x["id"] for x in listed] == [cid]
    shown = bc("approve", "show", cid)
    assert shown.exit_code == 0 and "set k from 2 to 3 (quorum settings version 3 to 4)" in shown.stdout, shown.output
    refused(as_operator(keys["bob"].config, "approve", "sign", cid, "--key", str(keys["alice"].key), "--yes"), 6)
    r = as_operator(
        keys["bob"].config, "approve", "reject", cid, "--key", str(keys["bob"].key), "--reason", "not now", "--json"
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["state"] == "rejected", r.output
    assert ok_json("approvers")["threshold"] == 2
    refused(sign(cid, keys["alice"]), 2, f"quorum change {cid} is rejected")
