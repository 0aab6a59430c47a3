"""The NVML backend: real GPUs when NVML answers, an empty inventory (never a crash) when it does not."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from agent.hw.nvml import NvmlHardware


def test_without_pynvml_there_are_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    hw = NvmlHardware()
    inv = hw.inventory()
    assert inv.source == "none" and not inv.gpus
    assert inv.cpus > 0
    assert "not installed" in hw.describe()


class NVMLError(Exception):
    pass


def fake_pynvml(*, init_fails: bool = False) -> types.ModuleType:
    """Two GPUs: GPU 0 whole (no MIG support), GPU 1 MIG-enabled with one 3g.40gb instance."""
    m: Any = types.ModuleType("pynvml")
    gpus: dict[int, dict[str, Any]] = {
        0: {"uuid": b"GPU-0000", "name": b"NVIDIA H100 80GB HBM3", "mig": None},
        1: {"uuid": "GPU-1111", "name": "NVIDIA A100-SXM4-80GB", "mig": (1, 1)},
    }
    migs = {("GPU-1111", 0): ("MIG-aaaa", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 1, 0)}
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    def mig_mode(h: int) -> tuple[int, int]:
        if gpus[h]["mig"] is None:
            raise NVMLError("Not Supported")
        return gpus[h]["mig"]  # type: ignore[no-any-return]

    def mig_handle(h: int, i: int) -> tuple[str, int]:
        if (gpus[h]["uuid"], i) not in migs:
            raise NVMLError("Not Found")
        return (gpus[h]["uuid"], i)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = lambda: "550.90.07"
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: migs[h][0] if isinstance(h, tuple) else gpus[h]["uuid"]
    m.nvmlDeviceGetName = lambda h: migs[h][1] if isinstance(h, tuple) else gpus[h]["name"]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * (1 << 30))
    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7
    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    m.nvmlDeviceGetGpuInstanceId = lambda h: migs[h][2]
    m.nvmlDeviceGetComputeInstanceId = lambda h: migs[h][3]
    m.calls = calls
    return m  # type: ignore[no-any-return]


def test_nvml_init_failure_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_fails=True))
    hw = NvmlHardware()
    inv = hw.inventory()
    assert inv.source == "none" and not inv.gpus
    assert "Driver Not Loaded" in hw.describe()


def test_reads_gpus_and_mig_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    hw = NvmlHardware()
    inv = hw.inventory()
    assert inv.source == "nvml" and inv.driver_version == "550.90.07"
    g0, g1 = inv.gpus
    assert (g0.index, g0.uuid, g0.name, g0.pci_bus_id) == (
        0,
        "GPU-0000",
        "NVIDIA H100 80GB HBM3",
        "00000000:18:00.0",
    )
    assert g0.memory_mib == 81920 and not g0.mig_enabled and g0.healthy
    assert g1.mig_enabled
    assert [(m.gi, m.ci, m.uuid, m.profile) for m in g1.mig_instances] == [(1, 0, "MIG-aaaa", "3g.40gb")]
    assert nvml.calls == ["init", "shutdown"]
    assert hw.describe() == "nvml (2 GPUs)"
