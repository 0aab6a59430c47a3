"""The `instances` section end to end on a fake-hardware node: a real `bc serve`, real gRPC, the fake runtime.

On SQLite and PostgreSQL (the `lab` fixture): the server refuses a bad section in one sentence, a node
converges the desired states in turn and reports its VMs, and `GetNode` (what `bc instances` reads) shows them.
"""

from __future__ import annotations

import json

import pytest

from bc.errors import BcError
from bc.protocol.pb import common_pb2
from tests.integration.conftest import InprocLab


def vm(iid: str, state: str, memory_mib: int = 1024) -> dict[str, object]:
    return {"id": iid, "runtime": "qemu", "vcpus": 2, "memory_mib": memory_mib, "kernel": "vmlinuz", "state": state}


async def converge(lab: InprocLab, *instances: dict[str, object]) -> list[common_pb2.InstanceStatus]:
    info = await lab.admin.set_spec_section("n1", "instances", json.dumps({"instances": list(instances)}))
    await lab.wait_observed("n1", info.generation)
    return list((await lab.admin.get_node("n1")).instances)


async def test_a_fake_node_runs_pauses_stops_and_deletes_instances(lab: InprocLab) -> None:
    await lab.join("n1")
    boot = lab.node_dir("n1") / "instance-boot"
    boot.mkdir()
    (boot / "vmlinuz").write_bytes(b"a kernel")
    await lab.start_node("n1")
    await lab.wait_connected("n1")

    with pytest.raises(BcError) as e:
        await lab.admin.set_spec_section(
            "n1", "instances", json.dumps({"instances": [{**vm("a", "RUNNING"), "gpus": ["GPU-0"]}]})
        )
    assert str(e.value) == (
        "the instances section's instances[0].gpus needs the instance's allocation_id: passthrough GPUs are booked"
        " by that allocation's BINDING_INSTANCE"
    )

    shown = await converge(lab, vm("a", "RUNNING"), vm("b", "PAUSED"))
    assert [(i.node_id, i.id, i.state, i.desired, i.managed, i.vcpus) for i in shown] == [
        ("n1", "a", "RUNNING", "RUNNING", True, 2),
        ("n1", "b", "PAUSED", "PAUSED", True, 2),
    ]
    shown = await converge(lab, vm("a", "STOPPED"), vm("b", "RUNNING"))
    assert [(i.id, i.state) for i in shown] == [("a", "STOPPED"), ("b", "RUNNING")]
    shown = await converge(lab, vm("a", "DELETED"), vm("b", "RUNNING", memory_mib=4 * 1024 * 1024))
    node = await lab.admin.get_node("n1")
    section = next(s for s in node.sections if s.section == "instances")
    assert [(i.id, i.state) for i in shown] == [("b", "RUNNING")]  # a resize reaches the next boot only
    assert section.state == common_pb2.CONVERGED

    # Host admission on the fake host's memory: an oversize start stays stopped, the section PROGRESSING.
    too_big = vm("c", "RUNNING", memory_mib=4 * 1024 * 1024)
    await lab.admin.set_spec_section("n1", "instances", json.dumps({"instances": [vm("b", "RUNNING"), too_big]}))
    await lab.wait_event(
        "node.status", lambda ev, d: ev.subject == "n1" and d["sections"].get("instances") == "PROGRESSING"
    )
    c = next(i for i in (await lab.admin.get_node("n1")).instances if i.id == "c")
    assert c.state == "STOPPED" and c.message.startswith("ResourcesExhausted: 4325632 MiB needed, ")
