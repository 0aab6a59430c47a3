"""BINDING_INSTANCE in the devices converger, over real files: a booking record and no CDI spec, the same
overlap rule as holds both ways (a GPU is never both held and passed through), whole GPUs only, refused on a
node without instances, released when the spec drops it, and kept through a journal loss like a hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.converge.devices import DevicesConverger
from agent.converge.run import CONVERGED, FAILED, PROGRESSING
from agent.hw.fake import FakeHardware
from agent.instances.bookings import InstanceBookings
from agent.offload import inline
from bc.protocol.pb import session_pb2, spec_pb2

BOUND = session_pb2.AllocationReport.BOUND
RELEASED = session_pb2.AllocationReport.RELEASED
FAILED_REPORT = session_pb2.AllocationReport.FAILED


class Node:
    def __init__(self, tmp: Path, *, instances: bool = True) -> None:
        self.hw = FakeHardware("hgx-h100-8", "n1")
        self.gpus = [g.uuid for g in self.hw.inventory().gpus]
        self.cdi = tmp / "cdi"
        self.bookings = InstanceBookings(tmp / "instance-bookings", inline) if instances else None
        self.conv = DevicesConverger(
            self.cdi,
            tmp / "env",
            self.hw,
            "n1",
            mps_pipe_dir=tmp / "no-mps",
            offload=inline,
            instance_bookings=self.bookings,
        )
        self.generation = 0

    async def converge(self, *assignments: spec_pb2.DeviceAssignment):  # type: ignore[no-untyped-def]
        self.generation += 1
        return await self.conv.converge(spec_pb2.DevicesSection(assignments=assignments), self.generation)


def assign(aid: str, binding: int, *atoms: tuple[str, str]) -> spec_pb2.DeviceAssignment:
    a = spec_pb2.DeviceAssignment(allocation_id=aid, reservation_id=f"r-{aid}", binding=binding)  # type: ignore[arg-type]
    for cls, atom in atoms:
        a.devices.add(device_class=cls, atom_id=atom)
    return a


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_an_instance_booking_is_recorded_and_no_cdi_spec_is_written(node: Node) -> None:
    g = node.gpus
    result = await node.converge(assign("vm1", spec_pb2.BINDING_INSTANCE, ("gpu", g[0]), ("gpu", g[1])))
    assert result.state == CONVERGED
    assert [(e.allocation_id, e.kind) for e in result.events] == [("vm1", BOUND)]
    assert not node.cdi.exists() or list(node.cdi.iterdir()) == []  # nothing a container runtime could see
    assert node.bookings is not None and await node.bookings.booked() == {"vm1": frozenset(g[:2])}
    again = await node.converge(assign("vm1", spec_pb2.BINDING_INSTANCE, ("gpu", g[0]), ("gpu", g[1])))
    assert again.state == CONVERGED and again.events == []  # held as it is: nothing new to report
    released = await node.converge()
    assert [(e.allocation_id, e.kind) for e in released.events] == [("vm1", RELEASED)]
    assert await node.bookings.booked() == {}


async def test_a_gpu_is_never_both_held_and_booked_for_an_instance(node: Node) -> None:
    g = node.gpus
    await node.converge(assign("h1", spec_pb2.BINDING_HOLD, ("gpu", g[0])))
    result = await node.converge(
        assign("h1", spec_pb2.BINDING_HOLD, ("gpu", g[0])), assign("vm1", spec_pb2.BINDING_INSTANCE, ("gpu", g[0]))
    )
    assert result.state == FAILED and "vm1: overlap" in result.message
    assert node.bookings is not None and await node.bookings.booked() == {}
    # ... and the other way round: a hold (even of one slot) on a GPU booked for a VM overlaps
    await node.converge(assign("vm2", spec_pb2.BINDING_INSTANCE, ("gpu", g[1])))
    result = await node.converge(
        assign("vm2", spec_pb2.BINDING_INSTANCE, ("gpu", g[1])), assign("h2", spec_pb2.BINDING_HOLD, ("gpu", g[1]))
    )
    assert result.state == FAILED and f"h2: overlap ({g[1]} overlaps {g[1]} held by vm2)" in result.message
    assert [e.kind for e in result.events] == [FAILED_REPORT]


@pytest.mark.parametrize(
    "extra, reason, words",
    [
        ({}, "unsupported-device", "an instance assignment passes whole GPUs, not MIG instances or slots"),
        ({"env": ["A=1"]}, "invalid-assignment", "an instance assignment carries no limits or env"),
    ],
)
async def test_what_an_instance_assignment_may_not_carry(
    node: Node, extra: dict[str, object], reason: str, words: str
) -> None:
    g = node.gpus
    if extra:
        a = assign("vm1", spec_pb2.BINDING_INSTANCE, ("gpu", g[0]))
        a.env.extend(extra["env"])  # type: ignore[arg-type]
    else:
        a = assign("vm1", spec_pb2.BINDING_INSTANCE, ("gpu.slot", f"{g[0]}/s0"))
    result = await node.converge(a)
    assert result.state == FAILED and f"vm1: {reason} ({words}" in result.message


async def test_a_node_without_instances_refuses_the_binding(tmp_path: Path) -> None:
    node = Node(tmp_path, instances=False)
    result = await node.converge(assign("vm1", spec_pb2.BINDING_INSTANCE, ("gpu", node.gpus[0])))
    assert result.state == FAILED and "vm1: unsupported-binding (this node runs no instances" in result.message


async def test_a_lost_journal_keeps_the_booking_like_a_hold(node: Node) -> None:
    await node.converge(assign("vm1", spec_pb2.BINDING_INSTANCE, ("gpu", node.gpus[0])))
    adopted = await node.conv.converge(spec_pb2.DevicesSection(), 0)  # generation 0: the journal holds no spec
    assert adopted.state == PROGRESSING and "vm1" in adopted.message
    assert node.bookings is not None and await node.bookings.booked() == {"vm1": frozenset(node.gpus[:1])}


async def test_a_new_hold_never_binds_a_gpu_a_vm_still_has(node: Node) -> None:
    g = node.gpus
    node.conv.in_vms = lambda: {g[0]: "gpu-vm"}  # its booking was released while the VM ran on
    result = await node.converge(assign("h1", spec_pb2.BINDING_HOLD, ("gpu.slot", f"{g[0]}/s0")))
    assert result.state == FAILED
    assert f"h1: overlap ({g[0]}/s0 is on GPU {g[0]}, passed through to instance gpu-vm)" in result.message
    assert (await node.converge(assign("h2", spec_pb2.BINDING_HOLD, ("gpu", g[1])))).state == CONVERGED
