"""Host resources of a hold, the pure parts: limits, slice names and properties, host admission, the plan."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.converge.devices import Bind, Fail, plan
from agent.converge.hold_slices import HoldSlices
from agent.hw.base import ProcessResult
from agent.hw.fake import FakeHardware
from agent.hw.limits import (
    GIB,
    HostMemory,
    InvalidLimits,
    Limits,
    admit,
    allocation_of_slice,
    cgroup_path,
    host_memory,
    hugetlb_limits,
    slice_name,
    slice_properties,
)
from agent.hw.slices import FakeSlices, SliceError, SystemdSlices
from agent.offload import inline
from bc.protocol.pb import common_pb2, spec_pb2


def test_slice_names_and_cgroup_paths() -> None:
    assert slice_name("alloc-7") == "bc-alloc-alloc-7.slice"
    assert allocation_of_slice("bc-alloc-alloc-7.slice") == "alloc-7"
    assert allocation_of_slice("bc-alloc.slice") is None and allocation_of_slice("user.slice") is None
    assert cgroup_path("bc-alloc-x.slice") == "bc.slice/bc-alloc.slice/bc-alloc-x.slice"


def test_slice_properties_from_limits() -> None:
    limits = Limits(cpu_millis=2500, memory_bytes=10 * GIB, hugepages_1gi=2, cpus="0-3,8", mems="0")
    assert slice_properties(limits) == {
        "CPUQuota": "250%",
        "MemoryMax": str(10 * GIB),
        "MemoryHigh": str(9 * GIB),
        "AllowedCPUs": "0-3,8",
        "AllowedMemoryNodes": "0",
    }
    assert slice_properties(Limits(cpu_millis=1)) == {"CPUQuota": "1%"}  # whole percents, rounded up
    assert hugetlb_limits(limits) == {"hugetlb.1GB.max": 2 * GIB}
    assert slice_properties(Limits()) == {} and Limits().empty


def test_limits_round_trip_through_the_annotation() -> None:
    limits = Limits(cpu_millis=1000, memory_bytes=GIB, cpus="0-1")
    assert limits.annotation() == '{"cpu_millis":1000,"cpus":"0-1","memory_bytes":1073741824}'
    assert Limits.from_annotation(limits.annotation()) == limits
    pb = spec_pb2.ResourceLimits(cpu_millis=1000, memory_bytes=GIB, cpus="0-1")
    assert Limits.from_proto(pb) == limits


@pytest.mark.parametrize("bad", [Limits(memory_bytes=-1), Limits(cpus="0-3 x"), Limits(mems="a"), Limits(cpus="0\n")])
def test_limits_a_slice_cannot_carry_are_refused(bad: Limits) -> None:
    with pytest.raises(InvalidLimits):
        bad.check()


HOST = HostMemory(total_bytes=64 * GIB, hugepages_1g=8)  # 64 - 8 pool - 1 headroom: 55 GiB to give


def test_admission_counts_memory_less_the_pool_and_headroom_and_the_bound_holds() -> None:
    assert admit(Limits(memory_bytes=55 * GIB), [], HOST) is None
    assert (
        admit(Limits(memory_bytes=55 * GIB + 1), [], HOST) == "56320 MiB of memory needed, 56320 MiB left on this host"
    )
    assert admit(Limits(memory_bytes=30 * GIB), [Limits(memory_bytes=25 * GIB)], HOST) is None
    why = admit(Limits(memory_bytes=31 * GIB), [Limits(memory_bytes=25 * GIB)], HOST)
    assert why == "31744 MiB of memory needed, 30720 MiB left on this host"


def test_admission_counts_huge_pages() -> None:
    assert admit(Limits(hugepages_1gi=8), [], HOST) is None
    assert admit(Limits(hugepages_1gi=5), [Limits(hugepages_1gi=4)], HOST) == (
        "5 1 GiB huge pages needed, 4 left on this host"
    )
    assert admit(Limits(hugepages_1gi=99), [], HostMemory(64 * GIB, None)) is None  # the pool is unknown


def test_a_hold_without_memory_or_pages_always_fits() -> None:
    assert admit(Limits(cpu_millis=999_000), [Limits(memory_bytes=10**15)], HOST) is None


def test_host_memory_from_the_inventory() -> None:
    inv = FakeHardware("hgx-h100-8", "n").inventory()
    assert host_memory(inv) == HostMemory(2048 * GIB, 128)
    assert host_memory(common_pb2.Inventory()) is None  # unreadable: bind without the check
    assert host_memory(common_pb2.Inventory(memory_bytes=GIB)) == HostMemory(GIB, None)


def _assign(
    aid: str, gpu: str, *, memory_gib: int = 0, binding: int = spec_pb2.BINDING_HOLD
) -> spec_pb2.DeviceAssignment:
    return spec_pb2.DeviceAssignment(
        allocation_id=aid,
        reservation_id=f"res-{aid}",
        binding=binding,  # type: ignore[arg-type]
        devices=[spec_pb2.DeviceRef(device_class="gpu", atom_id=gpu)],
        limits=spec_pb2.ResourceLimits(memory_bytes=memory_gib * GIB),
    )


def _reasons(actions: Sequence[object]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for a in actions:
        if isinstance(a, Fail):
            out.append((a.assignment.allocation_id, a.reason))
        elif isinstance(a, Bind):
            out.append((a.assignment.allocation_id, "bind"))
    return out


def test_the_plan_admits_new_holds_in_order_against_what_is_left() -> None:
    inv = FakeHardware("hgx-h100-8", "n").inventory()
    g = [x.uuid for x in inv.gpus]
    # 2048 GiB less 128 GiB of pages less 1 GiB: 1919 GiB to give.
    host = HostMemory(2048 * GIB, 128)
    actions = plan(
        [_assign("a", g[0], memory_gib=1000), _assign("b", g[1], memory_gib=1000), _assign("c", g[2], memory_gib=900)],
        {},
        inv,
        host=host,
    )
    assert _reasons(actions) == [("a", "bind"), ("b", "resources-exhausted"), ("c", "bind")]
    bind = actions[0]
    assert isinstance(bind, Bind) and bind.slice == "bc-alloc-a.slice"
    # Without a host reading there is no admission.
    assert _reasons(plan([_assign("a", g[0], memory_gib=5000)], {}, inv, host=None)) == [("a", "bind")]


def test_the_plan_gives_no_slice_without_limits_to_kubernetes_or_without_a_seam() -> None:
    inv = FakeHardware("hgx-h100-8", "n").inventory()
    g = [x.uuid for x in inv.gpus]
    plain, k8s, limited = (
        _assign("p", g[0]),
        _assign("k", g[1], memory_gib=1, binding=spec_pb2.BINDING_KUBERNETES),
        _assign("l", g[2], memory_gib=1),
    )
    binds = [a for a in plan([plain, k8s, limited], {}, inv) if isinstance(a, Bind)]
    assert [(b.assignment.allocation_id, b.slice) for b in binds] == [("p", ""), ("k", ""), ("l", "bc-alloc-l.slice")]
    assert "BC_CGROUP_PARENT=bc-alloc-l.slice" in binds[2].env
    assert binds[2].doc["annotations"]["bc.dev/cgroup-parent"] == "bc-alloc-l.slice"
    assert "bc.dev/cgroup-parent" not in binds[1].doc["annotations"]
    assert binds[1].doc["annotations"]["bc.dev/limits"] == Limits(memory_bytes=GIB).annotation()
    assert "bc.dev/limits" not in binds[0].doc["annotations"]
    [unmanaged] = [a for a in plan([limited], {}, inv, slices=False) if isinstance(a, Bind)]
    assert unmanaged.slice == "" and "bc.dev/cgroup-parent" not in unmanaged.doc["annotations"]


@pytest.mark.parametrize("binding", [spec_pb2.BINDING_UNSPECIFIED, 9])
def test_an_unspecified_or_unknown_binding_is_refused(binding: int) -> None:
    inv = FakeHardware("hgx-h100-8", "n").inventory()
    assert _reasons(plan([_assign("a", inv.gpus[0].uuid, binding=binding)], {}, inv)) == [("a", "unsupported-binding")]


# The seam's two sides.


async def test_fake_slices_record_properties_and_a_populated_flag(tmp_path: Path) -> None:
    slices = FakeSlices(tmp_path, offload=inline)
    name = "bc-alloc-a.slice"
    assert not await slices.present(name) and await slices.list() == []
    await slices.apply(name, Limits(cpu_millis=1000, hugepages_1gi=1))
    assert await slices.present(name) and await slices.list() == [name]
    assert FakeSlices.read(tmp_path, name) == {
        "name": name,
        "properties": {"CPUQuota": "100%"},
        "hugetlb": {"hugetlb.1GB.max": GIB},
        "populated": False,
    }
    FakeSlices.mark_populated(tmp_path, name)
    await slices.apply(name, Limits(cpu_millis=2000))  # a re-apply keeps the workload inside
    assert await slices.populated(name)
    assert FakeSlices.drop_all(tmp_path) == 1 and not await slices.present(name)


class Recorder:
    def __init__(self, fail: str = "") -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    async def __call__(self, argv: Sequence[str], *, timeout_s: float | None = None) -> ProcessResult:
        self.calls.append(list(argv))
        if self.fail and self.fail in argv:
            return ProcessResult(1, b"", b"Failed to start: access denied")
        return ProcessResult(0, b"", b"")


async def test_systemd_slices_call_systemctl_and_read_cgroupfs(tmp_path: Path) -> None:
    run = Recorder()
    root, control = tmp_path / "cg", tmp_path / "control"
    slices = SystemdSlices(run=run, cgroup_root=root, control_dir=control, offload=inline)
    name = "bc-alloc-a.slice"
    leaf = root / "bc.slice" / "bc-alloc.slice" / name
    leaf.mkdir(parents=True)  # what `systemctl start` makes on a real host
    await slices.apply(name, Limits(cpu_millis=1500, memory_bytes=GIB, hugepages_1gi=2, cpus="0-3", mems="0"))
    assert run.calls == [
        [
            "systemctl",
            "set-property",
            "--runtime",
            name,
            "MemoryAccounting=yes",
            "CPUQuota=150%",
            f"MemoryMax={GIB}",
            f"MemoryHigh={GIB * 9 // 10}",
            "AllowedCPUs=0-3",
            "AllowedMemoryNodes=0",
        ],
        ["systemctl", "start", name],
    ]
    assert (leaf / "hugetlb.1GB.max").read_text() == str(2 * GIB)
    assert (root / "bc.slice" / "cgroup.subtree_control").read_text() == "+hugetlb"
    assert await slices.present(name) and not await slices.present("bc-alloc-b.slice")
    (leaf / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert await slices.populated(name)
    (leaf / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert not await slices.populated(name)
    (control / f"{name}.d").mkdir(parents=True)
    (control / "user.slice.d").mkdir()
    assert await slices.list() == [name]
    await slices.stop(name)
    assert run.calls[-2:] == [["systemctl", "stop", name], ["systemctl", "revert", name]]


async def test_a_failing_systemctl_is_a_slice_error(tmp_path: Path) -> None:
    slices = SystemdSlices(run=Recorder(fail="start"), cgroup_root=tmp_path, control_dir=tmp_path, offload=inline)
    with pytest.raises(SliceError, match="access denied"):
        await slices.apply("bc-alloc-a.slice", Limits(cpu_millis=1000))


async def test_a_fake_reboot_drops_the_fake_slices(tmp_path: Path) -> None:
    hw = FakeHardware("hgx-h100-8", "n", state_dir=tmp_path, offload=inline)
    hw.reboot_hook = lambda: None
    slices = FakeSlices(tmp_path / "fake-slices", offload=inline)
    await slices.apply("bc-alloc-a.slice", Limits(cpu_millis=1000))
    done, _ = await hw.reboot()
    assert done and await slices.list() == []


async def test_a_failed_stop_is_tried_again_on_the_next_sweep(tmp_path: Path) -> None:
    class Stuck(FakeSlices):
        fail = True

        async def stop(self, name: str) -> None:
            if self.fail:
                raise SliceError("systemctl stop: timed out")
            await super().stop(name)

    slices = Stuck(tmp_path, offload=inline)
    await slices.apply("bc-alloc-a.slice", Limits(cpu_millis=1000))
    await slices.apply("bc-alloc-b.slice", Limits(cpu_millis=1000))
    sweeper = HoldSlices(slices)
    assert await sweeper.sweep({"bc-alloc-b.slice"}) == []
    assert await slices.list() == ["bc-alloc-a.slice", "bc-alloc-b.slice"]
    slices.fail = False
    assert await sweeper.sweep({"bc-alloc-b.slice"}) == ["bc-alloc-a.slice"]
    assert await slices.list() == ["bc-alloc-b.slice"]
    assert await HoldSlices(None).sweep([]) == []
