"""`bc instances list|show` against a real `bc serve` and a fake-hardware node (the fake runtime).

What a node reports is shown through the escaping writer: a foreign domain with a terminal escape in its
name cannot colour or rewrite the operator's screen. Bad input is one sentence and a non-zero exit.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.instances.fake import FakeRuntime
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets
from bc.seams.clock import SystemClock
from tests.integration.test_cli_cmd import bc, fails, ok_json
from tests.integration.test_quorum_cli import Lab, running_lab
from tests.snapshot_https import ObjectStore


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def vm(iid: str, state: str) -> dict[str, Any]:
    return {"id": iid, "runtime": "qemu", "vcpus": 2, "memory_mib": 2048, "kernel": "vmlinuz", "state": state}


def spec_set(lab: Lab, doc: dict[str, Any]) -> None:
    generation = ok_json("spec", "set", "n1", "instances", json.dumps(doc))["generation"]
    lab.wait_for("observed", lambda: ok_json("nodes", "show", "n1")["observed_generation"] >= generation)


def test_list_and_show_a_nodes_instances(lab: Lab) -> None:
    boot = lab.node_dir("n1") / "instance-boot"
    boot.mkdir()
    (boot / "vmlinuz").write_bytes(b"a kernel")
    agent = lab.start_node("n1")
    runtime = agent.parts.instances
    assert isinstance(runtime, FakeRuntime)
    runtime.add_foreign("evil\x1b[31mred", "RUNNING", memory_mib=512)
    spec_set(lab, {"instances": [vm("web-1", "RUNNING"), vm("db-1", "PAUSED")]})

    table = bc("instances", "list", "n1")
    assert table.exit_code == 0, table.output
    rows = table.stdout.splitlines()
    assert rows[0].split() == ["INSTANCE", "STATE", "DESIRED", "RUNTIME", "VCPUS", "MEMORY", "BC'S", "MESSAGE"]
    assert rows[1].split()[:7] == ["db-1", "PAUSED", "PAUSED", "qemu", "2", "2", "GiB"]
    assert rows[2].split()[:3] == ["web-1", "RUNNING", "RUNNING"]
    assert "\x1b" not in table.stdout and "evil" in rows[3] and "no (left alone)" in rows[3]
    # Under the table, the node's volume store as its last report said (a gauge the control plane keeps).
    storage = ok_json("nodes", "show", "n1")["volume_storage"]
    assert int(storage["total_bytes"]) > int(storage["available_bytes"]) > 0 and int(storage["reserved_bytes"]) > 0
    assert rows[-2] == "" and rows[-1].startswith("volumes: 0 B promised (0 B of it not yet written) on ")

    doc = ok_json("instances", "list", "n1")
    assert [(i["id"], i["state"], i.get("managed", False)) for i in doc] == [
        ("db-1", "PAUSED", True),
        ("web-1", "RUNNING", True),
        ("evil\x1b[31mred", "RUNNING", False),
    ]
    one = ok_json("instances", "show", "n1", "web-1")
    assert (one["node_id"], one["desired"], one["vcpus"], one["memory_mib"]) == ("n1", "RUNNING", 2, 2048)
    shown = bc("instances", "show", "n1", "db-1")
    assert "desired   PAUSED" in shown.stdout and "node      n1" in shown.stdout

    assert fails(3, "instances", "show", "n1", "nope") == "error: node n1 reports no instance 'nope'"
    assert fails(3, "instances", "list", "n9").startswith("error: ")
    refused = fails(2, "spec", "set", "n1", "instances", json.dumps({"instances": [vm("x", "ASLEEP")]}))
    assert "instances[0].state must be one of RUNNING, PAUSED, STOPPED, DELETED, not 'ASLEEP'" in refused


def test_bc_instances_snapshot_runs_the_kind_on_the_node_and_uploads_over_https(lab: Lab, tmp_path: Path) -> None:
    """`bc instances snapshot` queues `instance.snapshot` (bulk, not retry-safe); the node's fake runtime
    captures, and the tar goes to a real https server whose certificate the cluster CA issued."""
    ca, _ = CertificateAuthority.load_or_create(
        tmp_path / "server" / "pki", SystemClock(), random.Random(3), SystemSecrets()
    )
    store = lab.run(ObjectStore(tmp_path, ca).start())
    try:
        boot = lab.node_dir("n1") / "instance-boot"
        boot.mkdir()
        (boot / "vmlinuz").write_bytes(b"a kernel")
        lab.start_node("n1")
        spec_set(lab, {"instances": [vm("web-1", "RUNNING")]})
        done = ok_json(
            "instances", "snapshot", "n1", "web-1", "--upload-url", store.url("/o/s?sig=k3y"), "--memory", "--wait"
        )
        assert (done["kind"], done["state"]) == ("instance.snapshot", "succeeded")
        body = store.objects["s"]
        assert done["result"]["sha256"] == hashlib.sha256(body).hexdigest()
        assert done["result"]["bytes"] == len(body) and done["result"]["uploaded_to"] == store.url("/o/s")
        assert "k3y" not in json.dumps(done["result"])
        refused = bc(
            "instances", "snapshot", "n1", "web-1", "--upload-url", f"http://127.0.0.1:{store.port}/o/t", "--wait"
        )
        assert refused.exit_code != 0 and "invalid-payload" in refused.output, refused.output
        assert "t" not in store.objects
    finally:
        lab.run(store.stop())
