"""Hardware backends: the real machine through NVML, or seeded fake GPUs (`--fake-hw`)."""

from __future__ import annotations

from agent.hw.base import HardwareBackend, inventory_hash
from agent.hw.fake import FakeHardware
from agent.hw.nvml import NvmlHardware

__all__ = ["FakeHardware", "HardwareBackend", "NvmlHardware", "inventory_hash", "open_backend"]


def open_backend(fake_profile: str | None, seed: str) -> HardwareBackend:
    """The fake profile when one is named (seeded by `seed`, normally the node id), else NVML."""
    if fake_profile:
        return FakeHardware(fake_profile, seed)
    return NvmlHardware()
