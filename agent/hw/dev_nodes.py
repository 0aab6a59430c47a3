"""The device nodes a CUDA workload needs, for CDI specs a CDI-only runtime can run (no NVIDIA hook).

A container that gets only `/dev/nvidia<N>` cannot run CUDA: the driver also
opens `/dev/nvidiactl`, `/dev/nvidia-uvm` (and `-uvm-tools`), and
`/dev/nvidia-modeset` where the host has it; a MIG instance is reached
through its GPU instance's and compute instance's capability nodes,
`/dev/nvidia-caps/nvidia-cap<N>`. `node_facts` gathers them once per devices
pass (blocking: call it through the offload) for the pure CDI rendering
(agent.hw.cdi), each with its type, major and minor, so a runtime can
make the node even where it does not stat the host's.

* `HostDeviceNodes` (a real host): the control nodes that exist under
  `/dev`, by `stat`; a MIG instance's capability minors from
  `/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/access` and
  `…/gi<G>/ci<C>/access` (`DeviceFileMinor: <n>`), the `nvidia-caps` major
  from `/proc/devices`.
* `FakeDeviceNodes` (`--fake-hw`): every control node present, with the
  driver's usual numbers, and capability minors derived from the GPU, GI and
  CI numbers (unique per node).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bc.protocol.pb import common_pb2

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
NVIDIA_MAJOR = 195
FAKE_UVM_MAJOR = 510
FAKE_CAPS_MAJOR = 511


@dataclass(frozen=True)
class DevNode:
    path: str  # in the container, which is also the host path
    major: int
    minor: int
    type: str = "c"


@dataclass(frozen=True)
class NodeFacts:
    """What a pass's CDI specs name: the spec-level nodes, each GPU's node, each MIG instance's cap nodes."""

    control: tuple[DevNode, ...] = ()
    gpus: Mapping[int, DevNode] = field(default_factory=dict)
    mig_caps: Mapping[tuple[int, int, int], tuple[DevNode, ...]] = field(default_factory=dict)


class DeviceNodes(Protocol):
    def control(self) -> list[DevNode]: ...

    def gpu(self, index: int) -> DevNode | None: ...

    def mig_caps(self, gpu_index: int, gi: int, ci: int) -> list[DevNode]: ...


def node_facts(source: DeviceNodes, inventory: common_pb2.Inventory) -> NodeFacts:
    """Everything the inventory's devices need (blocking)."""
    gpus: dict[int, DevNode] = {}
    caps: dict[tuple[int, int, int], tuple[DevNode, ...]] = {}
    for g in inventory.gpus:
        node = source.gpu(g.index)
        if node is not None:
            gpus[g.index] = node
        for m in g.mig_instances:
            caps[(g.index, m.gi, m.ci)] = tuple(source.mig_caps(g.index, m.gi, m.ci))
    return NodeFacts(tuple(source.control()), gpus, caps)


class FakeDeviceNodes:
    def control(self) -> list[DevNode]:
        return [
            DevNode("/dev/nvidiactl", NVIDIA_MAJOR, 255),
            DevNode("/dev/nvidia-uvm", FAKE_UVM_MAJOR, 0),
            DevNode("/dev/nvidia-uvm-tools", FAKE_UVM_MAJOR, 1),
            DevNode("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
        ]

    def gpu(self, index: int) -> DevNode | None:
        return DevNode(f"/dev/nvidia{index}", NVIDIA_MAJOR, index)

    def mig_caps(self, gpu_index: int, gi: int, ci: int) -> list[DevNode]:
        base = 16 + gpu_index * 128 + gi * 8
        return [
            DevNode(f"/dev/nvidia-caps/nvidia-cap{base}", FAKE_CAPS_MAJOR, base),
            DevNode(f"/dev/nvidia-caps/nvidia-cap{base + 1 + ci}", FAKE_CAPS_MAJOR, base + 1 + ci),
        ]


class HostDeviceNodes:
    def __init__(self, dev: Path = Path("/dev"), proc: Path = Path("/proc")) -> None:
        self.dev = dev
        self.proc = proc

    def _stat(self, name: str) -> DevNode | None:
        try:
            st = os.stat(self.dev / name)
        except OSError:
            return None
        if not stat.S_ISCHR(st.st_mode):
            return None
        return DevNode(f"/dev/{name}", os.major(st.st_rdev), os.minor(st.st_rdev))

    def control(self) -> list[DevNode]:
        return [n for n in (self._stat(name) for name in CONTROL_NODES) if n is not None]

    def gpu(self, index: int) -> DevNode | None:
        return self._stat(f"nvidia{index}")

    def _caps_major(self) -> int | None:
        try:
            text = (self.proc / "devices").read_text("ascii")
        except OSError:
            return None
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == "nvidia-caps" and parts[0].isdigit():
                return int(parts[0])
        return None

    def mig_caps(self, gpu_index: int, gi: int, ci: int) -> list[DevNode]:
        major = self._caps_major()
        if major is None:
            return []
        base = self.proc / "driver" / "nvidia" / "capabilities" / f"gpu{gpu_index}" / "mig" / f"gi{gi}"
        out: list[DevNode] = []
        for access in (base / "access", base / f"ci{ci}" / "access"):
            minor = read_minor(access)
            if minor is not None:
                out.append(DevNode(f"/dev/nvidia-caps/nvidia-cap{minor}", major, minor))
        return out


def read_minor(access: Path) -> int | None:
    """`DeviceFileMinor: 12` from a capability's `access` file; None when it is not there."""
    try:
        text = access.read_text("ascii")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None
