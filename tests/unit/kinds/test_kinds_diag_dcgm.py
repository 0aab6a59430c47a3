"""diag.dcgm: without DCGM installed the command says so (DCGM is never faked)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.kinds import REGISTRY
from agent.kinds.base import DCGM_NOT_INSTALLED, GPU_BUSY
from agent.kinds.holds import busy_failure
from bc.protocol.pb import kinds_pb2
from tests.unit.kinds.kind_helpers import FakeNode, pack

DCGM = REGISTRY["diag.dcgm"]


@pytest.fixture
def no_dcgmi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PATH without dcgmi, so the test means the same on a machine that has DCGM."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("dcgmi") is None


@pytest.mark.usefixtures("no_dcgmi")
@pytest.mark.parametrize("level", [1, 2, 3, 4])
async def test_without_dcgmi_the_command_fails_dcgm_not_installed(node: FakeNode, level: int) -> None:
    await node.hold("alloc-1", ("gpu", node.uuid(0)))  # not-installed is reported before the hold check
    res = await DCGM.run(node.ctx, DCGM.parse(pack(kinds_pb2.DiagDcgmRequest(level=level))))
    assert (res.ok, res.reason) == (False, DCGM_NOT_INSTALLED)
    assert "dcgmi" in res.message and "install" in res.message


async def test_the_level_2_hold_check_covers_every_gpu_when_none_are_listed(node: FakeNode) -> None:
    """What diag.dcgm asks from level 2 (dcgmi itself is absent here, so the check is exercised directly)."""
    assert await busy_failure(node.cdi_dir, None, node.ctx.offload) is None
    await node.hold("alloc-7", ("gpu", node.uuid(5)))
    everything = await busy_failure(node.cdi_dir, None, node.ctx.offload)
    assert everything is not None and everything.reason == GPU_BUSY and "alloc-7" in everything.message
    assert await busy_failure(node.cdi_dir, {node.uuid(0)}, node.ctx.offload) is None
