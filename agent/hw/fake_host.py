"""The fake hardware's host root: the sysfs a fake node's `hugepages` unit reads and writes, and what the GPU node
units read (the OS, the PCI devices).

`seed_host_root` makes, under the root, the huge page pools a host of the
profile would have (2 MiB and 1 GiB, host-wide and per NUMA node, each
`nr_hugepages` starting at the profile's 1 GiB count or 0), an Ubuntu
`etc/os-release` (so the package units use apt), and a PCI device in
`sys/bus/pci/devices` for each GPU (class 0x030200) and NVSwitch (0x068000,
the `fabric-manager` unit's test) of NVIDIA's, and nothing else,
so the host units run unchanged against a directory: what the fake node's
`bc node --fake-hw` writes stays under `<data dir>/host-root`. Existing files
are kept (a restart keeps what the units set). Blocking: call it through the
offload.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bc.protocol.pb import common_pb2

SIZES_KB = (2048, 1048576)


OS_RELEASE = 'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'
GPU_CLASS, NVSWITCH_CLASS = "0x030200", "0x068000"


def sysfs_pci(bus_id: str) -> str:
    """NVML's `00000000:18:00.0` as sysfs names it, `0000:18:00.0`."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:]}:{rest}"


def seed_host_root(root: Path, inventory: common_pb2.Inventory, nvswitches: Sequence[str] = ()) -> None:
    pools: list[tuple[Path, int]] = []
    for size in SIZES_KB:
        total = sum(n.hugepages_1g for n in inventory.numa_nodes) if size == 1048576 else 0
        pools.append((root / "sys/kernel/mm/hugepages" / f"hugepages-{size}kB", total))
        for n in inventory.numa_nodes:
            count = n.hugepages_1g if size == 1048576 else 0
            pools.append((root / f"sys/devices/system/node/node{n.id}/hugepages" / f"hugepages-{size}kB", count))
    for directory, count in pools:
        directory.mkdir(parents=True, exist_ok=True)
        f = directory / "nr_hugepages"
        if not f.exists():
            f.write_text(f"{count}\n", "ascii")
    os_release = root / "etc/os-release"
    if not os_release.exists():
        os_release.parent.mkdir(parents=True, exist_ok=True)
        os_release.write_text(OS_RELEASE, "ascii")
    devices = [(g.pci_bus_id, GPU_CLASS) for g in inventory.gpus] + [(s, NVSWITCH_CLASS) for s in nvswitches]
    for bus_id, cls in devices:
        d = root / "sys/bus/pci/devices" / sysfs_pci(bus_id)
        d.mkdir(parents=True, exist_ok=True)
        for name, text in (("vendor", "0x10de"), ("class", cls)):
            if not (d / name).exists():
                (d / name).write_text(text + "\n", "ascii")
