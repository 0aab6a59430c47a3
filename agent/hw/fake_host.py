"""The fake hardware's host root: the sysfs a fake node's `hugepages` unit reads and writes.

`seed_host_root` makes, under the root, the huge page pools a host of the
profile would have (2 MiB and 1 GiB, host-wide and per NUMA node, each
`nr_hugepages` starting at the profile's 1 GiB count or 0) and nothing else,
so the host units run unchanged against a directory: what the fake node's
`bc node --fake-hw` writes stays under `<data dir>/host-root`. Existing files
are kept (a restart keeps what the units set). Blocking: call it through the
offload.
"""

from __future__ import annotations

from pathlib import Path

from bc.protocol.pb import common_pb2

SIZES_KB = (2048, 1048576)


def seed_host_root(root: Path, inventory: common_pb2.Inventory) -> None:
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
