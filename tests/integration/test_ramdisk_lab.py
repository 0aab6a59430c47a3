"""The `ramdisk` role through the real server, gateway and agent in one process (SQLite and PostgreSQL):
a `--role ramdisk` token joins a machine with a certificate of at most 2 h; its inventory lists the
machine's disks; disk.wipe runs on a disk (a loop device where the kernel has them, else the image file
itself: `Disk.mode`) with a node-signed result; a `node` agent refuses the ramdisk's kinds; and a
ramdisk reboot (here the fake kexec, which ends the agent and starts a new fake boot) starts a new
journal, so what was in flight and not retry-safe fails `journal-lost` and never runs again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from agent.app import Agent, AgentOptions
from agent.join import join_node
from agent.ramdisk.kexec import KEXEC_FILE
from bc.errors import UsageError
from bc.pki import keys
from tests.http_server import serving
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import approvers
from tests.ramdisk_disks import add_sys_disk, disk_under_test, loop_devices_available

MIB = 1 << 20


async def join_ramdisk(lab: InprocLab, node_id: str) -> None:
    tok = await lab.admin.create_token(node_id, role="ramdisk")
    await join_node(lab.server.address, tok.token, lab.node_dir(node_id))


async def start_ramdisk(lab: InprocLab, node_id: str, machine_root: Path) -> Agent:
    opts = AgentOptions(
        data_dir=lab.node_dir(node_id), fake_hw="hgx-h100-8", heartbeat_interval_s=1.0, machine_root=machine_root
    )
    agent = Agent(opts)
    lab.agents[node_id] = agent
    lab.tasks[node_id] = asyncio.create_task(agent.run(), name=f"agent-{node_id}")
    return agent


async def settled(lab: InprocLab, command_id: str, timeout: float = 20.0) -> dict[str, Any]:
    ev = await lab.wait_event("command.settled", lambda ev, d: ev.subject == command_id, timeout)
    return dict(json.loads(ev.data_json))


async def test_a_ramdisk_joins_briefly_lists_its_disks_and_wipes_one_attested(lab: InprocLab, tmp_path: Path) -> None:
    mode = "file" if loop_devices_available() else "loop"
    with disk_under_test(mode, tmp_path / "d") as disk:
        await join_ramdisk(lab, "r1")
        cert = keys.load_cert_pem((lab.node_dir("r1") / "node.crt").read_bytes())
        life = cert.not_valid_after_utc - cert.not_valid_before_utc
        assert life.total_seconds() <= 2 * 3600 + 60, life  # the CA backdates 60 s
        await start_ramdisk(lab, "r1", disk.tree.root)
        await lab.wait_connected("r1")
        info = await lab.admin.get_node("r1")
        assert info.role == "ramdisk"
        listed = {d.name: d for d in info.inventory.disks}
        assert disk.name in listed, (disk.mode, sorted(listed))
        assert listed[disk.name].size_bytes == 32 * MIB and not listed[disk.name].mounted

        cmd = await lab.admin.run_command("r1", "disk.wipe", payload_json=json.dumps({"disks": [disk.name]}))
        done = await settled(lab, cmd.id)
        assert done["state"] == "succeeded", (disk.mode, done)
        got = await lab.admin.get_command(cmd.id)
        assert got.attested and got.lane == "provision"
        [entry] = json.loads(got.result_json)["disks"]
        assert entry["disk"] == disk.name and entry["reads_zero"], entry
        assert disk.image.read_bytes()[:MIB] == bytes(MIB)

        # The control plane sends a node no ramdisk kind (and its agent would answer UNSUPPORTED).
        await lab.join("n1")
        await lab.start_node("n1")
        await lab.wait_connected("n1")
        with pytest.raises(UsageError, match="does not run on node n1 \\(role node\\); it runs on ramdisk"):
            await lab.admin.run_command("n1", "disk.wipe", payload_json=json.dumps({"disks": ["sda"]}))


async def test_disk_wipe_and_deploy_image_wait_for_the_quorum_once_approvers_exist(
    lab: InprocLab, tmp_path: Path
) -> None:
    tree = tmp_path / "machine"
    add_sys_disk(tree, "vdb", 8 * MIB)
    await join_ramdisk(lab, "r1")
    agent = await start_ramdisk(lab, "r1", tree)
    await lab.wait_connected("r1")
    await approvers(lab)
    async with asyncio.timeout(10):  # the new bundle (approvers, k) reaches the live session
        while len(agent.trust.bundle.approver_keys) != 3:
            await asyncio.sleep(0.05)
    payloads = {
        "disk.wipe": {"disks": ["vdb"]},
        "deploy.image": {"url": "http://127.0.0.1:9/os.raw", "sha256": "0" * 64, "disk": "vdb"},
    }
    for kind, payload in payloads.items():
        lone = await lab.admin.run_command("r1", kind, payload_json=json.dumps(payload))
        out = await settled(lab, lone.id)
        assert (out["state"], out["reason"]) == ("rejected", "UNBATCHED_LIMIT"), (kind, out)
    assert (tree / "dev" / "vdb").read_bytes() == bytes(8 * MIB)  # untouched (it was zeros: a fresh file)


class HangingImage:
    """An image server whose body stops halfway and hangs until the test ends: a deploy stays in flight."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.gets: list[str] = []

    @staticmethod
    def serve(self_: HangingImage) -> type[BaseHTTPRequestHandler]:
        state = self_

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                state.gets.append(self.path)
                body = b"\x11" * (4 * MIB)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                state.release.wait(30)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def hanging() -> Iterator[tuple[str, HangingImage]]:
    h = HangingImage()
    with serving(HangingImage.serve(h)) as url:
        try:
            yield url, h
        finally:
            h.release.set()


def deployed_image(tree: Path, name: str) -> None:
    """Disk `name` of a fake tree, holding a GPT with one partition (what a deploy.image left)."""
    import subprocess

    dev = add_sys_disk(tree, name, 16 * MIB)
    subprocess.run(["sfdisk", "-q", str(dev)], input=b"label: gpt\n2048,24576,L\n", check=True)


async def test_a_ramdisk_reboot_fails_what_was_in_flight_journal_lost_and_runs_nothing_twice(
    lab: InprocLab, tmp_path: Path, hanging: tuple[str, HangingImage]
) -> None:
    url, server = hanging
    tree = tmp_path / "machine"
    deployed_image(tree, "vda")  # the installed OS, deployed earlier
    add_sys_disk(tree, "vdb", 8 * MIB)  # a data disk whose deploy is in flight when the machine reboots
    await join_ramdisk(lab, "r1")
    await start_ramdisk(lab, "r1", tree)
    first = await lab.wait_connected("r1")
    before = await lab.admin.get_node("r1")

    image = {"url": f"{url}/data.raw", "sha256": hashlib.sha256(b"x").hexdigest(), "disk": "vdb"}
    deploy = await lab.admin.run_command("r1", "deploy.image", payload_json=json.dumps(image))
    await lab.wait_event("command.updated", lambda ev, d: ev.subject == deploy.id and d["state"] == "running")
    kexec = {"disk": "vda", "partition": 1, "kernel": "/boot/vmlinuz", "initrd": "/boot/initrd.img", "cmdline": "ro"}
    boot = await lab.admin.run_command("r1", "boot.kexec", payload_json=json.dumps(kexec))

    # The fake kexec ends the agent (a real one ends the machine's ramdisk) and starts a new fake boot.
    async with asyncio.timeout(20):
        await lab.tasks["r1"]
    plan = json.loads((lab.node_dir("r1") / KEXEC_FILE).read_text())
    assert (plan["offset_bytes"], plan["kernel"], plan["cmdline"]) == (2048 * 512, "/boot/vmlinuz", "ro")
    lab.agents.pop("r1"), lab.tasks.pop("r1")

    # The machine comes back into a ramdisk (a new boot): same identity, new journal.
    await start_ramdisk(lab, "r1", tree)
    await lab.wait_connected("r1", after_seq=first.seq)
    for cid in (deploy.id, boot.id):
        out = await settled(lab, cid)
        assert (out["state"], out["reason"]) == ("failed", "journal-lost"), (cid, out)
    after = await lab.admin.get_node("r1")
    assert after.journal_id and after.journal_id != before.journal_id
    assert after.boot_id != before.boot_id
    assert server.gets == ["/data.raw"], "the deploy ran again into the new journal"
    # The new journal works: a retry-safe kind runs in it.
    again = await lab.admin.run_command("r1", "inventory.refresh")
    assert (await settled(lab, again.id))["state"] == "succeeded"
