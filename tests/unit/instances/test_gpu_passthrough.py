"""GPU passthrough through the instances converger over the fake runtime and the fake sysfs tree: the rules
(booked by the instance's allocation, never a held GPU), the bind before the start and the hand back after the
stop, delete or a guest's own power-off, InstanceStatus.gpus, and gpu.reset refused `gpu-busy` meanwhile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, FAILED
from agent.instances.admission import HostMemory
from agent.instances.confine import VMM_UID_BASE
from agent.instances.fake import FakeRuntime
from agent.instances.fake_vfio import FakeVfio, build_tree
from agent.instances.passthrough import GpuPassthrough, passed_through
from agent.kinds.holds import busy_failure
from agent.offload import inline
from bc.protocol.pb import common_pb2, spec_pb2

GPUS = [("GPU-a", "00000000:18:00.0"), ("GPU-b", "00000000:2A:00.0"), ("GPU-c", "")]


def assignment(aid: str, binding: int, *gpus: str) -> spec_pb2.DeviceAssignment:
    a = spec_pb2.DeviceAssignment(allocation_id=aid, reservation_id=f"r-{aid}", binding=binding)  # type: ignore[arg-type]
    for g in gpus:
        a.devices.add(device_class="gpu", atom_id=g)
    return a


class Node:
    def __init__(self, tmp_path: Path, *, vfio_loaded: bool = True) -> None:
        boot = tmp_path / "instance-boot"
        boot.mkdir()
        (boot / "vmlinuz").write_bytes(b"kernel")
        self.sysfs = tmp_path / "sys"
        build_tree(self.sysfs, [b for _, b in GPUS if b], vfio_loaded=vfio_loaded)
        self.vfio = FakeVfio(self.sysfs)
        self.records = tmp_path / "instance-gpus"
        self.cdi = tmp_path / "cdi"
        self.cdi.mkdir()
        self.devices = spec_pb2.DevicesSection()
        self.booked: dict[str, frozenset[str]] = {}
        self.inventory = common_pb2.Inventory(
            gpus=[common_pb2.Gpu(index=i, uuid=u, pci_bus_id=b) for i, (u, b) in enumerate(GPUS)]
        )
        self.runtime = FakeRuntime(tmp_path / "fake-instances.json")
        self.gpus = GpuPassthrough(self.vfio, self.records, inline, self._inventory, lambda: self.devices, self._booked)
        self.conv = InstancesConverger({"qemu": self.runtime}, boot, self._memory, list, inline, gpus=self.gpus)
        self.generation = 0

    async def _inventory(self) -> common_pb2.Inventory:
        return self.inventory

    async def _booked(self) -> dict[str, frozenset[str]]:
        return self.booked

    async def _memory(self) -> HostMemory:
        return HostMemory(64 * 1024)

    def book(self, aid: str, *gpus: str) -> None:
        self.devices.assignments.append(assignment(aid, spec_pb2.BINDING_INSTANCE, *gpus))
        self.booked[aid] = frozenset(gpus)

    async def converge(self, *instances: spec_pb2.Instance):  # type: ignore[no-untyped-def]
        self.generation += 1
        return await self.conv.converge(spec_pb2.InstancesSection(instances=instances), self.generation)

    def status(self, iid: str) -> common_pb2.InstanceStatus:
        (found,) = [s for s in self.conv.statuses if s.id == iid]
        return found


def vm(iid: str, state: str = "RUNNING", gpus: tuple[str, ...] = ("GPU-a",), aid: str = "alloc-1") -> spec_pb2.Instance:
    return spec_pb2.Instance(
        id=iid, runtime="qemu", vcpus=1, memory_mib=512, kernel="vmlinuz", state=state, gpus=gpus, allocation_id=aid
    )


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_a_booked_gpu_is_passed_through_while_the_vm_runs(node: Node) -> None:
    node.book("alloc-1", "GPU-a")
    assert (await node.converge(vm("a"))).state == CONVERGED
    assert node.status("a").state == "RUNNING" and list(node.status("a").gpus) == ["GPU-a"]
    assert node.vfio.on_vfio() == ["0000:18:00.0", "0000:18:00.1"]  # the GPU and its audio function
    assert node.runtime.configs["a"].gpus == ("0000:18:00.0",)  # what qemu gets as -device vfio-pci,host=
    assert passed_through(node.records) == {"GPU-a": "a"}

    await node.converge(vm("a", "PAUSED"))
    assert node.vfio.on_vfio() and list(node.status("a").gpus) == ["GPU-a"]
    await node.converge(vm("a", "STOPPED"))
    assert node.vfio.on_vfio() == [] and node.vfio.driver("0000:18:00.0") == "nvidia"
    assert list(node.status("a").gpus) == [] and passed_through(node.records) == {}
    await node.converge(vm("a"))
    assert node.vfio.on_vfio() == ["0000:18:00.0", "0000:18:00.1"]
    await node.converge(vm("a", "DELETED"))
    assert node.vfio.on_vfio() == [] and passed_through(node.records) == {}


async def test_a_gpu_reset_is_refused_while_the_gpu_is_passed_through(node: Node) -> None:
    node.book("alloc-1", "GPU-a")
    await node.converge(vm("a"))
    busy = await busy_failure(node.cdi, {"GPU-a", "GPU-b"}, inline, node.records)
    assert busy is not None and busy.reason == "gpu-busy"
    assert busy.message == "GPU GPU-a is passed through to instance a"
    assert await busy_failure(node.cdi, {"GPU-b"}, inline, node.records) is None
    await node.converge(vm("a", "STOPPED"))
    assert await busy_failure(node.cdi, {"GPU-a"}, inline, node.records) is None


async def test_a_guest_that_powered_off_hands_its_gpus_back(node: Node) -> None:
    node.book("alloc-1", "GPU-a")
    await node.converge(vm("a", "STOPPED"))
    assert node.vfio.on_vfio() == []  # defined, never started: nothing bound
    await node.converge(vm("a"))
    node.runtime.reboot()  # a host reboot (or the guest's own power-off): qemu is gone, the record stays
    node.booked.clear()  # and meanwhile its reservation ended: the next pass fails it, and still hands back
    result = await node.converge(vm("a"))
    assert result.state == FAILED and node.vfio.on_vfio() == [] and passed_through(node.records) == {}


@pytest.mark.parametrize(
    "setup, instance, message",
    [
        (lambda n: None, vm("a"), "GPU GPU-a is not in a BINDING_INSTANCE assignment of allocation alloc-1"),
        (
            lambda n: n.devices.assignments.append(assignment("h1", spec_pb2.BINDING_HOLD, "GPU-a")),
            vm("a"),
            "GPU GPU-a is in a hold of allocation h1: it is not passed through",
        ),
        (
            lambda n: (n.book("alloc-1", "GPU-a"), n.booked.clear()),
            vm("a"),
            "GPU GPU-a is not booked on this node for allocation alloc-1 (its assignment did not bind)",
        ),
        (lambda n: n.book("alloc-1", "GPU-x"), vm("a", gpus=("GPU-x",)), "GPU GPU-x is not in this node's inventory"),
        (
            lambda n: n.book("alloc-1", "GPU-c"),
            vm("a", gpus=("GPU-c",)),
            "GPU GPU-c has no PCI bus id in the inventory",
        ),
        (
            lambda n: n.book("other", "GPU-a"),
            vm("a"),
            "GPU GPU-a is in an instance booking of allocation other: it is not passed through",
        ),
    ],
)
async def test_a_gpu_the_instance_may_not_have_fails_it_alone(
    node: Node, setup: object, instance: spec_pb2.Instance, message: str
) -> None:
    setup(node)  # type: ignore[operator]
    result = await node.converge(instance, vm("free", gpus=(), aid=""))
    assert result.state == FAILED and node.status("a").state == "ERROR"
    assert node.status("a").message.startswith(message), node.status("a").message
    assert node.status("free").state == "RUNNING"  # the others carry on
    assert node.vfio.on_vfio() == [] and node.runtime.domain("a") is None


async def test_a_host_without_vfio_pci_fails_the_start_and_leaves_nothing_bound(tmp_path: Path) -> None:
    node = Node(tmp_path, vfio_loaded=False)
    node.book("alloc-1", "GPU-a")
    result = await node.converge(vm("a"))
    assert result.state == FAILED
    assert node.status("a").message == (
        "start: VFIO: 0000:18:00.0, 0000:18:00.1 did not move to vfio-pci (is the vfio-pci module loaded?)"
    )
    assert node.vfio.driver("0000:18:00.0") == "nvidia" and passed_through(node.records) == {}
    assert ("start", "a") not in node.runtime.calls


async def test_a_node_without_passthrough_fails_an_instance_naming_gpus(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.conv.gpus = None
    result = await node.converge(vm("a"))
    assert result.state == FAILED and node.status("a").message == "this node passes no GPU through (no VFIO)"


async def test_a_confined_vmm_found_gone_gives_its_group_node_back_to_root(node: Node) -> None:
    node.book("alloc-1", "GPU-a")
    await node.converge(vm("a"))
    group = node.vfio.group_id(node.vfio.on_vfio()[0])
    os.chown(node.sysfs / "dev" / "vfio" / group, VMM_UID_BASE, VMM_UID_BASE)  # as a confined start hands it
    node.runtime.reboot()  # its VMM is gone, and no process of its user runs
    await node.converge(vm("a", "STOPPED"))
    st = (node.sysfs / "dev" / "vfio" / group).stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o600) and node.vfio.on_vfio() == []
