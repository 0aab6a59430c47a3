"""An instance's user data from the secret broker, end to end (docs/instances.md, docs/secrets.md).

A real `bc serve` (the `lab` fixture: SQLite and PostgreSQL) and a `--fake-hw` node: the value is set with
`SetSecret` (`bc secret set`), delivered as a JWE bound to the instances section, written to the instance's
0600 file and handed to the fake runtime at start; it is in no store row, log record or other file of the
node, and the file is gone once the instance stops. A secret whose scope does not admit the node fails that
instance only; an unavailable broker keeps it stopped and the section PROGRESSING. An instance that names an
allocation asks bound to it: a live reservation's allocation on the node is answered, an allocation that is
not live on it refused (`allocation-not-live`).
"""

from __future__ import annotations

import json
import logging
import secrets

import pytest

from agent.instances.fake import FakeRuntime
from bc.gateway.secret_feed import NoBroker
from bc.protocol.pb import common_pb2
from tests.integration.conftest import InprocLab
from tests.integration.test_secrets import store_dump

NAME = "vm-user-data"


def vm(iid: str, state: str = "RUNNING", ref: str = NAME) -> dict[str, object]:
    doc: dict[str, object] = {"id": iid, "runtime": "qemu", "vcpus": 1, "memoryMib": 512, "kernel": "vmlinuz"}
    return {**doc, "state": state, **({"userDataSecretRef": ref} if ref else {})}


async def start(lab: InprocLab) -> FakeRuntime:
    await lab.join("n1")
    boot = lab.node_dir("n1") / "instance-boot"
    boot.mkdir()
    (boot / "vmlinuz").write_bytes(b"a kernel")
    agent = await lab.start_node("n1")
    await lab.wait_connected("n1")
    await lab.wait_observed("n1", 1)
    assert agent.instances is not None
    runtime = agent.instances.runtimes["qemu"]
    assert isinstance(runtime, FakeRuntime)
    return runtime


async def set_instances(lab: InprocLab, *instances: dict[str, object]) -> int:
    info = await lab.admin.set_spec_section("n1", "instances", json.dumps({"instances": list(instances)}))
    return int(info.generation)


async def section(lab: InprocLab, state: str, after_seq: int = 0) -> common_pb2.SectionStatus:
    await lab.wait_event(
        "node.status",
        lambda ev, d: ev.subject == "n1" and ev.seq > after_seq and d["sections"].get("instances") == state,
        timeout=30,
    )
    node = await lab.admin.get_node("n1")
    return next(s for s in node.sections if s.section == "instances")


async def instance(lab: InprocLab, iid: str) -> common_pb2.InstanceStatus:
    return next(i for i in (await lab.admin.get_node("n1")).instances if i.id == iid)


async def test_the_user_data_reaches_the_guest_and_nothing_else(
    lab: InprocLab, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    value = f"#cloud-config\npassword: {secrets.token_hex(12)}\n".encode()
    runtime = await start(lab)
    await lab.admin.set_secret(NAME, value, nodes=["n1"])
    generation = await set_instances(lab, vm("a"), vm("b", ref=""))
    await lab.wait_observed("n1", generation, timeout=30)
    path, given = runtime.user_data["a"]
    assert given == value and "b" not in runtime.user_data
    assert path == lab.node_dir("n1") / "run" / "user-data" / "a" and path.stat().st_mode & 0o777 == 0o600
    delivered = await lab.wait_event("secret.delivered", lambda ev, d: ev.subject == "n1")
    d = json.loads(delivered.data_json)
    assert (d["name"], d["section"], d["generation"]) == (NAME, "instances", generation)
    listed = await lab.admin.list_secrets()
    assert [(s.name, list(s.used_by)) for s in listed.secrets] == [(NAME, ["n1/instances"])]
    assert [(i.id, i.state) for i in (await lab.admin.get_node("n1")).instances] == [("a", "RUNNING"), ("b", "RUNNING")]

    # While it runs the value is in its one file only: no store row, log record or other file of the node.
    secret_part = value.split(b"password: ")[1].strip()
    assert secret_part not in await store_dump(lab)
    assert not [r for r in caplog.records if secret_part.decode() in r.getMessage()]
    holding = [p for p in lab.node_dir("n1").rglob("*") if p.is_file() and secret_part in p.read_bytes()]
    assert holding == [path]

    generation = await set_instances(lab, vm("a", "STOPPED"), vm("b", ref=""))
    await lab.wait_observed("n1", generation, timeout=30)
    assert not path.exists()
    assert not [p for p in lab.node_dir("n1").rglob("*") if p.is_file() and secret_part in p.read_bytes()]


async def test_an_out_of_scope_secret_fails_that_instance_only(lab: InprocLab) -> None:
    runtime = await start(lab)
    await lab.admin.set_secret(NAME, b"user data", labels=["pool=vms"])
    await set_instances(lab, vm("a"), vm("b", ref=""))
    ev = await lab.wait_event("secret.refused", lambda ev, d: ev.subject == "n1" and d["reason"] == "out-of-scope")
    assert json.loads(ev.data_json)["section"] == "instances"
    failed = await section(lab, "FAILED")
    assert failed.reason == "InstanceFailed" and "out-of-scope" in failed.message
    a, b = await instance(lab, "a"), await instance(lab, "b")
    assert a.state == "ERROR" and a.message.startswith(f"user data '{NAME}' refused: out-of-scope: ")
    assert b.state == "RUNNING" and ("start", "a") not in runtime.calls

    await lab.admin.label_node("n1", {"pool": "vms"}, [])
    seq = (await lab.admin.fleet_snapshot()).event_seq
    await lab.admin.set_secret(NAME, b"user data")  # the same scope: the node is told to ask again
    await section(lab, "CONVERGED", after_seq=seq)
    assert runtime.user_data["a"][1] == b"user data"


async def test_an_unavailable_broker_keeps_the_instance_stopped_and_the_section_progressing(lab: InprocLab) -> None:
    runtime = await start(lab)
    broker = lab.server.gateway.secrets
    lab.server.gateway.secrets = NoBroker()
    await lab.admin.set_secret(NAME, b"user data", nodes=["n1"])
    generation = await set_instances(lab, vm("a"))
    waiting = await section(lab, "PROGRESSING")
    assert waiting.reason == "SecretUnavailable"
    a = await instance(lab, "a")
    assert a.state == "STOPPED" and a.message.startswith("SecretUnavailable: ")
    assert (await lab.admin.get_node("n1")).observed_generation < generation
    assert ("start", "a") not in runtime.calls

    lab.server.gateway.secrets = broker
    await lab.admin.set_secret(NAME, b"user data")  # a rotation wakes the node at once
    await lab.wait_observed("n1", generation, timeout=30)
    assert runtime.user_data["a"][1] == b"user data"


async def test_an_instance_of_an_allocation_asks_bound_to_it_and_only_a_live_one_is_answered(lab: InprocLab) -> None:
    runtime = await start(lab)
    await lab.admin.set_secret(NAME, b"user data", nodes=["n1"])
    res = await lab.admin.reserve(1, node_id="n1")
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id)
    alloc = res.allocation_id
    assert alloc
    await set_instances(lab, {**vm("a"), "allocationId": alloc}, {**vm("b"), "allocationId": "not-mine-1"})
    refused = await lab.wait_event(
        "secret.refused", lambda ev, d: ev.subject == "n1" and d["reason"] == "allocation-not-live"
    )
    assert json.loads(refused.data_json)["allocation_id"] == "not-mine-1"
    delivered = await lab.wait_event(
        "secret.delivered", lambda ev, d: ev.subject == "n1" and d.get("allocation_id") == alloc
    )
    assert json.loads(delivered.data_json)["section"] == "instances"
    failed = await section(lab, "FAILED")
    assert failed.reason == "InstanceFailed" and "allocation-not-live" in failed.message
    a, b = await instance(lab, "a"), await instance(lab, "b")
    assert a.state == "RUNNING" and runtime.user_data["a"][1] == b"user data"
    assert b.state == "ERROR" and b.message.startswith(f"user data '{NAME}' refused: allocation-not-live: ")
    assert "b" not in runtime.user_data
