"""Disks for the ramdisk's tests: a fake machine tree of plain files, and a disk that is a real loop device
(a disk image file attached with `losetup`) or, where loop devices are not available, the file itself.

`disk_under_test(kind, ...)` says which it is (`Disk.mode`): "loop" runs the kernel's block layer
(BLKDISCARD, the exclusive open, /proc/mounts, blkid and sfdisk on /dev/loopN) under the real `/sys`;
"file" runs the same code over a fake tree whose `/dev/NAME` is the image file (no ioctl works on it,
so a wipe overwrites). Nothing is written outside the test's tmp dir but through the loop device.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.ramdisk.machine import MachineTree

SECTOR = 512


def loop_devices_available() -> str:
    """ "" when `losetup` can attach a loop device here, else why not (a sentence for the skip)."""
    if shutil.which("losetup") is None:
        return "losetup is not installed"
    if not Path("/dev/loop-control").exists():
        return "this machine has no /dev/loop-control (no loop devices, e.g. an unprivileged container)"
    return ""


def add_sys_disk(tree: Path, name: str, size: int, *, discard: int = 0, rotational: bool = False) -> Path:
    """A /sys/block/NAME entry in a fake tree, and its /dev/NAME as a file of `size` bytes; the file's path."""
    base = tree / "sys" / "block" / name
    (base / "queue").mkdir(parents=True, exist_ok=True)
    (base / "device").mkdir(exist_ok=True)
    (base / "size").write_text(f"{size // SECTOR}\n")
    (base / "ro").write_text("0\n")
    (base / "removable").write_text("0\n")
    (base / "queue" / "rotational").write_text("1\n" if rotational else "0\n")
    (base / "queue" / "discard_max_bytes").write_text(f"{discard}\n")
    (base / "device" / "model").write_text("FAKE DISK\n")
    (base / "device" / "serial").write_text(f"SN-{name}\n")
    dev = tree / "dev" / name
    dev.parent.mkdir(parents=True, exist_ok=True)
    with dev.open("wb") as f:
        f.truncate(size)
    (tree / "proc").mkdir(exist_ok=True)
    mounts = tree / "proc" / "mounts"
    if not mounts.exists():
        mounts.write_text("rootfs / rootfs rw 0 0\nproc /proc proc rw 0 0\n")
    return dev


def add_partition(tree: Path, disk: str, part: str) -> None:
    base = tree / "sys" / "block" / disk / part
    base.mkdir(parents=True, exist_ok=True)
    (base / "partition").write_text("1\n")


def mount(tree: Path, source: str, point: str) -> None:
    with (tree / "proc" / "mounts").open("a") as f:
        f.write(f"/dev/{source} {point} ext4 rw 0 0\n")


@dataclass(frozen=True)
class Disk:
    tree: MachineTree
    name: str
    path: Path
    """What is written: /dev/loopN, or the image file itself."""
    image: Path
    mode: str
    """"loop" or "file"."""


@contextlib.contextmanager
def disk_under_test(mode: str, tmp: Path, size: int = 32 << 20) -> Iterator[Disk]:
    """A disk of `size` bytes filled with 0x5a (so a wipe shows), as a loop device or a file."""
    tmp.mkdir(parents=True, exist_ok=True)
    image = tmp / "disk.img"
    with image.open("wb") as f:
        block = b"\x5a" * (1 << 20)
        for _ in range(size // len(block)):
            f.write(block)
    if mode == "file":
        tree = tmp / "machine"
        dev = add_sys_disk(tree, "vdb", size)
        dev.unlink()
        dev.symlink_to(image)
        yield Disk(MachineTree(tree), "vdb", image, image, "file")
        return
    out = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=True)
    dev = Path(out.stdout.strip())
    try:
        yield Disk(MachineTree(Path("/")), dev.name, dev, image, "loop")
    finally:
        subprocess.run(["losetup", "-d", str(dev)], check=False)
