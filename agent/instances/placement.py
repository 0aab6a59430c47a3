"""Placement: where on this host a guest runs (its CPUs, NUMA nodes and huge pages), checked against the host.

The spec's placement (bc.protocol.instance_rules.check_placement has refused
what no host could apply) is resolved here against what this host has: every
CPU online, every NUMA node present, a huge page pool of the page size. A
placement this host cannot apply fails the instance before anything is
created (the reference: "a placement the host cannot apply fails the
instance"). Whether the pages are *free* is admission's question
(agent.instances.admission), asked at each start.

`read_topology` is the blocking sysfs read (under a root a test points at a
tree of its own); `resolve` is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.instances.runtime import PlacementConfig, RuntimeFailure
from bc.protocol import cpulist
from bc.protocol.pb import common_pb2, spec_pb2

SIZES_KB: dict[int, int] = {2: 2048, 1024: 1048576}
"""Huge page sizes bc places on, in MiB, and their sysfs names' kB."""


@dataclass(frozen=True)
class HugePages:
    """One page size's pool: host-wide free and reserved pages, and free pages per NUMA node."""

    free: int = 0
    reserved: int = 0
    free_by_node: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HostTopology:
    cpus: frozenset[int]
    nodes: frozenset[int]
    hugepages: dict[int, HugePages] = field(default_factory=dict)
    """By page size in MiB: the sizes this host's kernel has a pool of."""


def resolve(p: spec_pb2.Placement | None, vcpus: int, host: HostTopology | None) -> PlacementConfig:
    """The placement this host applies for the spec's (RuntimeFailure with one sentence when it cannot)."""
    if p is None:
        return PlacementConfig()
    cpus = cpulist.parse(p.cpus) if p.cpus else ()
    mems = cpulist.parse(p.mems) if p.mems else ()
    if (cpus or mems or p.hugepage_mib) and host is None:
        raise RuntimeFailure("placement: this host's CPUs and NUMA nodes cannot be read")
    if host is not None:
        missing = sorted(set(cpus) - host.cpus)
        if missing:
            raise RuntimeFailure(
                f"placement: CPUs {cpulist.render(missing)} are not online on this host"
                f" (online: {cpulist.render(sorted(host.cpus))})"
            )
        if len(cpus) and len(cpus) < vcpus:
            raise RuntimeFailure(f"placement: {len(cpus)} CPUs for {vcpus} vCPUs")
        gone = sorted(set(mems) - host.nodes)
        if gone:
            raise RuntimeFailure(
                f"placement: NUMA nodes {cpulist.render(gone)} are not on this host"
                f" (it has {cpulist.render(sorted(host.nodes))})"
            )
    if p.hugepage_mib:
        assert host is not None
        if p.hugepage_mib not in host.hugepages:
            raise RuntimeFailure(f"placement: this host has no pool of {p.hugepage_mib} MiB huge pages")
    return PlacementConfig(cpus, mems, p.hugepage_mib, p.balloon)


def read_topology(root: Path = Path("/")) -> HostTopology:
    """Blocking: online CPUs, NUMA nodes and huge page pools from sysfs."""
    sys = root / "sys/devices/system"
    cpus = frozenset(cpulist.parse(_read(sys / "cpu/online") or "0"))
    node_text = _read(sys / "node/online")
    nodes = frozenset(cpulist.parse(node_text)) if node_text else frozenset({0})
    pools: dict[int, HugePages] = {}
    for mib, kb in SIZES_KB.items():
        base = root / f"sys/kernel/mm/hugepages/hugepages-{kb}kB"
        if not base.is_dir():
            continue
        by_node = {n: _int(_read(sys / f"node/node{n}/hugepages/hugepages-{kb}kB/free_hugepages")) for n in nodes}
        pools[mib] = HugePages(_int(_read(base / "free_hugepages")), _int(_read(base / "resv_hugepages")), by_node)
    return HostTopology(cpus, nodes, pools)


def fake_topology(inv: common_pb2.Inventory) -> HostTopology:
    """A fake host's topology from its inventory: CPUs 0..n-1, its NUMA nodes, their 1 GiB pages all free."""
    nodes = frozenset(n.id for n in inv.numa_nodes) or frozenset({0})
    by_node = {n.id: n.hugepages_1g for n in inv.numa_nodes}
    pages = HugePages(sum(by_node.values()), 0, by_node)
    return HostTopology(frozenset(range(max(inv.cpus, 1))), nodes, {1024: pages})


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0
