"""The agent's wiring of instance networks, over an in-memory link (tests/unit/agent/test_agent_over_link.py's
harness): where the VMs are real (the qemu runtime) its Hello advertises `instance.network-policy`, and a
restore by the rules guard reaches the gateway as the node event `instance.rules-restored`."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

from agent.app import Agent, AgentOptions, AgentParts
from agent.hw.fake import FakeHardware
from agent.identity import HeldIdentity, Identity
from agent.instances.net.taps import NetlinkTaps
from agent.instances.qemu import QemuRuntime
from agent.journal_api import new_journal_id
from agent.memory_journal import MemoryJournal
from agent.node_key import NodeKey
from agent.offload import inline
from bc.pki import keys
from bc.seams.virtual_time import virtual_clock
from tests.unit.agent.test_agent_over_link import NODE, Gateway, expect, run, welcome


def build(tmp: Path, gateway: Gateway) -> Agent:
    rng = random.Random(7)

    async def journal() -> MemoryJournal:
        return MemoryJournal(new_journal_id(rng))

    parts = AgentParts(
        clock=virtual_clock(),
        rng=rng,
        identity=Identity(node_id=NODE, role="node", server="memory", identity_generation=1, ca_fingerprint=""),
        ca_pem=b"",
        identity_store=HeldIdentity(),
        node_key=NodeKey(None, keys.generate_key()),
        hw=FakeHardware("hgx-h100-8", NODE, state_dir=tmp, rng=rng, offload=inline),
        dial=gateway.dial,
        open_journal=journal,
        offload=inline,
        renewal=False,
        # The qemu runtime over an empty directory: no qemu runs, no NIC exists, so no nft is called either.
        instances=QemuRuntime(tmp / "instances", inline, taps=NetlinkTaps()),
    )
    return Agent(AgentOptions(data_dir=tmp), parts)


def test_a_node_with_real_vms_advertises_network_policy_and_reports_a_restore(tmp_path: Path) -> None:
    async def scenario() -> None:
        gw = Gateway()
        agent = build(tmp_path, gw)
        task = asyncio.create_task(agent.run())
        link = await gw.accept()
        hello = await welcome(link, epoch=1)
        assert {"instances.qemu", "instance.network-policy"} <= set(hello.capabilities)
        assert agent.network is not None and agent.network.on_restored is not None
        await agent.network.on_restored({"tables": ["bridge bc_instances: 0/30"]})
        msg = await expect(
            link, "event_batch", lambda m: any(e.type == "instance.rules-restored" for e in m.event_batch.events)
        )
        (ev,) = [e for e in msg.event_batch.events if e.type == "instance.rules-restored"]
        assert json.loads(ev.body) == {"tables": ["bridge bc_instances: 0/30"]}
        agent.stopped.set()
        await asyncio.wait_for(task, 60)

    run(scenario())
