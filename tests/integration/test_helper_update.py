"""Self-update through `bc helper`, in one process: a real `bc serve` (gRPC, its HTTPS release server, SQLite), a
real helper on a unix socket with its root in a temp dir (same uid here; tests/integration/test_helper_privsep.py
runs it as root beside another user), and real agents on fake GPUs started with `--helper-socket` from the
helper's install dir (`<root>/opt/bc`). A restart is a new Agent on the same dirs, as in
tests/integration/test_self_update_inprocess.py, whose release helpers this file uses.

Covered: the agent downloads and checks the release, the helper verifies it again under root's release roots and
swaps it, and the new agent confirms through the helper; a release root's list does not vouch for is refused
with the helper's sentence, as the command's failure and as the `daemon` section's; a helper that is down leaves
the section PROGRESSING and the next pass after it is back swaps; a new binary that never connects is rolled
back by the helper's steps and the old one reports `update-failed`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.app import Agent, AgentOptions, production_parts
from agent.converge.host_ops import FakeRunner
from agent.helper.ops import Layout
from agent.helper.server import HelperServer
from agent.upgrade.controller import UpgradeConfig
from agent.upgrade.slots import install, read_disk
from bc.pki import releases
from bc.protocol.pb import admin_pb2, common_pb2
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.test_self_update_inprocess import KEY, payload, publish, settled, until

CONFIRM_S = 3.0


def pem(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class Helper:
    """`bc helper` in this process: stopped and started again on the same socket and root."""

    def __init__(self, tmp: Path) -> None:
        self.layout = Layout(tmp / "root")
        self.socket = tmp / "helper.sock"
        self.server: asyncio.AbstractServer | None = None

    def trust(self, key: ed25519.Ed25519PrivateKey) -> None:
        """Root's list of release roots (0644, ours): here the release key itself."""
        self.layout.release_roots.parent.mkdir(parents=True, exist_ok=True)
        self.layout.release_roots.write_bytes(pem(key))

    async def start(self) -> None:
        self.server = await HelperServer(self.layout, os.getuid(), run=FakeRunner()).start(self.socket)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()
        self.server = None


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[InprocLab]:
    async with open_lab(tmp_path, release_listen="127.0.0.1:0") as lab:
        yield lab


@pytest.fixture
async def helper(tmp_path: Path) -> AsyncIterator[Helper]:
    h = Helper(tmp_path)
    install(h.layout.install_dir, b"old binary", version="1.0.0")
    h.trust(KEY)
    await h.start()
    yield h
    if h.server is not None:
        await h.stop()


class Node:
    """One unprivileged node: `--helper-socket`, run from the helper's install dir."""

    def __init__(self, lab: InprocLab, helper: Helper, node_id: str = "n1") -> None:
        self.lab, self.helper, self.node_id = lab, helper, node_id
        self.restarted = asyncio.Event()

    def start(self, version: str, *, dial: bool = True) -> Agent:
        opts = AgentOptions(
            data_dir=self.lab.node_dir(self.node_id),
            fake_hw="hgx-h100-8",
            heartbeat_interval_s=1.0,
            install_dir=self.helper.layout.install_dir,
            upgrade=UpgradeConfig(confirm_s=CONFIRM_S),
            helper_socket=self.helper.socket,
            drift_pass_s=0.5,
        )
        self.restarted = asyncio.Event()

        async def restart() -> None:
            self.restarted.set()

        async def never() -> object:
            await asyncio.Future()
            raise AssertionError("unreachable")

        parts = dataclasses.replace(production_parts(opts), version=version, restart=restart)
        if not dial:
            parts = dataclasses.replace(parts, dial=never)  # type: ignore[arg-type]
        agent = Agent(opts, parts)
        self.lab.agents[self.node_id] = agent
        self.lab.tasks[self.node_id] = asyncio.create_task(agent.run(), name=f"agent-{self.node_id}")
        return agent

    async def restart_after_swap(self) -> None:
        await asyncio.wait_for(self.restarted.wait(), 30)
        await self.lab.stop_node(self.node_id)


async def ready(lab: InprocLab, helper: Helper, tmp: Path) -> tuple[Node, admin_pb2.ReleaseInfo, bytes]:
    await lab.admin.add_release_key(releases.public_bytes(KEY))
    await until("the release key in the server's bundle", lambda: bool(lab.server.intent.release_keys))
    info, data = await publish(lab, "1.1.0", tmp)
    await lab.join("n1")
    node = Node(lab, helper)
    agent = node.start("1.0.0")
    await until("the release key on the node", lambda: bool(agent.trust.bundle.release_keys))
    return node, info, data


async def daemon_section(lab: InprocLab, pred: Callable[[common_pb2.SectionStatus], bool]) -> common_pb2.SectionStatus:
    """The node's `daemon` section status once `pred` holds (polled: a status report is written about once a second)."""
    async with asyncio.timeout(30):
        while True:
            shown = await lab.admin.get_node("n1")
            found = next((s for s in shown.sections if s.section == "daemon"), None)
            if found is not None and pred(found):
                return found
            await asyncio.sleep(0.1)


async def test_the_helper_verifies_and_swaps_what_the_unprivileged_agent_downloaded(
    lab: InprocLab, helper: Helper, tmp_path: Path
) -> None:
    node, info, data = await ready(lab, helper, tmp_path)
    cmd = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload(info))
    await node.restart_after_swap()
    install_dir = helper.layout.install_dir
    disk = read_disk(install_dir)
    assert (disk.current, disk.record.state, disk.record.version) == ("b", "pending", "1.1.0")
    assert (install_dir / "bc.b").read_bytes() == data
    assert not list(install_dir.glob("*.partial"))
    assert not list((lab.node_dir("n1") / "upgrade").iterdir())  # the agent's staged copy is gone

    node.start("1.1.0")  # what `current` now names: it confirms through the helper
    done = await settled(lab, cmd.id)
    assert done.state == "succeeded", done
    assert json.loads(done.result_json) == {"version": "1.1.0", "slot": "b", "running": "1.1.0"}
    disk = read_disk(install_dir)
    assert (disk.current, disk.record.state, disk.record.floor) == ("b", "confirmed", 1)


async def test_a_release_roots_list_does_not_vouch_for_is_refused_and_a_down_helper_is_waited_for(
    lab: InprocLab, helper: Helper, tmp_path: Path
) -> None:
    helper.trust(ed25519.Ed25519PrivateKey.generate())  # root lists another key: the agent's bundle is not enough
    node, info, _data = await ready(lab, helper, tmp_path)
    before = read_disk(helper.layout.install_dir)
    cmd = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload(info))
    done = await settled(lab, cmd.id)
    assert (done.state, done.reason) == ("failed", "helper-refused"), done
    assert done.message.startswith(
        "helper: refused: update.install: the signature of release bc 1.1.0 (sequence 1, "
    ), done.message
    assert "does not verify under the helper's release roots (1 in its list)" in done.message
    await lab.admin.set_spec_section("n1", "daemon", payload(info))
    failed = await daemon_section(lab, lambda s: s.state == common_pb2.FAILED)
    assert (failed.reason, failed.message) == ("helper-refused", done.message)  # remembered: no download again
    assert read_disk(helper.layout.install_dir).record.slots == before.record.slots
    assert not node.restarted.is_set()

    await helper.stop()  # down: the next release waits for it, the section PROGRESSING
    helper.trust(KEY)
    newer, _ = await publish(lab, "1.2.0", tmp_path)
    await lab.admin.set_spec_section("n1", "daemon", payload(newer))
    waiting = await daemon_section(lab, lambda s: s.reason == "helper-unavailable")
    assert waiting.state == common_pb2.PROGRESSING and waiting.message.startswith("helper: cannot reach")
    await helper.start()
    await node.restart_after_swap()  # a later pass swapped it
    disk = read_disk(helper.layout.install_dir)
    assert (disk.current, disk.record.state, disk.record.version) == ("b", "pending", "1.2.0")


async def test_a_new_release_that_never_connects_is_rolled_back_by_the_helper(
    lab: InprocLab, helper: Helper, tmp_path: Path
) -> None:
    node, info, _data = await ready(lab, helper, tmp_path)
    cmd = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload(info))
    await node.restart_after_swap()
    node.start("1.1.0", dial=False)  # the new binary never reaches a gateway
    await node.restart_after_swap()  # ... so at the deadline the helper swaps back
    disk = read_disk(helper.layout.install_dir)
    assert (disk.current, disk.record.state, disk.record.failed_versions) == ("a", "failed", ("1.1.0",))
    assert os.readlink(helper.layout.install_dir / "current") == "bc.a"

    node.start("1.0.0")
    done = await settled(lab, cmd.id)
    assert (done.state, done.reason) == ("failed", "update-failed"), done
