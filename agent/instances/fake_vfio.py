"""A fake `/sys` for VFIO: the real reads over a temporary tree whose writes act as the kernel's would.

The tree mimics what `agent.instances.vfio.SysfsVfio` reads:

    bus/pci/devices/<addr>/{class, vendor, driver_override, driver -> bus/pci/drivers/<name>,
                            iommu_group -> kernel/iommu_groups/<n>}
    kernel/iommu_groups/<n>/devices/<addr> -> bus/pci/devices/<addr>
    bus/pci/drivers/<name>/            (vfio-pci present only when "loaded")
    bus/pci/drivers_probe
    dev/vfio/<n>                        (a regular file, root's, 0600: the group's node, whose owner a test reads)

Each GPU gets its own group holding the GPU (class 0x030200, driver
`nvidia`) and its audio function (`.1`, class 0x040300, `snd_hda_intel`), as
an HGX board's GPUs do; a test can add a bridge to a group. The device's own
driver, which a probe without an override binds, is kept in
`.fake-native-driver` (the kernel finds it by matching IDs). `--fake-hw`
builds it under `<data-dir>/fake-sysfs` from the fake profile's bus ids and
keeps it across restarts, so a VM's GPUs stay on vfio-pci while it runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from agent.instances.vfio import VFIO_PCI, SysfsVfio, sysfs_address

GPU_CLASS = "0x030200"
AUDIO_CLASS = "0x040300"
NATIVE = ".fake-native-driver"
NVIDIA = "0x10de"
NULL_OVERRIDE = "(null)"


def add_device(
    root: Path, address: str, group: int, pci_class: str, driver: str, vendor: str = NVIDIA, nodes: Path | None = None
) -> None:
    """One device in `group`, bound to `driver` ("" for none); left as it is if it exists (blocking). The group's
    node goes in `nodes` (default `<root>/dev/vfio`)."""
    dev = root / "bus" / "pci" / "devices" / address
    if dev.exists():
        return
    dev.mkdir(parents=True)
    (dev / "class").write_text(pci_class + "\n")
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "driver_override").write_text(NULL_OVERRIDE + "\n")
    (dev / NATIVE).write_text(driver)
    members = root / "kernel" / "iommu_groups" / str(group) / "devices"
    members.mkdir(parents=True, exist_ok=True)
    (dev / "iommu_group").symlink_to(members.parent)
    (members / address).symlink_to(dev)
    (root / "bus" / "pci" / "drivers_probe").touch()
    node = (nodes if nodes is not None else root / "dev" / "vfio") / str(group)
    if not node.exists():
        node.parent.mkdir(parents=True, exist_ok=True)
        node.touch(mode=0o600)
    if driver:
        _link_driver(root, dev, driver)


def build_tree(root: Path, bus_ids: Iterable[str], *, vfio_loaded: bool = True, nodes: Path | None = None) -> None:
    """A group per GPU (the GPU and its audio function) for each NVML bus id (blocking; idempotent)."""
    for n, bus_id in enumerate(bus_ids):
        gpu = sysfs_address(bus_id)
        add_device(root, gpu, n, GPU_CLASS, "nvidia", nodes=nodes)
        add_device(root, gpu.rsplit(".", 1)[0] + ".1", n, AUDIO_CLASS, "snd_hda_intel", nodes=nodes)
    drivers = root / "bus" / "pci" / "drivers"
    for name in ("nvidia", "snd_hda_intel", "pcieport") + ((VFIO_PCI,) if vfio_loaded else ()):
        (drivers / name).mkdir(parents=True, exist_ok=True)


def _link_driver(root: Path, dev: Path, driver: str) -> None:
    d = root / "bus" / "pci" / "drivers" / driver
    d.mkdir(parents=True, exist_ok=True)
    (dev / "driver").symlink_to(d)


class FakeVfio(SysfsVfio):
    """SysfsVfio's reads; its writes do what the kernel does with them. The group nodes are `<root>/dev/vfio`."""

    def __init__(self, root: Path, dev: Path | None = None) -> None:
        super().__init__(root, dev if dev is not None else root / "dev" / "vfio")

    def set_override(self, address: str, driver: str) -> None:
        (self.device(address) / "driver_override").write_text((driver or NULL_OVERRIDE) + "\n")

    def unbind(self, address: str) -> None:
        link = self.device(address) / "driver"
        if link.is_symlink():
            link.unlink()

    def probe(self, address: str) -> None:
        dev = self.device(address)
        if (dev / "driver").is_symlink():
            return  # the kernel probes only driverless devices
        override = (dev / "driver_override").read_text().strip()
        want = override if override and override != NULL_OVERRIDE else (dev / NATIVE).read_text().strip()
        if want and (self.root / "bus" / "pci" / "drivers" / want).is_dir():
            _link_driver(self.root, dev, want)

    def on_vfio(self) -> list[str]:
        """Every device bound to vfio-pci now (what a test asserts)."""
        devices = self.root / "bus" / "pci" / "devices"
        return sorted(a for a in os.listdir(devices) if self.driver(a) == VFIO_PCI) if devices.is_dir() else []
