"""Hardware backends: the real machine through NVML, or seeded fake GPUs (`--fake-hw`).

`open_backend` is where a backend is made for a node: `bc node` (and so `make demo`, whose nodes are `bc node
--fake-hw`) and `bc sim` (`bc.sim.pair`) all call it. What the rest of the agent may do with one it reads from
`backend.capabilities`, never from the backend's type."""

from __future__ import annotations

import random
from pathlib import Path

from agent.hw.base import ActionDisabled, HardwareBackend, diag_healthy, inventory_hash
from agent.hw.fake import FakeHardware, InProcessReboot
from agent.hw.nvml import NvmlHardware
from agent.offload import Offload, to_thread

__all__ = [
    "ActionDisabled",
    "FakeHardware",
    "HardwareBackend",
    "InProcessReboot",
    "NvmlHardware",
    "diag_healthy",
    "inventory_hash",
    "open_backend",
]


def open_backend(
    fake_profile: str | None,
    seed: str,
    state_dir: Path | None = None,
    *,
    rng: random.Random | None = None,
    offload: Offload = to_thread,
    reboot: InProcessReboot | None = None,
) -> HardwareBackend:
    """The fake profile when one is named (seeded by `seed`, normally the node id), else NVML.

    `state_dir` (normally the agent's data dir) is where a fake keeps its boot
    id and reset counts; the real backend has no state of its own. `rng` and
    `offload` are the agent's (new fake boot ids, the fake's state files). `reboot`: a fake's reboots happen
    in this process (the simulator's), instead of re-executing it.
    """
    if fake_profile:
        return FakeHardware(fake_profile, seed, state_dir=state_dir, rng=rng, offload=offload, reboot=reboot)
    return NvmlHardware()
