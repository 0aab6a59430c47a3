"""The `instances` section as an operator drives it: `bc serve`, `bc node --fake-hw` (the fake runtime) and
the `bc` CLI, as real processes. The node's VMs outlive a `kill -9` of the agent: the restarted agent finds
them running and reports them again, and the next spec stops one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .harness import Lab

pytestmark = pytest.mark.e2e


def vm(iid: str, state: str) -> dict[str, Any]:
    return {"id": iid, "runtime": "qemu", "vcpus": 2, "memory_mib": 4096, "kernel": "vmlinuz", "state": state}


def spec_set(lab: Lab, *instances: dict[str, Any]) -> int:
    return int(lab.bc("spec", "set", "n1", "instances", json.dumps({"instances": list(instances)}))["generation"])


def test_instances_survive_an_agent_restart_and_follow_the_spec(lab: Lab) -> None:
    lab.serve()
    lab.join("n1")
    boot = lab.node_dir("n1") / "instance-boot"
    boot.mkdir()
    (boot / "vmlinuz").write_bytes(b"a kernel")
    lab.node("n1")
    lab.wait_converged("n1", spec_set(lab, vm("web-1", "RUNNING"), vm("db-1", "PAUSED")))
    assert [(i["id"], i["state"]) for i in lab.bc("instances", "list", "n1")] == [
        ("db-1", "PAUSED"),
        ("web-1", "RUNNING"),
    ]

    lab.kill("node-n1")
    lab.restart("node-n1")
    generation = spec_set(lab, vm("web-1", "STOPPED"), vm("db-1", "PAUSED"))
    lab.wait_converged("n1", generation)
    assert [(i["id"], i["state"]) for i in lab.bc("instances", "list", "n1")] == [
        ("db-1", "PAUSED"),
        ("web-1", "STOPPED"),
    ]
    table = lab.bc("instances", "show", "n1", "web-1", json=False)
    assert "desired   STOPPED" in table and "memory    4 GiB" in table
    refused = lab.run("instances", "show", "n1", "nope")
    assert refused.returncode == 3 and refused.stderr == "error: node n1 reports no instance 'nope'\n"
