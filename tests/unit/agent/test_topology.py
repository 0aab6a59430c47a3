"""The host's NUMA topology as sysfs tells it, read from a tree of files; the fake profiles carry one."""

from __future__ import annotations

from pathlib import Path

from agent.hw import topology
from agent.hw.fake import FakeHardware


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_numa_nodes_and_a_gpus_node_from_sysfs(tmp_path: Path) -> None:
    for n, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        write(tmp_path, f"sys/devices/system/node/node{n}/cpulist", cpus + "\n")
        write(tmp_path, f"sys/devices/system/node/node{n}/meminfo", f"Node {n} MemTotal:       1048576 kB\n")
        write(tmp_path, f"sys/devices/system/node/node{n}/hugepages/hugepages-1048576kB/nr_hugepages", "4\n")
    write(tmp_path, "sys/devices/system/node/possible", "0-1\n")  # not a node directory
    write(tmp_path, "sys/bus/pci/devices/0000:18:00.0/numa_node", "1\n")
    write(tmp_path, "sys/bus/pci/devices/0000:2a:00.0/numa_node", "-1\n")
    nodes = topology.numa_nodes(tmp_path)
    assert [(n.id, n.cpus, n.memory_bytes, n.hugepages_1g) for n in nodes] == [
        (0, "0-3,8-11", 1 << 30, 4),
        (1, "4-7,12-15", 1 << 30, 4),
    ]
    assert topology.pci_numa_node("00000000:18:00.0", tmp_path) == 1
    assert topology.pci_numa_node("00000000:2A:00.0", tmp_path) is None  # -1: the host does not say
    assert topology.pci_numa_node("00000000:99:00.0", tmp_path) is None


def test_a_host_without_numa_information_reports_none(tmp_path: Path) -> None:
    assert topology.numa_nodes(tmp_path) == []


def test_cpulists_count() -> None:
    assert topology.cpulist_count("0-55,112-167") == 112
    assert topology.cpulist_count("3") == 1
    assert topology.cpulist_count("") == 0
    assert topology.cpulist_count("x-1") == 0


def test_every_fake_profile_has_a_topology_that_adds_up() -> None:
    for profile in FakeHardware.profiles():
        inv = FakeHardware(profile, "n1").inventory()
        assert inv.numa_nodes, profile
        assert sum(topology.cpulist_count(n.cpus) for n in inv.numa_nodes) == inv.cpus, profile
        assert sum(n.memory_bytes for n in inv.numa_nodes) == inv.memory_bytes, profile
        assert {g.numa_node for g in inv.gpus} <= {n.id for n in inv.numa_nodes}, profile
        assert all(g.HasField("numa_node") for g in inv.gpus), profile
