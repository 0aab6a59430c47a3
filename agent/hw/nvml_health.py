"""GPU health from NVML on a real host, and the host's memory and disk from /proc and statvfs.

NVML stays initialized for the source's life, because XIDs arrive through an
event set that only reports events while it is registered: each `read()`
drains it without waiting (timeout 0). Every other counter is asked one at a
time and guarded, like the diag reader (agent.hw.nvml): a counter a GPU does
not support is None. A GPU any query answers GPU_IS_LOST has fallen off the
bus; once its handle is gone too, it keeps the uuid an earlier read saw.
Without pynvml or a driver the reading has no GPUs, only the host.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.health.readings import GpuReading, HealthReading, HostReading

log = logging.getLogger(__name__)

# Throttle (clock event) reasons that mean trouble, by NVML's bit, named for the condition message.
TROUBLE_THROTTLE = {
    0x8: "hw-slowdown",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _guard(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def read_meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes, None where the file does not say."""
    values: dict[str, int] = {}
    try:
        for line in path.read_text("ascii").splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024
    except OSError:
        return None, None
    return values.get("MemTotal"), values.get("MemAvailable")


def read_host(data_dir: Path, meminfo: Path = Path("/proc/meminfo")) -> HostReading:
    total, available = read_meminfo(meminfo)
    disk_total: int | None
    disk_free: int | None
    try:
        st = os.statvfs(data_dir)
        disk_total, disk_free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError:
        disk_total = disk_free = None
    return HostReading(
        memory_total_bytes=total,
        memory_available_bytes=available,
        disk_total_bytes=disk_total,
        disk_free_bytes=disk_free,
    )


class NvmlHealthSource:
    def __init__(self, data_dir: Path, *, nvml: Any = None, meminfo: Path = Path("/proc/meminfo")) -> None:
        """`nvml`: the pynvml module (left out: imported on first read); tests pass a stand-in."""
        self.data_dir = data_dir
        self.meminfo = meminfo
        self._given = nvml
        self._nvml: Any = None
        self._events: Any = None
        self._tried = False
        self._uuids: dict[int, str] = {}

    def _open(self) -> Any:
        if self._tried:
            return self._nvml
        self._tried = True
        try:
            pynvml: Any = self._given if self._given is not None else importlib.import_module("pynvml")
            pynvml.nvmlInit()
        except Exception as e:
            log.info("event=health.nvml-unavailable error=%r", str(e))
            return None
        self._nvml = pynvml
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for i in range(int(pynvml.nvmlDeviceGetCount())):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                _guard(pynvml.nvmlDeviceRegisterEvents, h, pynvml.nvmlEventTypeXidCriticalError, self._events)
        except Exception as e:
            log.warning("event=health.xid-events-unavailable error=%r", str(e))
            self._events = None
        return pynvml

    def _drain_xids(self, nvml: Any) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        if self._events is None:
            return out
        for _ in range(256):  # a bound: a storm of events is read over several passes
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing more
                break
            uuid = _guard(nvml.nvmlDeviceGetUUID, data.device)
            if uuid is not None:
                out.setdefault(_text(uuid), []).append(int(data.eventData))
        return out

    def read(self) -> HealthReading:
        host = read_host(self.data_dir, self.meminfo)
        nvml = self._open()
        if nvml is None:
            return HealthReading(host=host)
        xids = self._drain_xids(nvml)
        gpus = [self._gpu(nvml, i, xids) for i in range(int(_guard(nvml.nvmlDeviceGetCount) or 0))]
        return HealthReading(gpus=tuple(g for g in gpus if g is not None), host=host)

    def _gpu(self, nvml: Any, index: int, xids: dict[str, list[int]]) -> GpuReading | None:
        lost_code = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        lost = False

        def q(fn: Callable[..., Any], *args: Any) -> Any:
            nonlocal lost
            try:
                return fn(*args)
            except Exception as e:  # one counter a GPU cannot answer; GPU_IS_LOST says it fell off the bus
                if type(e).__name__.endswith("GpuIsLost") or getattr(e, "value", None) == lost_code:
                    lost = True
                return None

        h = q(nvml.nvmlDeviceGetHandleByIndex, index)
        uuid = q(nvml.nvmlDeviceGetUUID, h) if h is not None else None
        if uuid is not None:
            self._uuids[index] = _text(uuid)
        known = self._uuids.get(index)  # a GPU lost since an earlier read keeps the uuid it had
        if known is None:
            return None
        if h is None or uuid is None:
            return GpuReading(uuid=known, lost=lost)

        def ecc(kind: str, counter: str) -> int | None:
            v = q(nvml.nvmlDeviceGetTotalEccErrors, h, getattr(nvml, kind, 1), getattr(nvml, counter, 0))
            return None if v is None else int(v)

        rows = q(nvml.nvmlDeviceGetRemappedRows, h)
        pending = failed = False
        if isinstance(rows, tuple | list) and len(rows) == 4:
            pending, failed = bool(rows[2]), bool(rows[3])
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        mask = int(q(reasons_fn, h) or 0) if reasons_fn else 0
        util = q(nvml.nvmlDeviceGetUtilizationRates, h)
        mem = q(nvml.nvmlDeviceGetMemoryInfo, h)
        temp = q(nvml.nvmlDeviceGetTemperature, h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        power = q(nvml.nvmlDeviceGetPowerUsage, h)
        return GpuReading(
            uuid=known,
            lost=lost,
            new_xids=tuple(xids.get(known, ())),
            ecc_volatile_uncorrected=ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
            ecc_volatile_corrected=ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
            ecc_aggregate_uncorrected=ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
            ecc_aggregate_corrected=ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
            remap_pending=pending,
            remap_failed=failed,
            throttle=tuple(name for bit, name in TROUBLE_THROTTLE.items() if mask & bit),
            utilization_pct=None if util is None else float(util.gpu),
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            temperature_c=None if temp is None else float(temp),
            power_w=None if power is None else int(power) / 1000.0,
        )
