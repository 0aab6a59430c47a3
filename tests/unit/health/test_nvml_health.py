"""The NVML health source against a stand-in for the pynvml module (the hardware edge, faked).

The stand-in answers the calls `agent.hw.nvml_health` makes, the way
nvidia-ml-py does: handles, a UUID, ECC counters, remapped rows, clock event
reasons, an event set that delivers each XID once and then raises a timeout,
and `NVMLError_GpuIsLost` for a GPU that fell off the bus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent.health import rules
from agent.hw.nvml_health import NvmlHealthSource, read_meminfo


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(15)


@dataclass
class Gpu:
    uuid: str
    ecc_volatile_uncorrected: int = 0
    rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    reasons: int = 0
    lost: bool = False
    handle_lost: bool = False


@dataclass
class FakeNvml:
    gpus: list[Gpu]
    events: list[tuple[int, int]] = field(default_factory=list)  # (gpu index, xid)
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_GPU_IS_LOST = 15
    nvmlEventTypeXidCriticalError = 8
    registered: list[int] = field(default_factory=list)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if self.gpus[i].handle_lost:
            raise NVMLError_GpuIsLost()
        return i

    def _gpu(self, h: int) -> Gpu:
        if self.gpus[h].lost:
            raise NVMLError_GpuIsLost()
        return self.gpus[h]

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return self.gpus[h].uuid.encode()  # bytes, as before pynvml 11.5

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, kind: int, es: str) -> None:
        self.registered.append(h)

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "the read never waits"
        if not self.events:
            raise NVMLError(10)  # NVML_ERROR_TIMEOUT
        index, xid = self.events.pop(0)
        return SimpleNamespace(device=index, eventType=8, eventData=xid)

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        g = self._gpu(h)
        return g.ecc_volatile_uncorrected if (kind, counter) == (1, 0) else 0

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self._gpu(h).rows

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h).reasons

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        self._gpu(h)
        return SimpleNamespace(gpu=37, memory=20)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._gpu(h)
        return SimpleNamespace(total=80 << 30, used=10 << 30, free=70 << 30)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._gpu(h)
        return 41

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._gpu(h)
        return 123_456  # mW


def _source(tmp_path: Path, nvml: FakeNvml) -> NvmlHealthSource:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:    8000000 kB\n")
    return NvmlHealthSource(tmp_path, nvml=nvml, meminfo=meminfo)


def test_a_healthy_gpu_reads_its_gauges_and_the_host_its_memory(tmp_path: Path) -> None:
    nvml = FakeNvml([Gpu("GPU-a")])
    r = _source(tmp_path, nvml).read()
    (g,) = r.gpus
    assert (g.uuid, g.utilization_pct, g.memory_used_bytes, g.temperature_c, g.power_w) == (
        "GPU-a",
        37.0,
        10 << 30,
        41.0,
        123.456,
    )
    assert rules.gpu_verdict(g, []).status == "True"
    assert (r.host.memory_total_bytes, r.host.memory_available_bytes) == (16_000_000 * 1024, 8_000_000 * 1024)
    assert r.host.disk_free_bytes is not None and nvml.registered == [0]


def test_each_fault_reads_as_nvml_reports_it(tmp_path: Path) -> None:
    gpus = [
        Gpu("GPU-ecc", ecc_volatile_uncorrected=2),
        Gpu("GPU-pending", rows=(1, 0, 1, 0)),
        Gpu("GPU-failed", rows=(0, 3, 0, 1)),
        Gpu("GPU-slow", reasons=0x8 | 0x1),  # hw-slowdown, and idle (harmless)
        Gpu("GPU-lost"),
        Gpu("GPU-xid"),
    ]
    nvml = FakeNvml(gpus, events=[(5, 79), (5, 13)])
    src = _source(tmp_path, nvml)
    src.read()  # every uuid seen once
    gpus[4].lost = True
    nvml.events = [(5, 79), (5, 13)]
    r = {g.uuid: g for g in src.read().gpus}
    reasons = {u: rules.gpu_verdict(g, [x for x in g.new_xids if x != 13]).reason for u, g in r.items()}
    assert reasons == {
        "GPU-ecc": "EccUncorrectable",
        "GPU-pending": "RowRemapPending",
        "GPU-failed": "RowRemapFailed",
        "GPU-slow": "Throttled",
        "GPU-lost": "FallenOffBus",
        "GPU-xid": "Xid79",
    }
    assert r["GPU-slow"].throttle == ("hw-slowdown",)
    assert r["GPU-xid"].new_xids == (79, 13)
    assert src.read().gpus[5].new_xids == (), "an event is delivered once"


def test_a_gpu_whose_handle_is_gone_keeps_its_uuid_and_reads_lost(tmp_path: Path) -> None:
    gpus = [Gpu("GPU-a"), Gpu("GPU-b")]
    src = _source(tmp_path, FakeNvml(gpus))
    src.read()
    gpus[1].handle_lost = True
    (a, b) = src.read().gpus
    assert (a.lost, b.uuid, b.lost) == (False, "GPU-b", True)


def test_no_nvml_is_a_host_only_reading(tmp_path: Path) -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise NVMLError(9)  # driver not loaded

    r = _source(tmp_path, Broken([Gpu("GPU-a")])).read()
    assert r.gpus == () and r.host.memory_total_bytes


def test_meminfo_without_memavailable_says_nothing(tmp_path: Path) -> None:
    p = tmp_path / "meminfo"
    p.write_text("MemTotal: 100 kB\n")
    assert read_meminfo(p) == (102400, None)
    assert read_meminfo(tmp_path / "missing") == (None, None)
