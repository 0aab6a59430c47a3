"""GPU passthrough end to end (docs/instances.md): a real `bc serve` (SQLite and PostgreSQL) and a `--fake-hw`
node, whose VFIO edge is the fake sysfs tree under its data dir.

An `instance` reservation books whole GPUs in the same ledger as holds; the node records the booking (no CDI
spec); an instance naming those GPUs runs with them on vfio-pci and reports them; a hold asked for afterwards
never lands on them; `gpu.reset` of a passed-through GPU is refused `gpu-busy` naming the instance; a stop
hands the GPUs back to their drivers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.instances.fake_vfio import FakeVfio
from agent.instances.vfio import sysfs_address
from bc.errors import BcError
from bc.protocol.pb import admin_pb2
from tests.integration.conftest import InprocLab
from tests.integration.test_cli_cmd import bc, fails, ok_json
from tests.integration.test_quorum_cli import Lab, running_lab


def vm(iid: str, alloc: str, gpus: list[str], state: str = "RUNNING") -> dict[str, object]:
    doc = {"id": iid, "runtime": "qemu", "vcpus": 2, "memoryMib": 1024, "kernel": "vmlinuz", "state": state}
    return {**doc, "allocationId": alloc, "gpus": gpus}


async def settled(lab: InprocLab, command_id: str) -> admin_pb2.CommandInfo:
    await lab.wait_event("command.settled", lambda ev, d: ev.subject == command_id, 30)
    return await lab.admin.get_command(command_id)


async def test_an_instance_reservation_passes_its_gpus_through_and_nothing_else_gets_them(lab: InprocLab) -> None:
    await lab.join("n1")
    boot = lab.node_dir("n1") / "instance-boot"
    boot.mkdir()
    (boot / "vmlinuz").write_bytes(b"a kernel")
    agent = await lab.start_node("n1")
    await lab.wait_observed("n1", 1)

    with pytest.raises(BcError, match="an instance reservation passes whole GPUs through"):
        await lab.admin.reserve(1, node_id="n1", binding="instance", device_class="gpu.mig")
    res = await lab.admin.reserve(2, node_id="n1", binding="instance")
    assert res.state == "placed", res
    await lab.wait_event("reservation.active", lambda ev, d: ev.subject == res.id, 30)
    gpus = [d.gpu_uuid for d in res.devices]
    node_dir = lab.node_dir("n1")
    assert list((node_dir / "instance-bookings").iterdir()) == [
        node_dir / f"instance-bookings/bc-{res.allocation_id}.json"
    ]
    assert not any(p.name.startswith(f"bc-{res.allocation_id}") for p in (node_dir / "cdi").glob("*"))

    info = await lab.admin.set_spec_section(
        "n1", "instances", json.dumps({"instances": [vm("gpu-vm", res.allocation_id, gpus)]})
    )
    await lab.wait_observed("n1", info.generation, timeout=30)
    (shown,) = (await lab.admin.get_node("n1")).instances
    assert (shown.id, shown.state, list(shown.gpus)) == ("gpu-vm", "RUNNING", gpus), shown
    inventory = {g.uuid: g.pci_bus_id for g in (await lab.admin.get_node("n1")).inventory.gpus}
    vfio = FakeVfio(node_dir / "fake-sysfs")
    addresses = sorted(sysfs_address(inventory[g]) for g in gpus)
    assert [a for a in vfio.on_vfio() if a.endswith(".0")] == addresses  # each GPU, and its audio function
    assert len(vfio.on_vfio()) == 4
    assert agent.instances is not None

    # A hold for every GPU of the node waits: two of them are the VM's. Six fit, none of the VM's.
    big = await lab.admin.reserve(8, node_id="n1")
    assert big.state == "pending" and "8 free GPUs" in big.reason, big
    await lab.admin.release(big.id)
    hold = await lab.admin.reserve(6, node_id="n1")
    assert hold.state == "placed" and not {d.gpu_uuid for d in hold.devices} & set(gpus)

    reset = await lab.admin.run_command("n1", "gpu.reset", payload_json=json.dumps({"gpu_uuids": [gpus[0]]}))
    done = await settled(lab, reset.id)
    assert (done.state, done.reason) == ("failed", "gpu-busy"), done
    assert done.message == f"GPU {gpus[0]} is passed through to instance gpu-vm"

    info = await lab.admin.set_spec_section(
        "n1", "instances", json.dumps({"instances": [vm("gpu-vm", res.allocation_id, gpus, "STOPPED")]})
    )
    await lab.wait_observed("n1", info.generation, timeout=30)
    (shown,) = (await lab.admin.get_node("n1")).instances
    assert (shown.state, list(shown.gpus)) == ("STOPPED", [])
    assert vfio.on_vfio() == [] and vfio.driver(addresses[0]) == "nvidia"


@pytest.fixture
def cli_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    yield from running_lab(tmp_path, monkeypatch)


def test_bc_reserve_binding_instance_and_bc_instances_show_its_gpus(cli_lab: Lab) -> None:
    boot = cli_lab.node_dir("n1") / "instance-boot"
    boot.mkdir()
    (boot / "vmlinuz").write_bytes(b"a kernel")
    cli_lab.start_node("n1")
    cli_lab.wait_for("inventory", lambda: ok_json("nodes", "show", "n1").get("inventory", {}).get("gpus"))
    refused = fails(2, "reserve", "--gpus", "1", "--node", "n1", "--binding", "instance", "--cpus", "4")
    assert "an instance reservation books whole GPUs only" in refused
    res = ok_json("reserve", "--gpus", "1", "--node", "n1", "--binding", "instance")
    assert res["binding"] == "instance" and res["state"] == "placed", res
    gpu = res["devices"][0]["gpu_uuid"]
    doc = {"instances": [vm("gpu-vm", res["allocation_id"], [gpu])]}
    generation = ok_json("spec", "set", "n1", "instances", json.dumps(doc))["generation"]
    cli_lab.wait_for("observed", lambda: ok_json("nodes", "show", "n1")["observed_generation"] >= generation)
    shown = bc("instances", "show", "n1", "gpu-vm")
    assert shown.exit_code == 0 and f"gpus      {gpu}" in shown.stdout, shown.output
    assert ok_json("instances", "show", "n1", "gpu-vm")["gpus"] == [gpu]
