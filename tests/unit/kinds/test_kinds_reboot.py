"""node.reboot: a fake node reboots to a new boot id; real hardware reboots only when the config allows it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.hw import open_backend
from agent.hw.fake import BOOT_ID_FILE, FakeHardware
from agent.hw.nvml import NvmlHardware
from agent.kinds import REGISTRY
from agent.kinds.node_reboot import REBOOT_DISABLED, REBOOT_FAILED
from bc.protocol.pb import kinds_pb2
from tests.unit.kinds.kind_helpers import FakeNode, pack

REBOOT = REGISTRY["node.reboot"]


def test_the_fake_boot_id_lives_in_the_state_dir(tmp_path: Path) -> None:
    a = FakeHardware("hgx-h100-8", "node-a", state_dir=tmp_path)
    first = a.boot_id()
    assert (tmp_path / BOOT_ID_FILE).read_text().strip() == first
    assert FakeHardware("hgx-h100-8", "node-a", state_dir=tmp_path).boot_id() == first  # survives a restart
    assert FakeHardware("hgx-h100-8", "node-a").boot_id() != first  # no state dir: the kernel's


def test_open_backend_passes_the_state_dir(tmp_path: Path) -> None:
    hw = open_backend("l4-slots-4", "node-z", state_dir=tmp_path)
    assert isinstance(hw, FakeHardware) and hw.state_dir == tmp_path
    assert open_backend("l4-slots-4", "node-z").boot_id() == FakeHardware("l4-slots-4", "node-z").boot_id()


async def test_a_fake_reboot_with_a_hook_changes_the_boot_id(node: FakeNode) -> None:
    calls: list[str] = []
    node.hw.reboot_hook = lambda: calls.append(node.hw.boot_id())
    before = node.ctx.boot_id
    assert (node.data_dir / BOOT_ID_FILE).read_text().strip() == before

    res = await REBOOT.run(node.ctx, REBOOT.parse(pack(kinds_pb2.NodeRebootRequest(reason="kernel update"))))

    assert res.ok, res
    after = (node.data_dir / BOOT_ID_FILE).read_text().strip()
    assert after != before
    assert calls == [after]  # the hook ran once, after the new boot id was written
    assert res.result == {"previous_boot_id": before, "boot_id": after}
    assert node.hw.boot_id() == after


async def test_a_class_level_hook_is_called_unbound(node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def hook() -> None:
        calls.append(1)

    monkeypatch.setattr(FakeHardware, "reboot_hook", hook)
    res = await REBOOT.run(node.ctx, kinds_pb2.NodeRebootRequest())
    assert res.ok and calls == [1]


async def test_a_fake_without_a_state_dir_cannot_reboot(node: FakeNode) -> None:
    node.ctx.hw = FakeHardware("hgx-h100-8", "node-a")
    res = await REBOOT.run(node.ctx, kinds_pb2.NodeRebootRequest())
    assert (res.ok, res.reason) == (False, REBOOT_FAILED)
    assert "state dir" in res.message


async def test_real_hardware_refuses_unless_the_config_allows(node: FakeNode) -> None:
    node.ctx.hw = NvmlHardware()
    assert not node.ctx.allow_reboot
    res = await REBOOT.run(node.ctx, kinds_pb2.NodeRebootRequest(reason="test"))
    assert (res.ok, res.reason) == (False, REBOOT_DISABLED)
    assert "disabled" in res.message


REEXEC_SCRIPT = """
import asyncio, pathlib, sys
from agent.hw.fake import FakeHardware
state = pathlib.Path(sys.argv[1])
runs = state / "runs"
n = int(runs.read_text()) if runs.exists() else 0
runs.write_text(str(n + 1))
hw = FakeHardware("hgx-h100-8", "node-a", state_dir=state)
print(hw.boot_id(), flush=True)
if n == 0:
    asyncio.run(hw.reboot())
"""


def test_without_a_hook_a_fake_reboot_restarts_the_process(tmp_path: Path) -> None:
    """The real re-exec path, in a child process: it runs twice, with a new boot id the second time."""
    proc = subprocess.run(
        [sys.executable, "-c", REEXEC_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split()
    assert first != second
    assert (tmp_path / "runs").read_text() == "2"
    assert (tmp_path / BOOT_ID_FILE).read_text().strip() == second
