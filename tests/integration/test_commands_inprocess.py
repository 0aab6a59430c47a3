"""Commands end to end in one process: real gRPC, real journal files, fake GPUs."""

from __future__ import annotations

import json

from bc.protocol.pb import admin_pb2
from tests.integration.conftest import InprocLab


async def settled(lab: InprocLab, command_id: str, timeout: float = 15.0) -> admin_pb2.CommandInfo:
    await lab.wait_event("command.settled", lambda ev, d: ev.subject == command_id, timeout)
    return await lab.admin.get_command(command_id)


async def test_inventory_refresh_succeeds(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    cmd = await lab.admin.run_command("n1", "inventory.refresh")
    assert cmd.state == "pending" and cmd.lane == "control"
    done = await settled(lab, cmd.id)
    assert done.state == "succeeded", done
    result = json.loads(done.result_json)
    assert len(result["inventory"]["gpus"]) == 8
    # Each command names the worker key that signed its stored body (what `bc tui` shows when one is opened);
    # inventory.refresh is not an attested kind.
    pki = await lab.admin.get_pki()
    assert done.signer_key_id and done.signer_key_id == pki.worker.key_id
    assert not done.attested


async def test_unsupported_and_invalid_payload(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    reset = await lab.admin.run_command("n1", "gpu.reset", payload_json='{"gpu_uuids": []}')
    done = await settled(lab, reset.id)
    assert (done.state, done.reason) == ("failed", "invalid-payload")


async def test_gpu_reset_refused_under_a_live_hold(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    res = await lab.admin.reserve(1, node_id="n1")
    await lab.wait_observed("n1", res.generation)
    uuid = res.devices[0].gpu_uuid
    cmd = await lab.admin.run_command("n1", "gpu.reset", payload_json=json.dumps({"gpu_uuids": [uuid]}))
    done = await settled(lab, cmd.id)
    assert (done.state, done.reason) == ("failed", "gpu-busy"), done
    assert res.allocation_id in done.message
    assert done.attested  # a gpu.reset's result settles only with the node's verified signature


async def test_cancel_before_dispatch_wins(lab: InprocLab) -> None:
    await lab.join("n1")  # never started: the command stays pending
    cmd = await lab.admin.run_command("n1", "inventory.refresh")
    out = await lab.admin.cancel_command(cmd.id)
    assert out.state == "cancelled"
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    assert (await lab.admin.get_command(cmd.id)).state == "cancelled"


async def test_min_generation_defers_until_the_spec_arrives(lab: InprocLab) -> None:
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_observed("n1", 1)
    cmd = await lab.admin.run_command("n1", "inventory.refresh", min_generation=5)
    # Generation 5 does not exist yet: the agent acknowledges nothing and defers it; it stays in flight.
    assert (await lab.admin.get_command(cmd.id)).state in ("pending", "dispatched")
    for i in range(4):
        await lab.admin.set_spec_section("n1", "telemetry", json.dumps({"export_interval_s": 10 + i}))
    done = await settled(lab, cmd.id)
    assert done.state == "succeeded", done
