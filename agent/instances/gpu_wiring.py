"""Which VFIO edge a node's passthrough runs on, and its parts for the agent's composition.

A real host binds through `/sys` (`SysfsVfio`); fake hardware (`--fake-hw`, the
simulator, tests) through a fake sysfs tree under `<data-dir>/fake-sysfs`,
built once from the fake inventory's PCI bus ids and kept across restarts, so
a VM's GPUs stay on vfio-pci while it runs, as on a host.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from agent.hw.base import HardwareBackend
from agent.instances.bookings import InstanceBookings
from agent.instances.fake_vfio import FakeVfio, build_tree
from agent.instances.passthrough import RECORDS_DIR, GpuPassthrough, passed_through
from agent.instances.vfio import SysfsVfio, VfioHost
from agent.offload import Offload
from bc.protocol.pb import common_pb2, spec_pb2

BOOKINGS_DIR = "instance-bookings"
FAKE_SYSFS = "fake-sysfs"


def bookings(data_dir: Path, offload: Offload) -> InstanceBookings:
    """The devices converger's BINDING_INSTANCE records (agent.instances.bookings)."""
    return InstanceBookings(data_dir / BOOKINGS_DIR, offload)


def in_vms(data_dir: Path) -> Callable[[], dict[str, str]]:
    """What the devices converger reads (blocking) for the GPUs passed through to VMs now."""
    return lambda: passed_through(data_dir / RECORDS_DIR)


async def vfio_host(data_dir: Path, hw: HardwareBackend, offload: Offload) -> VfioHost:
    if hw.capabilities.touches_host:
        return SysfsVfio()
    root = data_dir / FAKE_SYSFS
    inv = await offload(hw.inventory)
    await offload(build_tree, root, [g.pci_bus_id for g in inv.gpus if g.pci_bus_id])
    return FakeVfio(root)


async def passthrough(
    data_dir: Path,
    hw: HardwareBackend,
    offload: Offload,
    devices: Callable[[], spec_pb2.DevicesSection],
    booked: InstanceBookings,
    release: Callable[[str], Awaitable[None]] | None = None,
) -> GpuPassthrough:
    """`release`: under `bc helper`, how an instance's devices go back (root binds them at its launch)."""
    inventory: Callable[[], Awaitable[common_pb2.Inventory]] = lambda: offload(hw.inventory)  # noqa: E731
    return GpuPassthrough(
        await vfio_host(data_dir, hw, offload),
        data_dir / RECORDS_DIR,
        offload,
        inventory,
        devices,
        booked.booked,
        release=release,
    )
