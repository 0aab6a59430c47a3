"""What a health source reads from the machine: one reading per GPU and one for the host.

A `HealthSource` is the hardware edge of health: NVML on a real host
(`agent.hw.nvml_health`), the fake backend plus injected faults under
`--fake-hw` (`agent.hw.fake_faults`). `read()` may block (NVML, /proc), so
the monitor calls it through the agent's offload seam. A counter the source
cannot read is None and says nothing either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class GpuReading:
    uuid: str
    lost: bool = False
    """Fallen off the bus: NVML answers GPU_IS_LOST (or the fake says so)."""
    new_xids: tuple[int, ...] = ()
    """XID events delivered since the last read (an event set delivers each once)."""
    ecc_volatile_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    remap_pending: bool = False
    remap_failed: bool = False
    throttle: tuple[str, ...] = ()
    """Active throttle reasons that mean trouble (hw-slowdown, hw-thermal, hw-power-brake, sw-thermal)."""
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class HostReading:
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    disk_total_bytes: int | None = None
    """Of the file system that holds the agent's data dir (its journal)."""
    disk_free_bytes: int | None = None


@dataclass(frozen=True)
class HealthReading:
    gpus: tuple[GpuReading, ...] = ()
    host: HostReading = field(default_factory=HostReading)


class HealthSource(Protocol):
    def read(self) -> HealthReading:
        """One reading of every GPU and the host; may block, so call it off the loop."""
        ...
