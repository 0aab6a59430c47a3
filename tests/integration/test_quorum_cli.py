"""Bad input to `bc approve`, `bc approvers` and `bc batch`, through the real CLI against a real `bc serve`.

Each refusal is one clear `error:` line and a non-zero exit, and nothing runs:
the batch stays pending with its commands held (or no batch exists at all).
The server runs on its own event loop in a thread (the CLI under `CliRunner`
calls `asyncio.run` on the test's thread), with command signing on, as a new
install has it; agents, where a test needs one, run on the server's loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result

from agent.app import Agent, AgentOptions
from agent.hw.fake import FakeHardware
from agent.join import join_node
from bc.assembly.server import Seams, ServeOptions, Server
from bc.cli.main import cli
from bc.store import Row, Store
from bc.store import quorum as q_sql
from tests.integration.test_cli_cmd import bc, ok_json

T = TypeVar("T")

OPERATOR = "local"  # the operator name in the certificate `bc serve` issues for its own client config


@dataclass
class Lab:
    server: Server
    loop: asyncio.AbstractEventLoop
    root: Path
    agents: dict[str, Agent] = field(default_factory=dict)
    runs: dict[str, Future[None]] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        assert self.server.store is not None
        return self.server.store

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def node_dir(self, node_id: str) -> Path:
        return self.root / f"node-{node_id}"

    def join(self, node_id: str) -> None:
        doc = ok_json("token", "create", "--node-id", node_id)
        self.run(join_node(self.server.address, doc["token"], self.node_dir(node_id)))

    def start_node(self, node_id: str) -> Agent:
        async def make() -> Agent:
            return Agent(AgentOptions(data_dir=self.node_dir(node_id), fake_hw="hgx-h100-8", heartbeat_interval_s=1.0))

        agent = self.run(make())
        self.agents[node_id] = agent
        self.runs[node_id] = asyncio.run_coroutine_threadsafe(agent.run(), self.loop)
        return agent

    def stop_nodes(self) -> None:
        for node_id, agent in list(self.agents.items()):
            self.loop.call_soon_threadsafe(agent.stopped.set)
            self.runs.pop(node_id).result(10)
            del self.agents[node_id]

    def now_ms(self) -> int:
        return self.run(self.store.now_ms())

    def commands(self, batch_id: str = "") -> list[Row]:
        async def read() -> list[Row]:
            async with self.store.transaction(write=False) as tx:
                if batch_id:
                    return await tx.fetchall("SELECT * FROM commands WHERE batch_id = :b ORDER BY seq", {"b": batch_id})
                return await tx.fetchall("SELECT * FROM commands ORDER BY seq", {})

        return self.run(read())

    def batches(self) -> list[Row]:
        async def read() -> list[Row]:
            async with self.store.transaction(write=False) as tx:
                return await q_sql.list_batches(tx)

        return self.run(read())

    def wait_for(self, what: str, cond: Any, timeout: float = 10.0) -> Any:
        """Poll a condition the test cannot be woken for, against a deadline."""
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; last: {value!r}")
            time.sleep(0.05)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def running_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """`bc serve` on its own loop with n1 and n2 joined; the CLI reaches it as `local` through BC_CONFIG."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("BC_DATA_DIR", "BC_CONFIG", "BC_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bc-serve", daemon=True)
    thread.start()
    opts = ServeOptions(data_dir=tmp_path / "server", listen="127.0.0.1:0", heartbeat_interval_s=1.0)
    server = Server(opts, Seams.production())
    lab = Lab(server, loop, tmp_path)
    try:
        lab.run(server.start())
        monkeypatch.setenv("BC_CONFIG", str(server.operator_config))
        for n in ("n1", "n2"):
            lab.join(n)
        yield lab
    finally:
        lab.stop_nodes()
        lab.run(server.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


# -- helpers -------------------------------------------------------------------------------------------


def keygen(tmp_path: Path, name: str) -> tuple[Path, str]:
    """`bc approve keygen --out F --json`: the key file and its public key."""
    out = tmp_path / f"{name}.key"
    doc = ok_json("approve", "keygen", "--out", str(out))
    assert doc["path"] == str(out) and doc["key_id"].startswith("sha256:")
    return out, str(doc["public_key"])


@dataclass(frozen=True)
class Approver:
    key: Path  # the approver key file
    config: Path  # the client config of the operator the key is registered to


def operator_config(tmp_path: Path, name: str, role: str = "operator") -> Path:
    """`bc operators add NAME --role ROLE --out F`: the person's client config; `local` has its own already."""
    if name == OPERATOR:
        return Path(os.environ["BC_CONFIG"])
    out = tmp_path / f"{name}.bc-config.json"
    doc = ok_json("operators", "add", name, "--role", role, "--out", str(out))
    assert doc["config"] == str(out) and doc["operator"]["role"] == role, doc
    return out


def as_operator(config: Path, *args: str) -> Result:
    """`BC_CONFIG=config bc ARGS`: the command under that operator's certificate."""
    return CliRunner().invoke(cli, list(args), prog_name="bc", env={"BC_CONFIG": str(config)})


def settle(doc: dict[str, Any], signers: dict[str, Approver]) -> dict[str, Any]:
    """After `bc approvers …`: a pending quorum change is signed by the approvers already there, each as itself."""
    change = doc.get("change") or {}
    if change.get("state") != "pending":
        return doc
    for a in signers.values():
        r = as_operator(a.config, "approve", "sign", change["id"], "--key", str(a.key), "--yes", "--json")
        if r.exit_code == 0 and json.loads(r.stdout)["state"] == "applied":
            return dict(ok_json("approvers"))
    raise AssertionError(f"quorum change {change['id']} was not applied by {sorted(signers)}")


def approvers(tmp_path: Path, *names: str, k: int = 2) -> dict[str, Approver]:
    """Key pairs for `names`, each added as an approver held by the operator of that name; the threshold set to k."""
    files: dict[str, Approver] = {}
    # The requester (local) asks for every change, so its own key comes last: before others are there to
    # approve adding it, nobody but local could, and local's approval of its own request does not count.
    for name in sorted(names, key=lambda n: n == OPERATOR):
        config = operator_config(tmp_path, name)
        path, public = keygen(tmp_path, name)
        settle(ok_json("approvers", "add", name, public), files)
        files[name] = Approver(path, config)
    doc = settle(ok_json("approvers", "threshold", str(k)), files)
    assert doc["threshold"] == k and sorted(a["name"] for a in doc["approvers"]) == sorted(names)
    return files


def gpu(node_id: str) -> str:
    """The first fake GPU of a node (the fake seeds its UUIDs with the node id)."""
    return FakeHardware("hgx-h100-8", node_id).inventory().gpus[0].uuid


def create_batch(tmp_path: Path, nodes: str = "n1,n2") -> dict[str, Any]:
    payload = tmp_path / "p.json"
    payload.write_text(json.dumps({"gpu_uuids": [gpu(n) for n in nodes.split(",")]}))
    doc = ok_json("batch", "create", "--kind", "gpu.reset", "--nodes", nodes, "--payload", f"@{payload}")
    assert doc["state"] == "pending" and doc["requested_by"] == OPERATOR
    return dict(doc)


def sign(batch_id: str, approver: Approver, *extra: str) -> Result:
    """`bc approve sign` by the approver, under its own operator's certificate."""
    args = ("approve", "sign", batch_id, "--key", str(approver.key), "--yes", *extra, "--json")
    return as_operator(approver.config, *args)


def refused(result: Result, code: int, *fragments: str) -> str:
    """A refusal: exit `code`, nothing on stdout, one `error:` line (the last on stderr); returns it."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stdout == "", result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    assert "Traceback" not in result.stderr
    for f in fragments:
        assert f in errors[0], errors[0]
    return errors[0]


def assert_held(lab: Lab, batch_id: str, approvals: int | None) -> None:
    """Nothing runs: the batch is pending, not approved, and every one of its commands is still held."""
    b = ok_json("batch", "show", batch_id)
    assert b["state"] == "pending", b
    assert approvals is None or b["approvals"] == approvals, b
    rows = lab.commands(batch_id)
    assert len(rows) == len(b["leaves"]) > 0
    for row in rows:
        assert (row["state"], int(row["held"]), row["batch_proof"]) == ("pending", 1, None), dict(row)


# -- approvals -------------------------------------------------------------------------------------------


def test_a_signature_by_a_key_never_added_is_refused(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, "alice", "bob", "carol")
    batch = create_batch(tmp_path)
    stranger, _ = keygen(tmp_path, "stranger")
    refused(sign(batch["id"], Approver(stranger, keys["alice"].config)), 2, "is not an approver key of this server")
    assert_held(lab, batch["id"], approvals=0)


def test_the_same_key_twice_is_refused_and_counts_once(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, "alice", "bob", "carol")
    batch = create_batch(tmp_path)
    first = sign(batch["id"], keys["alice"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["approvals"] == 1
    refused(sign(batch["id"], keys["alice"]), 4, "alice has already decided on batch")
    assert_held(lab, batch["id"], approvals=1)


def test_the_requesters_own_key_is_refused(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, OPERATOR, "bob", "carol")
    batch = create_batch(tmp_path)
    refused(sign(batch["id"], keys[OPERATOR]), 2, f"{OPERATOR} asked for batch {batch['id']}", "does not count")
    assert_held(lab, batch["id"], approvals=0)
    # The two others still make the quorum.
    assert sign(batch["id"], keys["bob"]).exit_code == 0
    done = sign(batch["id"], keys["carol"])
    assert done.exit_code == 0 and json.loads(done.stdout)["state"] == "approved", done.output


def test_a_batch_the_requester_alone_could_approve_is_refused(lab: Lab, tmp_path: Path) -> None:
    approvers(tmp_path, OPERATOR, "bob", k=2)
    payload = json.dumps({"gpu_uuids": [gpu("n1")]})
    result = bc("batch", "create", "--kind", "gpu.reset", "--nodes", "n1", "--payload", payload)
    refused(result, 4, "only 1 approver(s) other than local's own", "could never be approved")
    assert lab.batches() == [] and lab.commands() == []


def test_an_approval_that_expired_does_not_count_toward_the_quorum(lab: Lab, tmp_path: Path) -> None:
    """The control plane refuses to count it: the batch stays pending, nothing is released."""
    keys = approvers(tmp_path, "alice", "bob", "carol")
    batch = create_batch(tmp_path)
    signed = sign(batch["id"], keys["alice"], "--expires-in", "1s")
    assert signed.exit_code == 0, signed.output
    expires = json.loads(signed.stdout)["decisions"][0]["expires_at_ms"]
    assert 0 < expires - lab.now_ms() <= 1_000
    lab.wait_for("alice's approval to expire in server time", lambda: lab.now_ms() > expires)

    second = sign(batch["id"], keys["bob"])
    assert second.exit_code == 0, second.output
    after = json.loads(second.stdout)
    assert after["state"] == "pending", after
    assert_held(lab, batch["id"], approvals=None)  # two decisions stored, one of them no longer counts
    third = sign(batch["id"], keys["carol"])
    assert json.loads(third.stdout)["state"] == "approved", third.output


def test_an_approval_that_expires_before_delivery_is_refused_by_the_node(lab: Lab, tmp_path: Path) -> None:
    """At the threshold the server approves and releases; the node checks expiry again in server time and refuses."""
    keys = approvers(tmp_path, "alice", "bob", k=1)
    batch = create_batch(tmp_path, "n1")
    signed = sign(batch["id"], keys["alice"], "--expires-in", "1s")
    assert signed.exit_code == 0, signed.output
    doc = json.loads(signed.stdout)
    assert doc["state"] == "approved", doc
    expires = doc["decisions"][0]["expires_at_ms"]
    (row,) = lab.commands(batch["id"])
    assert int(row["held"]) == 0  # released: the control plane does not look at the expiry again
    lab.wait_for("the approval to expire in server time", lambda: lab.now_ms() > expires)

    lab.start_node("n1")  # n1 was offline: the command reaches it only now
    command_id = str(row["id"])

    def settled() -> dict[str, Any] | None:
        c = ok_json("cmd", "show", command_id)
        return dict(c) if c["state"] in ("succeeded", "failed", "rejected", "cancelled", "expired") else None

    final = lab.wait_for(f"command {command_id} to settle", settled)
    assert (final["state"], final["reason"]) == ("rejected", "BATCH_UNAPPROVED"), final
    assert "expired" in final["message"], final
    assert FakeHardware.read_resets(lab.node_dir("n1")) == {}


# -- key files -----------------------------------------------------------------------------------------


def test_a_key_file_others_can_read_is_refused(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, "alice", "bob", "carol")
    batch = create_batch(tmp_path)
    keys["alice"].key.chmod(0o644)
    line = refused(sign(batch["id"], keys["alice"]), 2, "can be read by others (mode 644)")
    assert line.endswith(f"chmod 600 {keys['alice'].key}"), line
    refused(bc("approve", "reject", batch["id"], "--key", str(keys["alice"].key), "--reason", "no"), 2, "chmod 600")
    assert_held(lab, batch["id"], approvals=0)
    keys["alice"].key.chmod(0o600)
    assert sign(batch["id"], keys["alice"]).exit_code == 0


def test_keygen_refuses_to_overwrite_an_existing_file(lab: Lab, tmp_path: Path) -> None:
    path, _ = keygen(tmp_path, "alice")
    before = path.read_bytes()
    refused(bc("approve", "keygen", "--out", str(path), "--json"), 2, f"{path} already exists", "refusing to overwrite")
    assert path.read_bytes() == before
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_key_file_that_is_not_a_key_is_refused(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, "alice", "bob")
    batch = create_batch(tmp_path)
    junk = tmp_path / "junk.key"
    junk.write_text("not a key\n")
    junk.chmod(0o600)
    alice = keys["alice"].config
    refused(sign(batch["id"], Approver(junk, alice)), 2, "is not an unencrypted PEM private key")
    refused(sign(batch["id"], Approver(tmp_path / "missing.key", alice)), 2, "cannot read the key file")
    assert_held(lab, batch["id"], approvals=0)


# -- approvers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("public_key", "fragment"),
    [
        ("not a key!", "the public key is not base64"),
        ("c2hvcnQ=", "the public key is 5 bytes; an Ed25519 key is 32"),
        ("", "the public key is 0 bytes"),
    ],
)
def test_approvers_add_refuses_a_bad_public_key(lab: Lab, public_key: str, fragment: str) -> None:
    line = refused(bc("approvers", "add", "alice", public_key), 2, fragment)
    assert "bc approve keygen" in line
    assert ok_json("approvers")["approvers"] == []


def test_approvers_add_refuses_a_name_or_key_already_there(lab: Lab, tmp_path: Path) -> None:
    _, public = keygen(tmp_path, "alice")
    operator_config(tmp_path, "alice")
    ok_json("approvers", "add", "alice", public)
    refused(bc("approvers", "add", "alice2", public), 4, "approver alice already has this name or key")
    refused(bc("approvers", "add", "bad name", public), 2, "is not valid")
    assert [a["name"] for a in ok_json("approvers")["approvers"]] == ["alice"]


# -- batches -------------------------------------------------------------------------------------------


def test_batch_create_refuses_a_non_destructive_kind(lab: Lab, tmp_path: Path) -> None:
    approvers(tmp_path, "alice", "bob")
    for kind in ("diag.nvml", "inventory.refresh"):
        refused(bc("batch", "create", "--kind", kind, "--nodes", "n1,n2"), 2, f"{kind} is not destructive")
    assert lab.batches() == [] and lab.commands() == []


def test_batch_create_without_approvers_is_refused(lab: Lab, tmp_path: Path) -> None:
    payload = json.dumps({"gpu_uuids": [gpu("n1")]})
    result = bc("batch", "create", "--kind", "gpu.reset", "--nodes", "n1", "--payload", payload)
    refused(result, 4, "no approvers are configured")
    assert lab.batches() == [] and lab.commands() == []


def test_batch_create_with_an_unknown_node_is_refused(lab: Lab, tmp_path: Path) -> None:
    approvers(tmp_path, "alice", "bob")
    payload = json.dumps({"gpu_uuids": [gpu("n1")]})
    result = bc("batch", "create", "--kind", "gpu.reset", "--nodes", "n1,ghost,n2", "--payload", payload)
    refused(result, 3, "no node named 'ghost'")
    assert lab.batches() == [] and lab.commands() == []  # n1's command was not kept either
    assert ok_json("batch", "list") == []


def test_sign_and_reject_of_a_batch_that_is_not_pending_are_refused(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, "alice", "bob", "carol")
    batch = create_batch(tmp_path)
    bob = keys["bob"]
    args = ("approve", "reject", batch["id"], "--key", str(bob.key), "--reason", "wrong nodes", "--json")
    rejected = as_operator(bob.config, *args)
    assert rejected.exit_code == 0 and json.loads(rejected.stdout)["state"] == "rejected", rejected.output
    refused(sign(batch["id"], keys["alice"]), 2, "is rejected; there is nothing to sign")
    refused(bc("approve", "sign", "b-nope", "--key", str(keys["alice"].key), "--yes"), 3, "no batch named 'b-nope'")
    for row in lab.commands(batch["id"]):
        assert (row["state"], row["reason"]) == ("cancelled", "batch-rejected")


def test_approvers_remove_threshold_and_withdraw_through_the_cli(lab: Lab, tmp_path: Path) -> None:
    keys = approvers(tmp_path, "alice", "bob", "carol", k=3)
    refused(bc("approvers", "remove", "carol"), 4, "would leave 2 live approver(s) for a threshold of 3")
    refused(bc("operators", "revoke", "carol"), 4, "first remove the key in a change that lowers k")
    pending = ok_json("approvers", "remove", "carol", "--threshold", "2")["change"]
    assert pending["state"] == "pending" and "set k from 3 to 2" in pending["summary"], pending
    refused(as_operator(keys["bob"].config, "approvers", "withdraw", pending["id"]), 6, "needs the admin role")
    r = bc("approvers", "withdraw", pending["id"])
    assert r.exit_code == 0 and r.stdout.startswith(f"withdrew quorum change {pending['id']}: remove approver"), (
        r.output
    )
    refused(bc("approvers", "withdraw", pending["id"]), 4, "is already withdrawn; there is nothing to withdraw")
    doc = settle(ok_json("approvers", "remove", "carol", "--threshold", "2"), keys)
    assert (doc["threshold"], sorted(a["name"] for a in doc["approvers"])) == (2, ["alice", "bob"]), doc
    assert bc("operators", "revoke", "carol").exit_code == 0
