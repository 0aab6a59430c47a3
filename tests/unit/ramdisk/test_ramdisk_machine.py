"""The ramdisk's inventory read from a fake /sys and /proc tree: disks, NICs and PCI GPUs, and which disks are in
use (mounted, swap, held, under the root), as `bc nodes show` would list them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.hw.fake import FakeHardware
from agent.ramdisk import machine
from agent.ramdisk.hardware import MachineHardware
from agent.ramdisk.machine import DISK_IN_USE, UNKNOWN_DISK, DiskError, MachineTree
from tests.ramdisk_disks import add_partition, add_sys_disk, mount

GIB = 1 << 30


def nic(tree: Path, name: str, mac: str, pci: str | None, speed: str = "25000") -> None:
    base = tree / "sys" / "class" / "net" / name
    base.mkdir(parents=True)
    (base / "address").write_text(mac + "\n")
    (base / "operstate").write_text("up\n")
    (base / "speed").write_text(speed + "\n")
    if pci is not None:
        dev = tree / "sys" / "devices" / "pci0000:00" / pci
        dev.mkdir(parents=True)
        (base / "device").symlink_to(dev)


def pci(tree: Path, addr: str, cls: str, vendor: str, device: str, driver: str = "") -> None:
    base = tree / "sys" / "bus" / "pci" / "devices" / addr
    base.mkdir(parents=True)
    (base / "class").write_text(cls + "\n")
    (base / "vendor").write_text(vendor + "\n")
    (base / "device").write_text(device + "\n")
    (base / "numa_node").write_text("1\n")
    if driver:
        d = tree / "sys" / "bus" / "pci" / "drivers" / driver
        d.mkdir(parents=True, exist_ok=True)
        (base / "driver").symlink_to(d)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "machine"
    add_sys_disk(root, "nvme0n1", 4 * GIB, discard=2 * GIB)
    add_sys_disk(root, "sda", 8 * GIB, rotational=True)
    add_sys_disk(root, "zram0", GIB)  # RAM, not a disk
    add_sys_disk(root, "loop7", 0)  # an unattached loop device: no size
    nic(root, "eno1", "0c:42:a1:00:00:01", "0000:19:00.0")
    nic(root, "lo", "00:00:00:00:00:00", None)
    pci(root, "0000:17:00.0", "0x030200", "0x10de", "0x2330", driver="nvidia")
    pci(root, "0000:18:00.0", "0x030200", "0x10de", "0x2330")  # no driver in the ramdisk: still a GPU
    pci(root, "0000:03:00.0", "0x030000", "0x1a03", "0x2000")  # the BMC's VGA: not a GPU
    return root


def test_the_inventory_lists_disks_nics_and_gpus_from_sys(tree: Path) -> None:
    t = MachineTree(tree)
    disks = {d.name: d for d in machine.disks(t)}
    assert sorted(disks) == ["nvme0n1", "sda"]
    assert disks["nvme0n1"].size_bytes == 4 * GIB and disks["nvme0n1"].transport == "nvme"
    assert disks["nvme0n1"].discard_max_bytes == 2 * GIB and not disks["nvme0n1"].rotational
    assert disks["sda"].rotational and disks["sda"].serial == "SN-sda" and disks["sda"].model == "FAKE DISK"
    assert [(n.name, n.mac, n.speed_mbps, n.pci_bus_id) for n in machine.nics(t)] == [
        ("eno1", "0c:42:a1:00:00:01", 25000, "0000:19:00.0")
    ]
    gpus = [(g.bus_id, g.vendor, g.driver, g.numa_node) for g in machine.pci_gpus(t)]
    assert gpus == [("0000:17:00.0", "0x10de", "nvidia", 1), ("0000:18:00.0", "0x10de", "", 1)]


def test_a_ramdisk_inventory_is_the_gpu_backends_plus_the_machine(tree: Path, tmp_path: Path) -> None:
    fake = FakeHardware("hgx-h100-8", "r1", state_dir=tmp_path / "data")
    inv = MachineHardware(fake, MachineTree(tree)).inventory()
    assert len(inv.gpus) == 8 and [d.name for d in inv.disks] == ["nvme0n1", "sda"]
    assert [n.name for n in inv.nics] == ["eno1"] and len(inv.pci_gpus) == 2
    assert len(fake.inventory().disks) == 0, "the wrapped backend's own inventory is not changed"


def test_mounted_swap_and_held_disks_are_in_use_and_refused(tree: Path) -> None:
    add_partition(tree, "sda", "sda1")
    add_partition(tree, "sda", "sda2")
    mount(tree, "sda2", "/")
    (tree / "proc" / "swaps").write_text("Filename Type Size Used Priority\n/dev/nvme0n1 partition 1 0 -2\n")
    t = MachineTree(tree)
    assert machine.in_use(t, "sda") == ["/"]
    assert machine.in_use(t, "nvme0n1") == ["[swap]"]
    with pytest.raises(DiskError) as e:
        machine.find_disk(t, "sda")
    assert e.value.code == DISK_IN_USE and "disk sda is in use (/)" in e.value.message
    assert machine.find_disk(t, "sda", writable=False).name == "sda"


def test_a_disk_held_by_device_mapper_is_in_use(tree: Path) -> None:
    (tree / "sys" / "block" / "nvme0n1" / "holders" / "dm-0").mkdir(parents=True)
    assert machine.in_use(MachineTree(tree), "nvme0n1") == ["holder:dm-0"]


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/block").is_dir(), reason="reads the live /sys as root")
def test_on_the_live_machine_the_disk_under_root_is_in_use() -> None:
    t = MachineTree()
    root = t.root_device()
    assert root is not None
    found = [d.name for d in machine.disks(t) if "running root" in d.mounted or "/" in d.mounted]
    on_a_disk = (Path("/sys/dev/block") / f"{root[0]}:{root[1]}").exists()  # an overlay or tmpfs root is not
    assert bool(found) == on_a_disk, (found, root)


@given(st.text(min_size=1, max_size=40))
def test_a_request_names_a_disk_only_by_its_kernel_name(name: str) -> None:
    tree = MachineTree(Path("/nonexistent-tree"))
    with pytest.raises(DiskError) as e:
        machine.find_disk(tree, name)
    assert e.value.code == UNKNOWN_DISK
    if "/" in name or ".." in name or name.startswith("-"):
        assert "is not a disk name" in e.value.message


@settings(deadline=None, max_examples=60)  # each example builds a tree of files: slow on a busy machine
@given(
    st.lists(st.sampled_from(["sda", "sda1", "sda2", "sdb", "sdb1", "sdab", "sda10"]), max_size=4, unique=True),
)
def test_a_disk_is_in_use_exactly_when_it_or_one_of_its_partitions_is_mounted(mounted: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for disk, parts in (("sda", ["sda1", "sda2", "sda10"]), ("sdb", ["sdb1"]), ("sdab", [])):
            add_sys_disk(root, disk, GIB)
            for p in parts:
                add_partition(root, disk, p)
        for i, source in enumerate(mounted):
            mount(root, source, f"/mnt/{i}")
        t = MachineTree(root)
        for disk, own in (("sda", {"sda", "sda1", "sda2", "sda10"}), ("sdb", {"sdb", "sdb1"}), ("sdab", {"sdab"})):
            want = [f"/mnt/{i}" for i, s in enumerate(mounted) if s in own]
            assert machine.in_use(t, disk) == want, (disk, mounted)
