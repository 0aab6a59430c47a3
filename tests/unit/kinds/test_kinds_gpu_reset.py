"""gpu.reset: live holds (read from real CDI files) refuse the whole command before anything is touched."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agent.hw import NvmlHardware
from agent.hw.fake import FakeHardware
from agent.hw.nvml import RESET_DISABLED
from agent.kinds import REGISTRY
from agent.kinds.base import GPU_BUSY, KindResult
from bc.protocol.pb import kinds_pb2
from tests.unit.kinds.kind_helpers import FakeNode, pack

RESET = REGISTRY["gpu.reset"]


async def reset(node: FakeNode, *uuids: str) -> KindResult:
    request = RESET.parse(pack(kinds_pb2.GpuResetRequest(gpu_uuids=list(uuids))))
    return await RESET.run(node.ctx, request)


async def test_free_gpus_are_reset_and_read_healthy(node: FakeNode) -> None:
    g0, g1 = node.uuid(0), node.uuid(1)
    res = await reset(node, g0, g1)
    assert res.ok, res
    assert [(e["uuid"], e["reset"], e["healthy"]) for e in res.result["gpus"]] == [(g0, True, True), (g1, True, True)]
    assert node.resets() == {g0: 1, g1: 1}
    assert len(res.result["inventory"]["gpus"]) == 8
    assert res.result["inventory_hash"].startswith("sha256:")
    await reset(node, g0)
    assert node.resets() == {g0: 2, g1: 1}


async def test_an_unknown_gpu_is_not_reset_and_the_others_are(node: FakeNode) -> None:
    res = await reset(node, "GPU-not-here", node.uuid(2))
    assert res.ok
    first, second = res.result["gpus"]
    assert first == {"uuid": "GPU-not-here", "reset": False, "message": "unknown GPU"}
    assert second["reset"] and second["healthy"]
    assert node.resets() == {node.uuid(2): 1}


async def test_a_whole_gpu_hold_makes_the_command_gpu_busy(node: FakeNode) -> None:
    await node.hold("alloc-1", ("gpu", node.uuid(1)))
    res = await reset(node, node.uuid(0), node.uuid(1))
    assert (res.ok, res.reason) == (False, GPU_BUSY)
    assert "alloc-1" in res.message and node.uuid(1) in res.message
    assert res.result["busy"] == [{"uuid": node.uuid(1), "allocation_id": "alloc-1", "atom_id": node.uuid(1)}]
    assert node.resets() == {}  # GPU 0 was free, but nothing is touched when any GPU is busy


async def test_a_mig_instance_hold_makes_its_gpu_busy(tmp_path: Path) -> None:
    node = FakeNode(tmp_path, profile="mig-a100-4")
    mig = f"{node.uuid(0)}/2/0"
    await node.hold("alloc-mig", ("gpu.mig", mig))
    res = await reset(node, node.uuid(0))
    assert (res.ok, res.reason) == (False, GPU_BUSY)
    assert res.result["busy"] == [{"uuid": node.uuid(0), "allocation_id": "alloc-mig", "atom_id": mig}]
    assert (await reset(node, node.uuid(1))).ok  # another MIG GPU, not held


async def test_a_slot_hold_makes_its_gpu_busy(tmp_path: Path) -> None:
    node = FakeNode(tmp_path, profile="l4-slots-4")
    await node.hold("alloc-a", ("gpu.slot", f"{node.uuid(3)}/s0"))
    await node.hold("alloc-b", ("gpu.slot", f"{node.uuid(3)}/s2"))
    res = await reset(node, node.uuid(3))
    assert (res.ok, res.reason) == (False, GPU_BUSY)
    assert [b["allocation_id"] for b in res.result["busy"]] == ["alloc-a", "alloc-b"]
    assert "alloc-a" in res.message and "alloc-b" in res.message
    assert node.resets() == {}


async def test_a_released_hold_frees_the_gpu(node: FakeNode) -> None:
    await node.hold("alloc-1", ("gpu", node.uuid(0)))
    (node.cdi_dir / "bc-alloc-1.json").unlink()
    assert (await reset(node, node.uuid(0))).ok


class SickAfterReset(FakeHardware):
    """A GPU that still shows a pending row remap after its reset."""

    def diag(self, uuids: Any) -> dict[str, dict[str, Any]]:
        out = super().diag(uuids)
        for entry in out.values():
            entry["row_remapping"]["pending"] = True
        return out


async def test_a_gpu_with_a_pending_remap_reads_unhealthy_after_reset(node: FakeNode) -> None:
    node.ctx.hw = SickAfterReset("hgx-h100-8", "node-a", state_dir=node.data_dir)
    res = await reset(node, node.uuid(0))
    assert res.ok
    [entry] = res.result["gpus"]
    assert entry["reset"] is True and entry["healthy"] is False


class RealishHardware(NvmlHardware):
    """The NVML backend's reset path over the fake node's inventory (no NVML here)."""

    def __init__(self, fake: FakeHardware) -> None:
        super().__init__()
        self._fake = fake

    def inventory(self) -> Any:
        return self._fake.inventory()

    def diag(self, uuids: Any) -> dict[str, dict[str, Any]]:
        return self._fake.diag(uuids)


async def test_real_hardware_does_not_reset_unless_the_config_allows(node: FakeNode) -> None:
    node.ctx.hw = RealishHardware(node.hw)
    res = await reset(node, node.uuid(0))
    assert res.ok
    [entry] = res.result["gpus"]
    assert entry == {"uuid": node.uuid(0), "reset": False, "message": RESET_DISABLED}


@pytest.mark.wall_clock  # a real subprocess under a timeout: its exit comes from a thread the virtual loop cannot see
async def test_real_reset_runs_the_reset_command_with_the_uuid(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = tmp_path / "argv.txt"
    script = f"import sys; open({str(record)!r}, 'w').write(' '.join(sys.argv[1:])); print('GPU reset ok')"
    monkeypatch.setattr(NvmlHardware, "RESET_COMMAND", (sys.executable, "-c", script, "--gpu-reset", "-i"))
    node.ctx.hw = RealishHardware(node.hw)
    node.ctx.allow_gpu_reset = True
    res = await reset(node, node.uuid(0))
    [entry] = res.result["gpus"]
    assert entry["reset"] is True and entry["message"] == "GPU reset ok" and entry["healthy"] is True
    assert record.read_text() == f"--gpu-reset -i {node.uuid(0)}"


@pytest.mark.wall_clock
async def test_a_failing_reset_command_is_that_gpus_message(node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    script = "import sys; sys.stderr.write('Unable to reset GPU: in use by another client'); sys.exit(3)"
    monkeypatch.setattr(NvmlHardware, "RESET_COMMAND", (sys.executable, "-c", script))
    node.ctx.hw = RealishHardware(node.hw)
    node.ctx.allow_gpu_reset = True
    res = await reset(node, node.uuid(0))
    [entry] = res.result["gpus"]
    assert entry["reset"] is False and "exited 3" in entry["message"] and "in use" in entry["message"]
    assert "healthy" not in entry


async def test_a_missing_reset_tool_is_that_gpus_message(node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NvmlHardware, "RESET_COMMAND", ("bc-test-no-such-nvidia-smi", "--gpu-reset", "-i"))
    node.ctx.hw = RealishHardware(node.hw)
    node.ctx.allow_gpu_reset = True
    [entry] = (await reset(node, node.uuid(0))).result["gpus"]
    assert entry["reset"] is False and "not installed" in entry["message"]
