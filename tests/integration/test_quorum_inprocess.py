"""The destructive-batch quorum through the real server, gateway and agent, in one process."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agent.hw.fake import FakeHardware
from bc.protocol.pb import admin_pb2
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import approvers, settle, sign


async def settled(lab: InprocLab, command_id: str, timeout: float = 15.0) -> dict[str, Any]:
    ev = await lab.wait_event("command.settled", lambda ev, d: ev.subject == command_id, timeout)
    return dict(json.loads(ev.data_json))


async def test_a_batch_runs_only_after_k_approvals_and_each_leaf_once(lab: InprocLab) -> None:
    for n in ("n1", "n2"):
        await lab.join(n)
        await lab.start_node(n)
        await lab.wait_connected(n)
    keys = await approvers(lab)
    for n in ("n1", "n2"):  # the new bundle (approvers, k) reaches the live sessions
        agent = lab.agents[n]
        async with asyncio.timeout(10):
            while len(agent.trust.bundle.approver_keys) != 3:
                await asyncio.sleep(0.05)
    gpus = {n: lab.agents[n].inventory.gpus[0].uuid for n in ("n1", "n2")}
    # One payload for the whole batch: reset the GPU each node has at index 0 — the fake GPUs differ per node,
    # so use a payload naming both; each node resets the one it has and reports the other unknown.
    payload = json.dumps({"gpu_uuids": [gpus["n1"], gpus["n2"]]})
    b = await lab.admin.create_batch("gpu.reset", ["n1", "n2"], payload, reason="XID 79")
    assert b.state == "pending" and len(b.leaves) == 2 and b.threshold == 2

    b = await sign(lab, b, keys[0])
    assert b.state == "pending" and b.approvals == 1
    cmds = {leaf.node_id: leaf.command_id for leaf in b.leaves}
    info = await lab.admin.get_command(cmds["n1"])
    assert info.state == "pending" and info.batch_id == b.id

    b = await sign(lab, b, keys[1])
    assert b.state == "approved"
    for n in ("n1", "n2"):
        done = await settled(lab, cmds[n])
        assert done["state"] == "succeeded", done
        assert FakeHardware.read_resets(lab.node_dir(n)) == {gpus[n]: 1}

    # An unbatched destructive command is refused once approvers exist (allowance 0 an hour).
    lone = await lab.admin.run_command("n1", "node.reboot")
    refused = await settled(lab, lone.id)
    assert refused["state"] == "rejected" and refused["reason"] == "UNBATCHED_LIMIT"
    sec = await lab.wait_event("security.unbatched-limit", lambda ev, d: d["command_id"] == lone.id)
    assert sec.subject == "n1" and "needs an approved batch" in json.loads(sec.data_json)["why"]
    # EnqueueCommands takes what RunCommand takes, and the node decides the same way.
    fanned = await lab.admin.enqueue_commands(
        [admin_pb2.RunCommandRequest(node_id=n, kind="node.reboot") for n in gpus]
    )
    for info in fanned:
        out = await settled(lab, info.id)
        assert out["state"] == "rejected" and out["reason"] == "UNBATCHED_LIMIT", (info.node_id, out)


async def test_the_unbatched_allowance_reaches_the_nodes_and_counts_per_hour(lab: InprocLab) -> None:
    await lab.join("n1")
    agent = await lab.start_node("n1")
    await lab.wait_connected("n1")
    signers = await approvers(lab)
    s = await lab.admin.set_unbatched_allowance(1)
    assert s.unbatched_destructive_per_hour == 0 and s.change.state == "pending"  # a quorum change: k must sign
    s = await settle(lab, s, signers)
    assert s.unbatched_destructive_per_hour == 1
    async with asyncio.timeout(10):  # pushed to the live session, signed by the root
        while agent.trust.bundle.unbatched_destructive_per_hour != 1:
            await asyncio.sleep(0.05)
    gpu = agent.inventory.gpus[0].uuid
    first = await lab.admin.run_command("n1", "gpu.reset", payload_json=json.dumps({"gpu_uuids": [gpu]}))
    assert (await settled(lab, first.id))["state"] == "succeeded"
    second = await lab.admin.run_command("n1", "gpu.reset", payload_json=json.dumps({"gpu_uuids": [gpu]}))
    refused = await settled(lab, second.id)
    assert refused["state"] == "rejected" and refused["reason"] == "UNBATCHED_LIMIT"
    assert FakeHardware.read_resets(lab.node_dir("n1")) == {gpu: 1}


async def test_a_bad_allowance_is_refused(lab: InprocLab) -> None:
    from bc.errors import UsageError

    try:
        await lab.admin.set_unbatched_allowance(-1)
    except UsageError as e:
        assert "between 0 and 1000" in e.message
    else:
        raise AssertionError("a negative allowance was accepted")
