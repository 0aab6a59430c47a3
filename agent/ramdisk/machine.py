"""What a bare machine has: its disks, NICs and PCI GPUs, read from /sys and /proc under a root.

`MachineTree(root)` is the seam: production reads `/`, tests point it at a tree of plain files
(`tests/unit/ramdisk/fake_tree.py`) or at `/` with loop devices attached. Everything here blocks
(file reads): call it through the agent's offload.

The rules, each a sentence an operator can check against `ls /sys/block`:

* a disk is an entry of `/sys/block` with a size, except RAM disks (`ram*`, `zram*`) and device-mapper
  or md devices stacked on other disks (`dm-*`, `md*`): a wipe or deploy acts on the disks beneath;
* a disk is *in use* when it, or one of its partitions, is mounted (`/proc/mounts`) or a swap
  (`/proc/swaps`), is held by another block device (`holders/`), or holds the running root (the device
  `/` is on, by device number): `disk.wipe` and `deploy.image` refuse it, as `in_use` names;
* a NIC is an entry of `/sys/class/net` with a `device` (no loopback, bridge, bond or veth);
* a GPU is a PCI device of class 0x0302 (3D controller), or 0x0300 (VGA) from NVIDIA or AMD, so a
  BMC's own VGA is not one; the ramdisk sees them with or without a driver.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bc.protocol.pb import common_pb2

SECTOR = 512
DISK_NAME = re.compile(r"[a-z][a-z0-9]{0,31}")
"""A disk's kernel name as a request names it: no path, no `..`, nothing a shell or `/dev` could reinterpret."""
_SKIPPED = ("ram", "zram", "dm-", "md")
_GPU_VENDORS = ("0x10de", "0x1002")


@dataclass(frozen=True)
class MachineTree:
    """Where the machine's /sys, /proc and /dev are: `/` in production, a directory of files in tests."""

    root: Path = Path("/")

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    def device(self, name: str) -> Path:
        """The disk's device node (`/dev/NAME`); under a test tree a plain file stands in for it."""
        return self.root / "dev" / name

    def root_device(self) -> tuple[int, int] | None:
        """(major, minor) of the device `/` is on, read from the live kernel; None under a test tree."""
        if self.root != Path("/"):
            return None
        st = os.stat("/")
        return os.major(st.st_dev), os.minor(st.st_dev)


class DiskError(Exception):
    """A disk a request names cannot be acted on; `code` is the command's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


UNKNOWN_DISK = "unknown-disk"
DISK_IN_USE = "disk-in-use"


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text("utf-8", "replace").strip()
    except OSError:
        return default


def _int(path: Path, default: int = 0) -> int:
    try:
        return int(_read(path) or default)
    except ValueError:
        return default


def _devnum(path: Path) -> tuple[int, int] | None:
    text = _read(path)
    major, _, minor = text.partition(":")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def partitions(tree: MachineTree, name: str) -> list[str]:
    """The disk's partitions' kernel names (`sda1`, `nvme0n1p2`), as /sys/block/NAME lists them."""
    base = tree.sys / "block" / name
    try:
        entries = sorted(p.name for p in base.iterdir())
    except OSError:
        return []
    return [e for e in entries if e.startswith(name) and (base / e / "partition").exists()]


def _mount_sources(tree: MachineTree) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for line in _read(tree.proc / "mounts").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].startswith("/dev/"):
            out.append((fields[0][len("/dev/") :], fields[1].replace("\\040", " ")))
    for line in _read(tree.proc / "swaps").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0].startswith("/dev/"):
            out.append((fields[0][len("/dev/") :], "[swap]"))
    return out


def in_use(tree: MachineTree, name: str) -> list[str]:
    """Why the disk must not be written: mount points (`/`, `/boot`, `[swap]`), `holder:dm-0`, `running root`."""
    names = [name, *partitions(tree, name)]
    why = [point for source, point in _mount_sources(tree) if source in names]
    for n in names:
        base = tree.sys / "block" / name / (n if n != name else "")
        try:
            why += [f"holder:{h.name}" for h in sorted((base / "holders").iterdir())]
        except OSError:
            pass
    root_dev = tree.root_device()
    if root_dev is not None:
        devs = [_devnum(tree.sys / "block" / name / "dev")]
        devs += [_devnum(tree.sys / "block" / name / p / "dev") for p in names[1:]]
        if root_dev in devs and "/" not in why:
            why.append("running root")
    return list(dict.fromkeys(why))


def _transport(tree: MachineTree, name: str) -> str:
    if name.startswith("loop"):
        return "loop"
    if name.startswith("nvme"):
        return "nvme"
    try:
        path = os.path.realpath(tree.sys / "block" / name)
    except OSError:
        return ""
    for marker, transport in (("/virtio", "virtio"), ("/usb", "usb"), ("/ata", "sata"), ("/host", "scsi")):
        if marker in path:
            return transport
    return ""


def disk(tree: MachineTree, name: str) -> common_pb2.Disk | None:
    """The disk called `name`, or None when /sys/block has no such disk (or one the rules above skip)."""
    if not DISK_NAME.fullmatch(name) or name.startswith(_SKIPPED):
        return None
    base = tree.sys / "block" / name
    size = _int(base / "size") * SECTOR
    if not base.is_dir() or size <= 0:
        return None
    return common_pb2.Disk(
        name=name,
        size_bytes=size,
        rotational=_read(base / "queue" / "rotational") == "1",
        removable=_read(base / "removable") == "1",
        read_only=_read(base / "ro") == "1",
        model=_read(base / "device" / "model"),
        serial=_read(base / "device" / "serial"),
        transport=_transport(tree, name),
        discard_max_bytes=_int(base / "queue" / "discard_max_bytes"),
        mounted=in_use(tree, name),
    )


def disks(tree: MachineTree) -> list[common_pb2.Disk]:
    try:
        names = sorted(p.name for p in (tree.sys / "block").iterdir())
    except OSError:
        return []
    return [d for d in (disk(tree, n) for n in names) if d is not None]


def nics(tree: MachineTree) -> list[common_pb2.Nic]:
    out: list[common_pb2.Nic] = []
    try:
        names = sorted(p.name for p in (tree.sys / "class" / "net").iterdir())
    except OSError:
        return []
    for name in names:
        base = tree.sys / "class" / "net" / name
        if not (base / "device").exists():
            continue  # loopback, bridges, bonds, veths: no device behind them
        bus = os.path.basename(os.path.realpath(base / "device"))
        out.append(
            common_pb2.Nic(
                name=name,
                mac=_read(base / "address"),
                speed_mbps=max(_int(base / "speed", 0), 0),  # -1 (or EINVAL) when the link is down
                operstate=_read(base / "operstate", "unknown"),
                pci_bus_id=bus if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", bus) else "",
            )
        )
    return out


def pci_gpus(tree: MachineTree) -> list[common_pb2.PciDevice]:
    out: list[common_pb2.PciDevice] = []
    base = tree.sys / "bus" / "pci" / "devices"
    try:
        addrs = sorted(p.name for p in base.iterdir())
    except OSError:
        return []
    for addr in addrs:
        d = base / addr
        cls, vendor = _read(d / "class"), _read(d / "vendor")
        if not (cls.startswith("0x0302") or (cls.startswith("0x0300") and vendor in _GPU_VENDORS)):
            continue
        driver = os.path.basename(os.path.realpath(d / "driver")) if (d / "driver").exists() else ""
        out.append(
            common_pb2.PciDevice(
                bus_id=addr,
                vendor=vendor,
                device=_read(d / "device"),
                driver=driver,
                numa_node=_int(d / "numa_node", -1),
            )
        )
    return out


def find_disk(tree: MachineTree, name: str, *, writable: bool = True) -> common_pb2.Disk:
    """The disk a request names, checked: DiskError `unknown-disk` or, when `writable`, `disk-in-use`."""
    if not DISK_NAME.fullmatch(name):
        raise DiskError(UNKNOWN_DISK, f"{name[:64]!r} is not a disk name (a kernel name as in /sys/block)")
    found = disk(tree, name)
    if found is None:
        raise DiskError(UNKNOWN_DISK, f"this machine has no disk {name!r}")
    if writable and found.mounted:
        raise DiskError(DISK_IN_USE, f"disk {name} is in use ({', '.join(found.mounted)}); it is never written")
    if writable and found.read_only:
        raise DiskError(DISK_IN_USE, f"disk {name} is read-only")
    return found
