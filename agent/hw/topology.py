"""The host's NUMA topology from sysfs: each node's CPUs, memory and 1 GiB huge pages, and a PCI
device's node. Read under a root (default `/`) so tests point it at a tree of files; a host without
`/sys/devices/system/node` (a container, another OS) reports no NUMA nodes rather than failing."""

from __future__ import annotations

import re
from pathlib import Path

from bc.protocol.pb import common_pb2

_NODE_DIR = re.compile(r"node(\d+)")
_MEM_TOTAL = re.compile(r"Node \d+ MemTotal:\s+(\d+) kB")


def _read(path: Path) -> str:
    try:
        return path.read_text("utf-8").strip()
    except OSError:
        return ""


def numa_nodes(root: Path = Path("/")) -> list[common_pb2.NumaNode]:
    """Every NUMA node sysfs lists, by id; empty when there is no such directory."""
    base = root / "sys/devices/system/node"
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    out: list[common_pb2.NumaNode] = []
    for d in entries:
        m = _NODE_DIR.fullmatch(d.name)
        if m is None:
            continue
        mem = _MEM_TOTAL.search(_read(d / "meminfo"))
        pages = _read(d / "hugepages/hugepages-1048576kB/nr_hugepages")
        out.append(
            common_pb2.NumaNode(
                id=int(m.group(1)),
                cpus=_read(d / "cpulist"),
                memory_bytes=int(mem.group(1)) * 1024 if mem else 0,
                hugepages_1g=int(pages) if pages.isdigit() else 0,
            )
        )
    return sorted(out, key=lambda n: n.id)


def pci_numa_node(pci_bus_id: str, root: Path = Path("/")) -> int | None:
    """The NUMA node of a PCI device (NVML's `00000000:18:00.0` or sysfs' `0000:18:00.0`); None when the
    host does not say (-1 in sysfs, or no file)."""
    domain, _, rest = pci_bus_id.lower().partition(":")
    address = f"{domain[-4:]}:{rest}" if rest else pci_bus_id.lower()
    text = _read(root / "sys/bus/pci/devices" / address / "numa_node")
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def cpulist_count(cpulist: str) -> int:
    """How many CPUs a Linux cpulist names ("0-3,8" → 5); a malformed one counts 0."""
    total = 0
    for part in filter(None, cpulist.split(",")):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            return 0
        total += int(hi) - int(lo) + 1 if dash else 1
    return total
