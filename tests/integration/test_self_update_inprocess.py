"""Self-update in one process: a real `bc serve` (gRPC, its HTTPS release server, SQLite), real agents on fake
GPUs over A/B slots in a temp dir. The "binaries" are bytes: a restart is a new Agent on the same dirs, started
with the version that slot holds, as systemd's Restart=always would start `current` again.

Covered: a release key reaches the node in its trust bundle; publish, then daemon.upgrade downloads over
HTTPS, verifies, swaps and restarts; the new agent confirms on its first Welcome (SUCCEEDED, floor raised); a
new agent that never connects is rolled back within the (shortened) deadline and the old one reports FAILED
update-failed and never retries that version; a bad signature is refused before anything is swapped; bad publish
input stores nothing. The attacks on the signed fields, the sequence and the staged binary's --version are in
tests/security/test_sec_releases_*.py."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import json_format

from agent.app import Agent, AgentOptions, production_parts
from agent.upgrade.controller import UpgradeConfig
from agent.upgrade.slots import install, read_disk
from bc.errors import BcError
from bc.pki import releases
from bc.pki.releases import upgrade_request
from bc.protocol.pb import admin_pb2, common_pb2
from tests.integration.conftest import InprocLab, open_lab

KEY = ed25519.Ed25519PrivateKey.generate()
CONFIRM_S = 3.0


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[InprocLab]:
    async with open_lab(tmp_path, release_listen="127.0.0.1:0") as lab:
        yield lab


async def until(what: str, pred: Callable[[], bool], timeout: float = 10.0) -> None:
    async def go() -> None:
        while not pred():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(go(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def binary(says: str) -> bytes:
    """A release "binary": a script whose `--version` says `bc <says>`, padded to 50 kB with a comment."""
    pad = random.Random(says).randbytes(25_000).hex()
    return f"#!/bin/sh\necho 'bc {says}'\nexit 0\n# {pad}\n".encode()


async def publish(
    lab: InprocLab, version: str, tmp: Path, *, says: str = "", platform: str = ""
) -> tuple[admin_pb2.ReleaseInfo, bytes]:
    """Sign (name bc, the next sequence, this host's platform) and upload a release whose binary says `says`."""
    data = binary(says or version)
    path = tmp / f"bc-{version}-linux-x86_64"
    path.write_bytes(data)
    sha, size = releases.file_digest(path)
    platform = platform or releases.host_platform()
    sequence = (await lab.admin.list_releases("bc")).next_sequence
    signed = releases.Release("bc", version, sequence, platform, sha, size)
    header = admin_pb2.PublishReleaseChunk(
        name="bc",
        version=version,
        sequence=sequence,
        platform=platform,
        sha256=sha,
        size=size,
        signature=releases.sign(KEY, signed),
    )
    return await lab.admin.publish_release(header, path), data


def payload(info: admin_pb2.ReleaseInfo, **override: object) -> str:
    req = upgrade_request(info)
    for k, v in override.items():
        setattr(req, k, v)
    return json_format.MessageToJson(req, indent=None)


class Node:
    """One node's dirs and its restarts: each start is a new Agent on the slot `current` names."""

    def __init__(self, lab: InprocLab, node_id: str) -> None:
        self.lab, self.node_id = lab, node_id
        self.install_dir = lab.root / f"install-{node_id}"
        self.restarted = asyncio.Event()

    def start(self, version: str, *, dial: bool = True) -> Agent:
        opts = AgentOptions(
            data_dir=self.lab.node_dir(self.node_id),
            fake_hw="hgx-h100-8",
            heartbeat_interval_s=1.0,
            install_dir=self.install_dir,
            upgrade=UpgradeConfig(confirm_s=CONFIRM_S),
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


async def settled(lab: InprocLab, command_id: str, timeout: float = 30.0) -> admin_pb2.CommandInfo:
    await lab.wait_event("command.settled", lambda ev, d: ev.subject == command_id, timeout)
    return await lab.admin.get_command(command_id)


async def ready(lab: InprocLab, tmp: Path) -> tuple[Node, admin_pb2.ReleaseInfo, bytes]:
    await lab.admin.add_release_key(releases.public_bytes(KEY))
    await until("the release key in the server's bundle", lambda: bool(lab.server.intent.release_keys))
    info, data = await publish(lab, "1.1.0", tmp)
    await lab.join("n1")
    node = Node(lab, "n1")
    install(node.install_dir, b"old binary", version="1.0.0")
    agent = node.start("1.0.0")
    await until("the release key on the node", lambda: bool(agent.trust.bundle.release_keys))
    return node, info, data


async def test_an_upgrade_that_confirms(lab: InprocLab, tmp_path: Path) -> None:
    node, info, data = await ready(lab, tmp_path)
    assert info.sequence == 1 and info.url.startswith("https://127.0.0.1:")
    cmd = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload(info))
    await node.restart_after_swap()
    disk = read_disk(node.install_dir)
    assert (disk.current, disk.record.state, disk.record.version) == ("b", "pending", "1.1.0")
    assert (node.install_dir / "bc.b").read_bytes() == data
    assert (node.install_dir / "bc.b").stat().st_mode & 0o777 == 0o755
    assert (await lab.admin.get_command(cmd.id)).state in ("dispatched", "acked", "running")  # not settled

    node.start("1.1.0")  # what `current` now names
    done = await settled(lab, cmd.id)
    assert done.state == "succeeded", done
    assert json.loads(done.result_json) == {"version": "1.1.0", "slot": "b", "running": "1.1.0"}
    disk = read_disk(node.install_dir)
    assert (disk.current, disk.record.state, disk.record.floor) == ("b", "confirmed", 1)

    # The same release again: already there, no swap. Renumbered below: its signature no longer holds.
    same = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload(info))
    done = await settled(lab, same.id)
    assert done.state == "succeeded" and json.loads(done.result_json)["swapped"] is False, done
    low = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload(info, version="0.9"))
    done = await settled(lab, low.id)
    assert (done.state, done.reason) == ("failed", "bad-release"), done

    status = await lab.admin.list_releases()
    assert [(n.node_id, n.version) for n in status.nodes] == [("n1", "0.9")]
    assert [(r.name, r.version, r.platform) for r in status.releases] == [("bc", "1.1.0", releases.host_platform())]


async def test_an_upgrade_that_never_connects_is_rolled_back(lab: InprocLab, tmp_path: Path) -> None:
    node, info, _data = await ready(lab, tmp_path)
    cmd = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload(info))
    await node.restart_after_swap()

    t0 = asyncio.get_running_loop().time()
    node.start("1.1.0", dial=False)  # the new binary never reaches a gateway
    await node.restart_after_swap()  # ... so at the deadline it swaps back and restarts
    assert asyncio.get_running_loop().time() - t0 < CONFIRM_S + 5
    disk = read_disk(node.install_dir)
    assert (disk.current, disk.record.state, disk.record.failed_versions) == ("a", "failed", ("1.1.0",))

    node.start("1.0.0")  # the old binary reports the outcome
    done = await settled(lab, cmd.id)
    assert (done.state, done.reason) == ("failed", "update-failed"), done
    assert "rolled back" in done.message

    again = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=payload(info))
    done = await settled(lab, again.id)
    assert (done.state, done.reason) == ("failed", "failed-before"), done


async def test_a_bad_signature_or_digest_is_refused_before_anything_is_swapped(lab: InprocLab, tmp_path: Path) -> None:
    node, info, _data = await ready(lab, tmp_path)
    before = read_disk(node.install_dir)
    forged = releases.sign(ed25519.Ed25519PrivateKey.generate(), releases.release_of(info))
    cases = {
        "signature": payload(info, signature=forged),
        "sha256": payload(info, sha256=hashlib.sha256(b"other").hexdigest()),
        "http": payload(info, url=info.url.replace("https://", "http://")),
    }
    for what, body in cases.items():
        cmd = await lab.admin.run_command("n1", "daemon.upgrade", payload_json=body)
        done = await settled(lab, cmd.id)
        assert (done.state, done.reason) == ("failed", "bad-release"), (what, done)
    assert read_disk(node.install_dir) == before
    assert not list(node.install_dir.glob("*.partial")) and not node.restarted.is_set()


async def test_bad_publish_input_stores_nothing(lab: InprocLab, tmp_path: Path) -> None:
    path = tmp_path / "bc-2.0.0-linux-x86_64"
    path.write_bytes(b"x" * 1000)
    sha, size = releases.file_digest(path)
    here = releases.host_platform()

    async def refused(header: admin_pb2.PublishReleaseChunk, match: str, p: Path | None = path) -> None:
        with pytest.raises(BcError, match=match):
            await lab.admin.publish_release(header, p)

    def header(
        sequence: int = 1, key: ed25519.Ed25519PrivateKey = KEY, **over: object
    ) -> admin_pb2.PublishReleaseChunk:
        fields: dict[str, object] = {"name": "bc", "version": "2.0.0", "sequence": sequence, "platform": here}
        fields |= {"sha256": sha, "size": size}
        signed = releases.Release(**fields)  # type: ignore[arg-type]
        fields |= over
        return admin_pb2.PublishReleaseChunk(signature=releases.sign(key, signed), **fields)  # type: ignore[arg-type]

    await refused(header(), "no release key")
    await lab.admin.add_release_key(releases.public_bytes(KEY))
    await refused(header(key=ed25519.Ed25519PrivateKey.generate()), "does not verify under any trusted release key")
    await refused(header(size=size + 1), "the uploaded file is 1000 bytes")
    await refused(header(platform="linux-aarch64"), "does not verify")
    await refused(header(sequence=2), "not the next of release name 'bc' \\(1 is\\)")
    await refused(header(url="http://x/y"), "not an https:// URL", None)
    assert (await lab.admin.list_releases()).releases == []
    assert [p.name for p in (lab.server.opts.data_dir / "releases").iterdir()] == []
    ok = await lab.admin.publish_release(header(), path)
    assert (ok.sequence, ok.name, ok.platform) == (1, "bc", here)
    await refused(header(sequence=2), "already")
    assert (await lab.admin.list_releases("bc")).next_sequence == 2
    assert (await lab.admin.list_releases("other")).next_sequence == 1  # sequences count per name


async def test_the_daemon_section_upgrades_and_is_unsupported_without_slots(lab: InprocLab, tmp_path: Path) -> None:
    node, info, _data = await ready(lab, tmp_path)
    await lab.join("n2")
    await lab.start_node("n2")  # no install dir: a zipapp or a checkout
    section = payload(info)
    spec = await lab.admin.set_spec_section("n1", "daemon", section)
    await node.restart_after_swap()
    node.start("1.1.0")
    await lab.wait_observed("n1", spec.generation, timeout=30)
    disk = read_disk(node.install_dir)
    assert (disk.current, disk.record.state) == ("b", "confirmed")
    shown = await lab.admin.get_node("n1")
    daemon = next(s for s in shown.sections if s.section == "daemon")
    assert daemon.state == common_pb2.CONVERGED, daemon

    spec2 = await lab.admin.set_spec_section("n2", "daemon", section)
    await lab.wait_observed("n2", spec2.generation)
    shown = await lab.admin.get_node("n2")
    daemon = next(s for s in shown.sections if s.section == "daemon")
    assert (daemon.state, daemon.reason) == (common_pb2.UNSUPPORTED, "no-slots"), daemon
