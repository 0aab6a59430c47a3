"""Placement: the spec's rules, resolving against a host, the huge page side of admission, qemu's arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, FAILED, PROGRESSING
from agent.instances import qemu_argv
from agent.instances.admission import Admission, HostMemory
from agent.instances.fake import FakeRuntime
from agent.instances.placement import HostTopology, HugePages, read_topology, resolve
from agent.instances.runtime import DomainConfig, PlacementConfig, RuntimeFailure
from agent.offload import inline
from bc.protocol import cpulist, instance_rules
from bc.protocol.pb import spec_pb2

GIB = 1024


def vm(iid: str = "a", memory_mib: int = 1024, vcpus: int = 2, **placement: object) -> spec_pb2.Instance:
    inst = spec_pb2.Instance(id=iid, runtime="qemu", vcpus=vcpus, memory_mib=memory_mib, kernel="vmlinuz")
    if placement:
        inst.placement.CopyFrom(spec_pb2.Placement(**placement))  # type: ignore[arg-type]
    return inst


@pytest.mark.parametrize(
    ("placement", "vcpus", "memory", "field", "why"),
    [
        ({"cpus": "0-"}, 1, 1024, "placement.cpus", "is not a cpulist"),
        ({"cpus": "3-1"}, 1, 1024, "placement.cpus", "low to high"),
        ({"cpus": "0"}, 2, 1024, "placement.cpus", "names 1 CPUs, fewer than the instance's 2 vCPUs"),
        ({"mems": "x"}, 1, 1024, "placement.mems", "is not a list of NUMA nodes"),
        ({"hugepage_mib": 4}, 1, 1024, "placement.hugepage_mib", "must be 0, 2 or 1024, not 4"),
        ({"hugepage_mib": 1024}, 1, 1536, "placement.hugepage_mib", "cannot hold 1536 MiB in whole pages"),
        ({"hugepage_mib": 2, "balloon": True}, 1, 1024, "placement.balloon", "cannot be asked with huge pages"),
    ],
)
def test_the_rules_refuse_a_placement_no_host_could_apply(
    placement: dict[str, object], vcpus: int, memory: int, field: str, why: str
) -> None:
    with pytest.raises(instance_rules.InstanceRuleError) as e:
        instance_rules.check_instance(vm(vcpus=vcpus, memory_mib=memory, **placement))
    assert e.value.field == f"instance.{field}" and why in e.value.why


def test_the_rules_take_a_good_placement() -> None:
    instance_rules.check_instance(vm(vcpus=2, memory_mib=2048, cpus="0-1,4", mems="0", hugepage_mib=1024))
    instance_rules.check_instance(vm(balloon=True))


@given(st.sets(st.integers(0, 300), min_size=1, max_size=40))
def test_a_cpulist_renders_and_parses_back(ids: set[int]) -> None:
    assert cpulist.parse(cpulist.render(sorted(ids))) == tuple(sorted(ids))


HOST = HostTopology(
    frozenset({0, 1, 2, 3}),
    frozenset({0, 1}),
    {2: HugePages(100, 10, {0: 60, 1: 40}), 1024: HugePages(2, 0, {0: 1, 1: 1})},
)
SMALL = HostTopology(frozenset({0}), frozenset({0}), {2: HugePages(10, 0, {0: 10})})


def test_resolve_against_the_host() -> None:
    got = resolve(vm(cpus="2-3", mems="1", hugepage_mib=2).placement, 2, HOST)
    assert got == PlacementConfig((2, 3), (1,), 2, False)
    assert resolve(None, 2, None) == PlacementConfig()
    assert resolve(vm(balloon=True).placement, 2, None) == PlacementConfig(balloon=True)


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({"cpus": "2-5"}, "placement: CPUs 4-5 are not online on this host (online: 0-3)"),
        ({"mems": "0,2"}, "placement: NUMA nodes 2 are not on this host (it has 0-1)"),
        ({"hugepage_mib": 1024}, "placement: this host has no pool of 1024 MiB huge pages"),
    ],
)
def test_a_placement_this_host_cannot_apply_fails(placement: dict[str, object], message: str) -> None:
    host = SMALL if "hugepage_mib" in placement else HOST
    with pytest.raises(RuntimeFailure) as e:
        resolve(vm(vcpus=1, **placement).placement, 1, host)
    assert str(e.value) == message.replace("0-3", "0-3" if host is HOST else "0")
    with pytest.raises(RuntimeFailure, match="cannot be read"):
        resolve(vm(vcpus=1, **placement).placement, 1, None)


def test_read_topology_from_a_sysfs_tree(tmp_path: Path) -> None:
    sysd = tmp_path / "sys/devices/system"
    (sysd / "cpu").mkdir(parents=True)
    (sysd / "cpu/online").write_text("0-7\n")
    (sysd / "node").mkdir()
    (sysd / "node/online").write_text("0-1\n")
    for size in ("2048", "1048576"):
        pool = tmp_path / f"sys/kernel/mm/hugepages/hugepages-{size}kB"
        pool.mkdir(parents=True)
        (pool / "free_hugepages").write_text("64\n")
        (pool / "resv_hugepages").write_text("4\n")
        for n in (0, 1):
            per = sysd / f"node/node{n}/hugepages/hugepages-{size}kB"
            per.mkdir(parents=True)
            (per / "free_hugepages").write_text(f"{32 + n}\n")
    topo = read_topology(tmp_path)
    assert topo.cpus == frozenset(range(8)) and topo.nodes == frozenset({0, 1})
    assert topo.hugepages[2] == HugePages(64, 4, {0: 32, 1: 33}) and topo.hugepages[1024].free == 64


def test_huge_pages_admission_counts_pages_on_the_nodes_and_host_wide() -> None:
    ledger = Admission.for_pass(HostMemory(64 * GIB), [], [], HOST.hugepages)
    # node 1 has 40 free 2 MiB pages: 64 MiB (32 pages) fits, a second does not
    assert ledger.admit("a", 64, 2, (1,)) is None
    assert ledger.admit("b", 64, 2, (1,)) == "ResourcesExhausted: 32 huge pages of 2 MiB needed, 8 free on NUMA nodes 1"
    # host-wide: 100 free less 10 reserved less 32 taken = 58
    assert ledger.admit("c", 100, 2) is None  # 50 pages
    assert ledger.admit("d", 20, 2) == "ResourcesExhausted: 10 huge pages of 2 MiB needed, 8 free"
    assert ledger.admit("e", 2048, 1024) is None
    assert ledger.admit("f", 1024, 1024) == "ResourcesExhausted: 1 huge pages of 1024 MiB needed, 0 free"
    # only the overhead of a huge page guest counts against normal memory: 2 GiB + 1/32 would be 2368
    assert ledger.committed_mib == (2 + 256) + (4 + 256) + (64 + 256)


@given(
    st.lists(
        st.tuples(st.sampled_from([2, 1024]), st.integers(1, 64), st.sampled_from([(), (0,), (1,), (0, 1)])),
        max_size=12,
    )
)
def test_admitted_huge_pages_never_exceed_what_is_free(starts: list[tuple[int, int, tuple[int, ...]]]) -> None:
    ledger = Admission.for_pass(HostMemory(1 << 30), [], [], HOST.hugepages)
    for i, (size, pages, mems) in enumerate(starts):
        ledger.admit(f"i{i}", size * pages, size, mems)
    for size, pool in HOST.hugepages.items():
        taken = [(nodes, n) for s, nodes, n in ledger.taken if s == size]
        assert sum(n for _, n in taken) <= pool.free - pool.reserved
        for node, free in pool.free_by_node.items():
            assert sum(n for nodes, n in taken if nodes == frozenset({node})) <= free


def test_qemu_is_started_on_its_cpus_with_its_memory_bound_and_a_balloon(tmp_path: Path) -> None:
    cfg = DomainConfig("a", 2, 256, tmp_path / "k", None, "", placement=PlacementConfig((0, 2, 3), (0,), 2, False))
    argv = qemu_argv.argv(cfg, "qemu", ("tcg",), tmp_path, paused=False, user_data_file=None)
    assert argv[:4] == ["taskset", "-c", "0,2-3", "qemu"]
    i = argv.index("-object")
    assert argv[i + 1] == (
        "memory-backend-memfd,id=bc-mem,size=256M,hugetlb=on,hugetlbsize=2M,prealloc=on,host-nodes=0,policy=bind"
    )
    assert argv[i + 2 : i + 4] == ["-machine", "memory-backend=bc-mem"]
    plain = DomainConfig("b", 1, 128, None, None, "", placement=PlacementConfig(mems=(1,), balloon=True))
    got = qemu_argv.placement(plain)
    assert "memory-backend-ram,id=bc-mem,size=128M,host-nodes=1,policy=bind" in got
    assert got[-2:] == ["-device", "virtio-balloon-pci,id=bc-balloon,free-page-reporting=on"]
    assert qemu_argv.placement(DomainConfig("c", 1, 128, None, None, "")) == []


class Node:
    def __init__(self, tmp_path: Path, topo: HostTopology | None = HOST) -> None:
        boot = tmp_path / "instance-boot"
        boot.mkdir()
        (boot / "vmlinuz").write_bytes(b"k")
        self.runtime = FakeRuntime()
        self.topo = topo
        self.conv = InstancesConverger(
            {"qemu": self.runtime}, boot, self._memory, list, inline, topology=self._topology
        )

    async def _memory(self) -> HostMemory:
        return HostMemory(8 * GIB)

    async def _topology(self) -> HostTopology | None:
        return self.topo


async def test_the_converger_places_admits_huge_pages_and_fails_an_unplaceable_instance(tmp_path: Path) -> None:
    node = Node(tmp_path)
    section = spec_pb2.InstancesSection(
        instances=[vm("a", 64, 1, mems="1", hugepage_mib=2), vm("b", 64, 1, mems="1", hugepage_mib=2)]
    )
    got = await node.conv.converge(section, 1)
    assert got.state == PROGRESSING and got.reason == "ResourcesExhausted"
    by = {s.id: s for s in node.conv.statuses}
    assert by["a"].state == "RUNNING"
    assert by["b"].state == "STOPPED"
    assert by["b"].message == "ResourcesExhausted: 32 huge pages of 2 MiB needed, 8 free on NUMA nodes 1"
    # a huge page guest commits only its overhead to what holds must leave
    assert node.conv.committed_mib() == 2 + 256
    section = spec_pb2.InstancesSection(
        instances=[vm("a", 64, 1, mems="1", hugepage_mib=2), vm("c", vcpus=1, cpus="9")]
    )
    got = await node.conv.converge(section, 2)
    assert got.state == FAILED and got.reason == "InstanceFailed"
    assert {s.id: s.message for s in node.conv.statuses}["c"] == (
        "placement: CPUs 9 are not online on this host (online: 0-3)"
    )
    assert node.runtime.domain("c") is None


async def test_without_a_topology_a_plain_instance_still_runs(tmp_path: Path) -> None:
    node = Node(tmp_path, topo=None)
    got = await node.conv.converge(spec_pb2.InstancesSection(instances=[vm("a", balloon=True)]), 1)
    assert got.state == CONVERGED
