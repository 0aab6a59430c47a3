"""Holds with host resources over real files: the fake slice, the CDI spec that names it, admission, bindings."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.converge.devices import DevicesConverger
from agent.converge.run import CONVERGED, FAILED, PROGRESSING, run
from agent.hw.limits import GIB
from agent.hw.slices import FAKE_SLICES_DIR, FakeSlices, SliceError
from agent.offload import inline
from bc.protocol.pb import session_pb2, spec_pb2
from tests.integration.test_devices_converger import Node, assert_valid_cdi, section

BOUND = session_pb2.AllocationReport.BOUND
RELEASED = session_pb2.AllocationReport.RELEASED
FAILED_KIND = session_pb2.AllocationReport.FAILED


class SliceNode(Node):
    """A node whose devices converger makes fake slices under its data dir, as `--fake-hw` does."""

    def __init__(self, tmp: Path, profile: str = "hgx-h100-8") -> None:
        self.slice_dir = tmp / FAKE_SLICES_DIR
        super().__init__(tmp, profile)

    def fresh(self) -> DevicesConverger:
        return DevicesConverger(
            self.cdi_dir,
            self.env_dir,
            self.hw,
            self.node_id,
            mps_pipe_dir=self.mps_dir,
            slices=FakeSlices(self.slice_dir, offload=inline),
        )

    def slice(self, allocation_id: str) -> dict[str, object] | None:
        return FakeSlices.read(self.slice_dir, f"bc-alloc-{allocation_id}.slice")


def limited(
    allocation_id: str,
    gpu: str,
    *,
    binding: int = spec_pb2.BINDING_HOLD,
    cpu_millis: int = 4000,
    memory_gib: int = 64,
    hugepages: int = 0,
) -> spec_pb2.DeviceAssignment:
    return spec_pb2.DeviceAssignment(
        allocation_id=allocation_id,
        reservation_id=f"res-{allocation_id}",
        binding=binding,  # type: ignore[arg-type]
        devices=[spec_pb2.DeviceRef(device_class="gpu", atom_id=gpu)],
        limits=spec_pb2.ResourceLimits(
            cpu_millis=cpu_millis, memory_bytes=memory_gib * GIB, hugepages_1gi=hugepages, cpus="0-55", mems="0"
        ),
    )


@pytest.fixture
def node(tmp_path: Path) -> SliceNode:
    return SliceNode(tmp_path)


async def test_a_hold_with_limits_makes_its_slice_and_names_it_in_a_valid_cdi_spec(node: SliceNode) -> None:
    a = limited("alloc-1", node.inv.gpus[0].uuid, hugepages=2)
    result = await node.converger.converge(section(a), 1)
    assert result.state == CONVERGED and [e.kind for e in result.events] == [BOUND]
    assert node.slice("alloc-1") == {
        "name": "bc-alloc-alloc-1.slice",
        "properties": {
            "CPUQuota": "400%",
            "MemoryMax": str(64 * GIB),
            "MemoryHigh": str(64 * GIB * 9 // 10),
            "AllowedCPUs": "0-55",
            "AllowedMemoryNodes": "0",
        },
        "hugetlb": {"hugetlb.1GB.max": 2 * GIB},
        "populated": False,
    }
    doc = node.cdi("alloc-1")
    assert_valid_cdi(doc)  # against ../shared/cdi-schema when it is there
    assert doc["annotations"]["bc.dev/cgroup-parent"] == "bc-alloc-alloc-1.slice"
    assert "BC_CGROUP_PARENT=bc-alloc-alloc-1.slice" in doc["containerEdits"]["env"]
    assert "BC_CGROUP_PARENT=bc-alloc-alloc-1.slice" in node.env("alloc-1")
    # A fresh converger reads it back and changes nothing.
    again = await node.fresh().converge(section(a), 2)
    assert again.events == [] and again.state == CONVERGED


async def test_a_slice_that_cannot_be_made_keeps_the_hold_unbound(node: SliceNode) -> None:
    a = limited("alloc-1", node.inv.gpus[0].uuid)

    class Broken(FakeSlices):
        async def apply(self, name: str, limits: object) -> None:
            raise SliceError("systemctl set-property: access denied")

    broken = DevicesConverger(node.cdi_dir, node.env_dir, node.hw, "node-a", slices=Broken(node.slice_dir))
    out = await run(spec_pb2.NodeSpec(devices=section(a)), 1, {"devices": broken})
    devices = next(s for s in out.statuses if s.section == "devices")
    assert devices.state == PROGRESSING and "access denied" in devices.message and not out.observed
    assert not (node.cdi_dir / "bc-alloc-1.json").exists()  # never a CDI spec naming a slice that is not there
    result = await node.converger.converge(section(a), 1)
    assert [e.kind for e in result.events] == [BOUND] and node.slice("alloc-1") is not None


async def test_a_slice_a_reboot_dropped_is_made_again(node: SliceNode) -> None:
    a = limited("alloc-1", node.inv.gpus[0].uuid)
    await node.converger.converge(section(a), 1)
    assert FakeSlices.drop_all(node.slice_dir) == 1  # what a fake reboot does
    result = await node.fresh().converge(section(a), 1)
    assert result.events == [] and result.state == CONVERGED
    assert node.slice("alloc-1") is not None


async def test_changed_limits_are_applied_to_the_held_slice(node: SliceNode) -> None:
    g0 = node.inv.gpus[0].uuid
    await node.converger.converge(section(limited("alloc-1", g0)), 1)
    result = await node.converger.converge(section(limited("alloc-1", g0, cpu_millis=8000)), 2)
    assert result.events == [] and result.state == CONVERGED
    slice_ = node.slice("alloc-1")
    assert slice_ is not None and slice_["properties"]["CPUQuota"] == "800%"  # type: ignore[index]


async def test_release_stops_the_slice_only_once_it_is_empty(node: SliceNode) -> None:
    a = limited("alloc-1", node.inv.gpus[0].uuid)
    await node.converger.converge(section(a), 1)
    FakeSlices.mark_populated(node.slice_dir, "bc-alloc-alloc-1.slice")
    released = await node.converger.converge(section(), 2)
    assert [e.kind for e in released.events] == [RELEASED] and released.state == CONVERGED
    assert not (node.cdi_dir / "bc-alloc-1.json").exists()
    assert node.slice("alloc-1") is not None  # a workload still runs there: kept
    await node.converger.converge(section(), 2)  # the next (drift) pass: still in use
    assert node.slice("alloc-1") is not None
    FakeSlices.mark_populated(node.slice_dir, "bc-alloc-alloc-1.slice", False)
    quiet = await node.fresh().converge(section(), 2)  # after a restart too: the seam lists it
    assert quiet.events == [] and node.slice("alloc-1") is None


async def test_holds_without_limits_get_no_slice(node: SliceNode) -> None:
    a = spec_pb2.DeviceAssignment(
        allocation_id="alloc-1",
        reservation_id="res-1",
        binding=spec_pb2.BINDING_HOLD,
        devices=[spec_pb2.DeviceRef(device_class="gpu", atom_id=node.inv.gpus[0].uuid)],
    )
    await node.converger.converge(section(a), 1)
    doc = node.cdi("alloc-1")
    assert doc["annotations"] == {"bc.dev/allocation-id": "alloc-1", "bc.dev/reservation-id": "res-1"}
    assert not any(line.startswith("BC_CGROUP_PARENT=") for line in doc["containerEdits"]["env"])
    assert not node.slice_dir.exists() or list(node.slice_dir.iterdir()) == []


async def test_a_kubernetes_hold_gets_the_binding_annotation_and_no_slice(node: SliceNode) -> None:
    a = limited("alloc-k", node.inv.gpus[0].uuid, binding=spec_pb2.BINDING_KUBERNETES)
    result = await node.converger.converge(section(a), 1)
    assert [e.kind for e in result.events] == [BOUND]
    doc = node.cdi("alloc-k")
    assert_valid_cdi(doc)
    assert doc["annotations"]["bc.dev/binding"] == "kubernetes"
    assert "bc.dev/cgroup-parent" not in doc["annotations"]
    env = doc["containerEdits"]["env"]
    assert not any(line.startswith(("NVIDIA_VISIBLE_DEVICES=", "BC_CGROUP_PARENT=")) for line in env)
    assert node.slice("alloc-k") is None


@pytest.mark.parametrize("binding", [spec_pb2.BINDING_UNSPECIFIED, 5])
async def test_an_unspecified_or_unknown_binding_fails(node: SliceNode, binding: int) -> None:
    a = limited("alloc-1", node.inv.gpus[0].uuid, binding=binding)
    result = await node.converger.converge(section(a), 1)
    assert result.state == FAILED and result.terminal
    assert [(e.kind, e.reason) for e in result.events] == [(FAILED_KIND, "unsupported-binding")]
    assert list(node.cdi_dir.iterdir()) == [] and node.slice("alloc-1") is None


async def test_the_vms_running_on_the_host_count_against_a_new_hold(node: SliceNode) -> None:
    # 1919 GiB for holds (below); the instances converger reports 1800 GiB of VMs with their overhead.
    converger = node.fresh()
    converger.instances_committed_mib = lambda: 1800 * 1024
    g = node.inv.gpus
    result = await converger.converge(section(limited("alloc-1", g[0].uuid, memory_gib=200)), 1)
    (event,) = result.events
    assert (event.kind, event.reason) == (FAILED_KIND, "resources-exhausted")
    assert event.message == "204800 MiB of memory needed, 121856 MiB left on this host"
    converger.instances_committed_mib = lambda: 0  # the VMs stopped: the next pass binds it
    assert [
        e.kind for e in (await converger.converge(section(limited("alloc-1", g[0].uuid, memory_gib=200)), 2)).events
    ] == [BOUND]


async def test_admission_fails_a_hold_the_host_memory_cannot_take(node: SliceNode) -> None:
    # hgx-h100-8: 2048 GiB, 128 GiB of it in 1 GiB pages, 1 GiB of headroom: 1919 GiB for holds.
    g = node.inv.gpus
    first = limited("alloc-1", g[0].uuid, memory_gib=1500)
    # The Kubernetes hold has no slice, but its booked memory counts all the same.
    k8s = limited("alloc-k", g[1].uuid, memory_gib=400, binding=spec_pb2.BINDING_KUBERNETES)
    await node.converger.converge(section(first, k8s), 1)
    late = limited("alloc-2", g[2].uuid, memory_gib=20)
    pages = limited("alloc-3", g[3].uuid, memory_gib=0, hugepages=129)
    result = await node.fresh().converge(section(first, k8s, late, pages), 2)  # a restart: the holds are on disk
    assert result.state == FAILED and result.terminal and result.reason == "AllocationFailed"
    by_id = {e.allocation_id: e for e in result.events}
    assert set(by_id) == {"alloc-2", "alloc-3"}
    assert (by_id["alloc-2"].kind, by_id["alloc-2"].reason) == (FAILED_KIND, "resources-exhausted")
    assert by_id["alloc-2"].message == "20480 MiB of memory needed, 19456 MiB left on this host"
    assert by_id["alloc-3"].reason == "resources-exhausted"
    assert by_id["alloc-3"].message == "129 1 GiB huge pages needed, 128 left on this host"
    assert node.slice("alloc-2") is None and not (node.cdi_dir / "bc-alloc-alloc-2.json").exists()
    # Once the first hold is released, the same hold fits.
    later = await node.converger.converge(section(k8s, late), 3)
    assert [(e.allocation_id, e.kind) for e in later.events] == [("alloc-1", RELEASED), ("alloc-2", BOUND)]


async def test_an_adopted_hold_gets_its_slice_back_from_its_cdi_file(node: SliceNode) -> None:
    """Journal lost after a reboot: no spec (generation 0), so every hold is adopted, and its slice remade."""
    a = limited("alloc-1", node.inv.gpus[0].uuid)
    await node.converger.converge(section(a), 3)
    FakeSlices.drop_all(node.slice_dir)
    FakeSlices.drop_all(node.slice_dir)  # idempotent
    result = await node.fresh().converge(section(), 0)
    assert result.events == [] and (node.cdi_dir / "bc-alloc-1.json").exists()
    slice_ = node.slice("alloc-1")
    assert slice_ is not None and slice_["properties"]["MemoryMax"] == str(64 * GIB)  # type: ignore[index]
