"""A ramdisk's hardware backend: the GPU backend it was given, with the machine's disks, NICs and PCI GPUs
added to every inventory (agent.ramdisk.machine).

Everything but `inventory` is the wrapped backend's, so diag.nvml and diag.dcgm run on the bare machine
exactly as on a node (on fake GPUs under `--fake-hw`). The inventory hash covers the disks too, so a disk
that appears or is mounted reaches the control plane like a GPU change does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.hw.base import Capabilities, HardwareBackend
from agent.ramdisk import machine
from agent.ramdisk.machine import MachineTree
from bc.protocol.pb import common_pb2


class MachineHardware:
    def __init__(self, inner: HardwareBackend, tree: MachineTree) -> None:
        self.inner, self.tree = inner, tree
        self.capabilities: Capabilities = inner.capabilities

    def inventory(self) -> common_pb2.Inventory:
        inv = common_pb2.Inventory()
        inv.CopyFrom(self.inner.inventory())
        inv.disks.extend(machine.disks(self.tree))
        inv.nics.extend(machine.nics(self.tree))
        inv.pci_gpus.extend(machine.pci_gpus(self.tree))
        return inv

    def boot_id(self) -> str:
        return self.inner.boot_id()

    def describe(self) -> str:
        return f"{self.inner.describe()} + machine tree {self.tree.root}"

    def diag(self, uuids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return self.inner.diag(uuids)

    async def reset_gpu(self, uuid: str, *, allow: bool = False) -> tuple[bool, str]:
        return await self.inner.reset_gpu(uuid, allow=allow)

    async def reboot(self, *, allow: bool = False) -> tuple[bool, str]:
        return await self.inner.reboot(allow=allow)

    def __getattr__(self, name: str) -> Any:
        """What else a caller reads of the backend (a fake's `refresh_seconds`, `gpu_host`) is the inner one's."""
        return getattr(self.inner, name)
