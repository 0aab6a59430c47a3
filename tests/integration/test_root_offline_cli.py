"""The command-signing root kept offline (`bc pki root export/remove`), through the real CLI against a real
`bc serve` (SQLite and PostgreSQL) with a real agent.

After `bc pki root remove`, `bc pki rotate` and every quorum change need the
exported file (`--root-key FILE`): the CLI issues the worker certificate and
signs the change's step on this machine, the root is never sent. The node
keeps running newly signed commands after the rotation, and takes the new
quorum settings from a bundle the worker signed, because each change carries
the root's own signature of its step and still k approvals; a release key
added with the file carries the root's endorsement and reaches the node the
same way. A wrong file — missing, not a key, another install's root, readable
by others — is one sentence, exit 2, and nothing changes.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bc.assembly.server import Seams, ServeOptions, Server
from bc.control.trust.releases import release_keys
from bc.pki import releases as rel
from bc.pki.secrets_source import SeededSecrets
from bc.pki.signing import SigningKeys
from bc.testing import virtual_clock
from tests.integration.test_cli_cmd import bc, ok_json
from tests.integration.test_quorum_cli import (
    Approver,
    Lab,
    as_operator,
    keygen,
    operator_config,
    refused,
    settle,
)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def lab(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """`bc serve` on its own loop with n1 joined and running; the root key exported to root.key and removed."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("BC_DATA_DIR", "BC_CONFIG", "BC_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bc-serve", daemon=True)
    thread.start()
    schema_cm = None
    store = ""
    if request.param == "postgres":
        from tests.pg import recycled_schema, schema_url

        schema_cm = recycled_schema()
        url, schema = asyncio.run_coroutine_threadsafe(schema_cm.__aenter__(), loop).result(60)
        store = schema_url(url, schema)
    opts = ServeOptions(data_dir=tmp_path / "server", listen="127.0.0.1:0", heartbeat_interval_s=1.0, store=store)
    server = Server(opts, Seams.production())
    lab = Lab(server, loop, tmp_path)
    try:
        lab.run(server.start())
        monkeypatch.setenv("BC_CONFIG", str(server.operator_config))
        lab.join("n1")
        lab.start_node("n1")
        lab.wait_for("n1 holding the signing root", lambda: trust(lab).command_signing_roots)
        out = tmp_path / "root.key"
        data_dir = str(tmp_path / "server")
        assert bc("pki", "root", "export", "--out", str(out), "--data-dir", data_dir).exit_code == 0
        assert bc("pki", "root", "remove", "--exported", str(out), "--data-dir", data_dir).exit_code == 0
        assert not server_root(lab).exists()
        yield lab
    finally:
        lab.stop_nodes()
        lab.run(server.stop())
        if schema_cm is not None:
            asyncio.run_coroutine_threadsafe(schema_cm.__aexit__(None, None, None), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def trust(lab: Lab) -> Any:
    return lab.agents["n1"].trust.bundle


def server_root(lab: Lab) -> Path:
    return lab.root / "server" / "pki" / "signing" / "root.key"


def root_file(lab: Lab) -> str:
    return str(lab.root / "root.key")


def worker_files(lab: Lab) -> tuple[bytes, bytes]:
    d = lab.root / "server" / "pki" / "signing"
    return (d / "worker.key").read_bytes(), (d / "worker.crt").read_bytes()


def run_on_n1() -> dict[str, Any]:
    """A newly signed command, run by the node to the end."""
    result = bc("cmd", "run", "n1", "inventory.refresh", "--wait", "--json")
    assert result.exit_code == 0, result.output
    doc = dict(json.loads(result.stdout))
    assert doc["state"] == "succeeded", doc
    return doc


def bad_root_files(tmp_path: Path) -> list[tuple[Path, str]]:
    """(file, what the one error line says): missing, not a key, another install's root."""
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key at all\n")
    other = SigningKeys.create(
        tmp_path / "other" / "pki", virtual_clock(1_800_000_000.0), random.Random(7), SeededSecrets(7)
    )
    return [
        (tmp_path / "missing.key", "cannot read the root key file"),
        (garbage, "does not hold a private key"),
        (other.dir / "root.key", "does not hold this install's command-signing root key"),
    ]


# -- bc pki rotate --------------------------------------------------------------------------------------


def test_rotate_with_the_root_file_installs_a_new_worker_and_the_node_keeps_running_commands(lab: Lab) -> None:
    before = ok_json("pki", "show")
    assert before.get("root_on_host", False) is False  # removed by the fixture
    run_on_n1()
    # Without the file: one sentence naming --root-key, nothing changes.
    files = worker_files(lab)
    refused(bc("pki", "rotate"), 2, "--root-key")
    assert worker_files(lab) == files and ok_json("pki", "show")["worker"]["key_id"] == before["worker"]["key_id"]

    doc = ok_json("pki", "rotate", "--root-key", root_file(lab))
    assert doc["worker"]["key_id"] != before["worker"]["key_id"]
    assert worker_files(lab) != files and not server_root(lab).exists()
    # The node takes what the new worker key signs: a new command runs to the end.
    cmd = run_on_n1()
    row = next(r for r in lab.commands() if r["id"] == cmd["id"])
    assert row["signer_key_id"] == doc["worker"]["key_id"]


def test_rotate_with_a_wrong_root_file_changes_nothing(lab: Lab, tmp_path: Path) -> None:
    key_id = ok_json("pki", "show")["worker"]["key_id"]
    files = worker_files(lab)
    for path, fragment in bad_root_files(tmp_path):
        refused(bc("pki", "rotate", "--root-key", str(path)), 2, fragment)
        assert worker_files(lab) == files and ok_json("pki", "show")["worker"]["key_id"] == key_id
    run_on_n1()


# -- approver changes -------------------------------------------------------------------------------------


def add_with_root(lab: Lab, tmp_path: Path, signers: dict[str, Approver], name: str) -> None:
    """`bc approvers add NAME PUB --root-key FILE`, signed by the approvers already there."""
    config = operator_config(tmp_path, name)
    path, public = keygen(tmp_path, name)
    settle(ok_json("approvers", "add", name, public, "--root-key", root_file(lab)), signers)
    signers[name] = Approver(path, config)


def test_an_approver_change_needs_the_root_file_and_k_approvals_and_reaches_the_node(lab: Lab, tmp_path: Path) -> None:
    # Without the file the request is refused in one sentence, and nothing is stored.
    alice_key, alice_pub = keygen(tmp_path, "alice")
    operator_config(tmp_path, "alice")
    refused(bc("approvers", "add", "alice", alice_pub), 2, "pass --root-key")
    assert ok_json("approvers")["approvers"] == [] and ok_json("approve", "list") == []

    signers: dict[str, Approver] = {}
    settle(ok_json("approvers", "add", "alice", alice_pub, "--root-key", root_file(lab)), signers)
    signers["alice"] = Approver(alice_key, tmp_path / "alice.bc-config.json")
    add_with_root(lab, tmp_path, signers, "bob")  # needs alice's approval
    add_with_root(lab, tmp_path, signers, "carol")  # needs alice's and bob's (k = 2)
    doc = ok_json("approvers")
    assert doc["version"] == 3 and doc["threshold"] == 2
    # The node holds them, from bundles the worker signed (the root is not on the host).
    lab.wait_for("n1 holding three approvers", lambda: trust(lab).quorum_version == 3)
    assert sorted(a.name for a in trust(lab).approver_keys) == ["alice", "bob", "carol"]
    assert all(c.root_signature for c in trust(lab).quorum_changes)

    # A threshold change with the file still needs k = 2 approvals: one is not enough.
    change = ok_json("approvers", "threshold", "3", "--root-key", root_file(lab))["change"]
    assert change["state"] == "pending" and change["threshold"] == 2
    r = as_operator(
        signers["alice"].config, "approve", "sign", change["id"], "--key", str(signers["alice"].key), "--yes", "--json"
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["state"] == "pending", r.output
    assert ok_json("approvers")["threshold"] == 2 and trust(lab).quorum_k == 2
    r = as_operator(
        signers["bob"].config, "approve", "sign", change["id"], "--key", str(signers["bob"].key), "--yes", "--json"
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["state"] == "applied", r.output
    lab.wait_for("n1 holding k = 3", lambda: trust(lab).quorum_k == 3)
    run_on_n1()


def test_an_approver_change_with_a_wrong_root_file_changes_nothing(lab: Lab, tmp_path: Path) -> None:
    _, public = keygen(tmp_path, "dave")
    operator_config(tmp_path, "dave")
    for path, fragment in bad_root_files(tmp_path):
        refused(bc("approvers", "add", "dave", public, "--root-key", str(path)), 2, fragment)
        refused(bc("approvers", "threshold", "3", "--root-key", str(path)), 2, fragment)
    doc = ok_json("approvers")
    assert doc["approvers"] == [] and doc["version"] == 0
    assert ok_json("approve", "list") == []


# -- what else needs the root --------------------------------------------------------------------------


def test_a_release_key_added_with_the_root_file_reaches_the_node_in_a_worker_signed_bundle(
    lab: Lab, tmp_path: Path
) -> None:
    """Nodes take a new release key only under the root's own signature. Without the file the key is refused
    in one sentence (stored, every node would refuse it with nothing said); with it the CLI endorses the key
    here, and the node takes it from the bundle the worker signed."""
    key_file = tmp_path / "release.key"
    refused(bc("release", "key", "add", "--key", str(key_file), "--generate"), 2, "pass --root-key FILE")
    assert lab.run(release_keys(lab.store)) == [] and list(trust(lab).release_keys) == []

    doc = ok_json("release", "key", "add", "--key", str(key_file), "--root-key", root_file(lab))
    public = lab.run(release_keys(lab.store))
    assert len(public) == 1 and doc["key_id"] == rel.key_id(public[0])
    lab.wait_for("n1 holding the release key", lambda: list(trust(lab).release_keys) == public)
    (e,) = trust(lab).release_key_endorsements
    assert e.public_key == public[0] and e.root_signature, "the root's own signature came with it"
    assert not server_root(lab).exists(), "the root stayed off the host"
    # The bundle the node took was the worker's (the root is not on the host to sign it).
    env = lab.server.intent.trust_envelope()
    assert env is not None and env.key_id == ok_json("pki", "show")["worker"]["key_id"]
    # Adding it again is a no-op; so is adding it again without the file (nothing new for nodes to take).
    assert ok_json("release", "key", "add", "--key", str(key_file), "--root-key", root_file(lab))["key_id"]
    assert ok_json("release", "key", "add", "--key", str(key_file))["key_id"] == doc["key_id"]
    assert lab.run(release_keys(lab.store)) == public
    run_on_n1()


def test_a_release_key_with_a_wrong_root_file_changes_nothing(lab: Lab, tmp_path: Path) -> None:
    """Missing, not a key, another install's root, or this root readable by others: one sentence, exit 2, no
    key stored, and --generate writes no release key file (the root file is checked first)."""
    readable = tmp_path / "readable-root.key"
    readable.write_bytes(Path(root_file(lab)).read_bytes())
    readable.chmod(0o644)
    cases = [*bad_root_files(tmp_path), (readable, "is readable by other users (mode 0644); chmod 600 it")]
    for path, fragment in cases:
        key_file = tmp_path / f"release-{path.stem}.key"
        args = ("release", "key", "add", "--key", str(key_file), "--generate", "--root-key", str(path))
        refused(bc(*args), 2, fragment, "nothing changed")
        assert not key_file.exists()
    assert lab.run(release_keys(lab.store)) == [] and list(trust(lab).release_keys) == []
