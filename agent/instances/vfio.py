"""VFIO at the edge: move a GPU's IOMMU group to `vfio-pci` before a VM starts, and hand it back after.

The reference's rule (delivery.md, the GPUs row of the runtimes): bind every
endpoint of the GPU's IOMMU group to `vfio-pci` (its audio function too,
since VFIO refuses a group with a device still on a host driver; PCI bridges
stay on `pcieport`), through the kernel's own interface: write `vfio-pci` to
the device's `driver_override`, unbind it from its driver, ask
`/sys/bus/pci/drivers_probe` to bind it again, then **check that it moved**:
a host without `vfio-pci` loaded leaves the device driverless and the start
fails. Handing back clears the override and probes again, so the kernel
binds the device's own driver.

`VfioHost` is the seam (sysfs reads, the three writes, and the group's device
node `/dev/vfio/<group>`: its owner and its hand-over). `SysfsVfio` is
the real one over `/sys` (or any root); `FakeVfio` (agent.instances.fake_vfio)
is the same reads over a temporary tree whose writes act as the kernel would,
for `--fake-hw` and tests. `bind_group` and `release` are the logic above the
seam, the same for both. Blocking: callers run them through their Offload.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.instances import vfio_rules

VFIO_PCI = "vfio-pci"
BRIDGE_CLASS = "0x0604"
"""PCI class 06 (bridge), subclass 04 (PCI-to-PCI): left on its host driver."""


class VfioError(Exception):
    """One sentence: why a group could not be moved to (or from) vfio-pci."""


class VfioHost(Protocol):
    def group(self, address: str) -> list[str]:
        """The PCI addresses in the device's IOMMU group, sorted (VfioError: no group)."""
        ...

    def driver(self, address: str) -> str:
        """The driver bound to the device, "" for none."""
        ...

    def pci_class(self, address: str) -> str:
        """The device's class, e.g. `0x030200` (a 3D controller)."""
        ...

    def vendor(self, address: str) -> str:
        """The device's vendor, e.g. `0x10de` (NVIDIA)."""
        ...

    def set_override(self, address: str, driver: str) -> None:
        """Write `driver_override` ("" clears it)."""
        ...

    def unbind(self, address: str) -> None: ...

    def probe(self, address: str) -> None:
        """Ask the kernel to bind a driver (the override, or the device's own)."""
        ...

    def group_id(self, address: str) -> str:
        """The number of the device's IOMMU group, as `/dev/vfio/<n>` names it (VfioError: no group)."""
        ...

    def node_owner(self, group: str) -> int | None:
        """The uid owning `/dev/vfio/<group>`, None when there is no such node (or it is a symlink)."""
        ...

    def hand_node(self, group: str, uid: int) -> None:
        """Make `/dev/vfio/<group>` uid:uid (root: root:root), mode 0600 (VfioError when it cannot)."""
        ...


@dataclass(frozen=True)
class Moved:
    """One endpoint moved to vfio-pci and the driver it had (what a release gives it back to)."""

    address: str
    driver: str


def sysfs_address(bus_id: str) -> str:
    """NVML's bus id (`00000000:18:00.0`) as sysfs names the device (`0000:18:00.0`), lower case."""
    domain, sep, rest = bus_id.strip().lower().partition(":")
    if not sep or not domain or not rest:
        raise VfioError(f"{bus_id!r} is not a PCI bus id")
    return f"{int(domain, 16):04x}:{rest}"


class SysfsVfio:
    """The kernel's PCI interface under `root` (`/sys` on a host)."""

    def __init__(self, root: Path = Path("/sys"), dev: Path = Path("/dev/vfio")) -> None:
        self.root = root
        self.dev = dev

    def device(self, address: str) -> Path:
        if "/" in address or address.startswith("."):
            raise VfioError(f"{address!r} is not a PCI address")
        return self.root / "bus" / "pci" / "devices" / address

    def group(self, address: str) -> list[str]:
        devices = self.device(address) / "iommu_group" / "devices"
        try:
            return sorted(os.listdir(devices))
        except OSError:
            raise VfioError(f"the device {address} has no IOMMU group (is the IOMMU on?)") from None

    def driver(self, address: str) -> str:
        try:
            return os.path.basename(os.readlink(self.device(address) / "driver"))
        except FileNotFoundError:
            return ""
        except OSError as e:
            raise VfioError(f"cannot read the driver of {address}: {e.strerror}") from None

    def pci_class(self, address: str) -> str:
        try:
            return (self.device(address) / "class").read_text().strip()
        except OSError as e:
            raise VfioError(f"cannot read the class of {address}: {e.strerror}") from None

    def vendor(self, address: str) -> str:
        try:
            return (self.device(address) / "vendor").read_text().strip()
        except OSError as e:
            raise VfioError(f"cannot read the vendor of {address}: {e.strerror}") from None

    def set_override(self, address: str, driver: str) -> None:
        self._write(self.device(address) / "driver_override", driver or "\n")

    def unbind(self, address: str) -> None:
        self._write(self.device(address) / "driver" / "unbind", address)

    def probe(self, address: str) -> None:
        self._write(self.root / "bus" / "pci" / "drivers_probe", address)

    def group_id(self, address: str) -> str:
        try:
            n = os.path.basename(os.readlink(self.device(address) / "iommu_group"))
        except OSError:
            raise VfioError(f"the device {address} has no IOMMU group (is the IOMMU on?)") from None
        if not n.isdigit():
            raise VfioError(f"the IOMMU group of {address} is {n!r}, not a number")
        return n

    def _node(self, group: str) -> Path:
        if not group.isdigit():
            raise VfioError(f"{group!r} is not a VFIO group")
        return self.dev / group

    def node_owner(self, group: str) -> int | None:
        try:
            st = os.lstat(self._node(group))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise VfioError(f"cannot read /dev/vfio/{group}: {e.strerror}") from None
        return None if stat.S_ISLNK(st.st_mode) else st.st_uid

    def hand_node(self, group: str, uid: int) -> None:
        node = self._node(group)
        try:
            # never through a symlink: only root writes /dev, but the check costs nothing
            if stat.S_ISLNK(os.lstat(node).st_mode):
                raise VfioError(f"/dev/vfio/{group} is a symlink")
            os.chown(node, uid, uid, follow_symlinks=False)
            os.chmod(node, 0o600)
        except OSError as e:
            raise VfioError(f"cannot hand /dev/vfio/{group} to uid {uid}: {e.strerror}") from None

    @staticmethod
    def _write(path: Path, value: str) -> None:
        try:
            with open(path, "w") as f:
                f.write(value)
        except OSError as e:
            raise VfioError(f"cannot write {path}: {e.strerror}") from None


def endpoints(host: VfioHost, address: str) -> list[str]:
    """The group's devices that move: every one but the PCI bridges."""
    return [a for a in host.group(address) if not host.pci_class(a).startswith(BRIDGE_CLASS)]


def bind_group(host: VfioHost, address: str) -> list[Moved]:
    """Move every endpoint of the device's IOMMU group to vfio-pci and check they moved (VfioError if not)."""
    moved: list[Moved] = []
    for a in endpoints(host, address):
        was = host.driver(a)
        moved.append(Moved(a, was))
        if was == VFIO_PCI:
            continue
        host.set_override(a, VFIO_PCI)
        if was:
            host.unbind(a)
        host.probe(a)
    stuck = [m.address for m in moved if host.driver(m.address) != VFIO_PCI]
    if stuck:
        raise VfioError(f"{', '.join(stuck)} did not move to vfio-pci (is the vfio-pci module loaded?)")
    return moved


def release(host: VfioHost, moved: list[Moved]) -> list[str]:
    """Hand each device back: clear the override, unbind it from vfio-pci, probe. Returns what stayed on
    vfio-pci or driverless though it had a driver (best effort: one device never blocks the others)."""
    stuck: list[str] = []
    for m in moved:
        try:
            host.set_override(m.address, "")
            if host.driver(m.address) == VFIO_PCI:
                host.unbind(m.address)
            host.probe(m.address)
            now = host.driver(m.address)
        except VfioError:
            stuck.append(m.address)
            continue
        if m.driver and m.driver != VFIO_PCI and now != m.driver:
            stuck.append(m.address)
    return stuck


def hand_over(host: VfioHost, addresses: list[str], uid: int, running: frozenset[int]) -> list[str]:
    """Give each device's group node to VMM `uid` (0600), after checking every group first
    (agent.instances.vfio_rules), so a refusal changes nothing. Returns the groups, sorted."""
    groups = sorted({host.group_id(a) for a in addresses}, key=int)
    for g in groups:
        why = vfio_rules.take_refusal(g, host.node_owner(g), uid, running)
        if why is not None:
            raise VfioError(why)
    for g in groups:
        host.hand_node(g, uid)
    return groups


def give_back(host: VfioHost, addresses: list[str], uid: int | None, running: frozenset[int]) -> list[str]:
    """Give each device's group node back to root (root:root 0600) where vfio_rules.gives_back says so
    (never a running VMM's). Best effort; returns the groups given back."""
    groups: set[str] = set()
    for a in addresses:
        try:
            groups.add(host.group_id(a))
        except VfioError:
            continue  # a device gone from the bus has no node to give back
    out: list[str] = []
    for g in sorted(groups, key=int):
        try:
            if vfio_rules.gives_back(host.node_owner(g), uid, running):
                host.hand_node(g, vfio_rules.ROOT)
                out.append(g)
        except VfioError:
            continue  # one group never keeps the others from going back
    return out
