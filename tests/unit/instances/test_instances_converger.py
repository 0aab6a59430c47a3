"""agent.converge.instances over the fake runtime: states, foreign domains, reboots, failures, admission."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, FAILED, PROGRESSING, SectionResult
from agent.instances.admission import HostMemory
from agent.instances.fake import FakeRuntime
from agent.instances.runtime import RuntimeFailure
from agent.offload import inline
from bc.protocol.pb import common_pb2, spec_pb2

GIB = 1024


class Node:
    def __init__(self, tmp_path: Path, total_mib: int = 16 * GIB, holds: list[int] | None = None) -> None:
        self.boot = tmp_path / "instance-boot"
        self.boot.mkdir()
        (self.boot / "vmlinuz").write_bytes(b"kernel")
        (self.boot / "initrd").write_bytes(b"initrd")
        self.runtime = FakeRuntime(tmp_path / "fake-instances.json")
        self.memory: HostMemory | None = HostMemory(total_mib)
        self.holds = holds or []
        self.conv = InstancesConverger({"qemu": self.runtime}, self.boot, self._memory, lambda: self.holds, inline)
        self.generation = 0

    async def _memory(self) -> HostMemory | None:
        return self.memory

    async def converge(self, *instances: spec_pb2.Instance) -> SectionResult:
        self.generation += 1
        return await self.conv.converge(spec_pb2.InstancesSection(instances=instances), self.generation)

    def status(self, iid: str, managed: bool = True) -> common_pb2.InstanceStatus:
        (found,) = [s for s in self.conv.statuses if s.id == iid and s.managed == managed]
        return found


def vm(iid: str, state: str = "RUNNING", memory_mib: int = 1024, **kw: object) -> spec_pb2.Instance:
    fields: dict[str, object] = {"runtime": "qemu", "vcpus": 1, "kernel": "vmlinuz", "initrd": "initrd", **kw}
    return spec_pb2.Instance(id=iid, memory_mib=memory_mib, state=state, **fields)  # type: ignore[arg-type]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_the_desired_states_in_turn(node: Node) -> None:
    assert (await node.converge(vm("a"))).state == CONVERGED
    assert node.status("a").state == "RUNNING" and node.status("a").desired == "RUNNING"
    await node.converge(vm("a", "PAUSED"))
    assert node.status("a").state == "PAUSED"
    await node.converge(vm("a"))
    assert node.status("a").state == "RUNNING"
    assert ("resume", "a") in node.runtime.calls and node.runtime.calls.count(("start", "a")) == 1
    await node.converge(vm("a", "STOPPED"))
    assert node.status("a").state == "STOPPED"
    result = await node.converge(vm("a", "DELETED"))
    assert result.state == CONVERGED and node.conv.statuses == [] and node.runtime.domain("a") is None


async def test_a_paused_start_and_a_stopped_define(node: Node) -> None:
    await node.converge(vm("p", "PAUSED"), vm("s", "STOPPED"))
    assert [(s.id, s.state) for s in node.conv.statuses] == [("p", "PAUSED"), ("s", "STOPPED")]
    assert ("start", "s") not in node.runtime.calls


async def test_a_domain_no_spec_names_is_deleted_but_a_foreign_one_is_only_reported(node: Node) -> None:
    node.runtime.add_foreign("theirs", "RUNNING", memory_mib=2048)
    await node.converge(vm("a"))
    result = await node.converge()
    assert result.state == CONVERGED and node.runtime.domain("a") is None
    theirs = node.status("theirs", managed=False)
    assert (theirs.managed, theirs.state, theirs.desired) == (False, "RUNNING", "")
    assert [c for c in node.runtime.calls if c[1] == "theirs"] == []


async def test_a_spec_naming_a_foreign_domain_fails_that_instance_only(node: Node) -> None:
    node.runtime.add_foreign("theirs", "STOPPED")
    result = await node.converge(vm("theirs"), vm("ours"))
    assert (result.state, result.reason, result.terminal) == (FAILED, "InstanceFailed", True)
    ours, theirs = [s for s in node.conv.statuses if s.id == "theirs"]  # bc's failed instance, then the domain
    assert (ours.managed, ours.state, theirs.managed, theirs.state) == (True, "ERROR", False, "STOPPED")
    assert "a domain bc did not create is named theirs" in ours.message and node.status("ours").state == "RUNNING"
    assert node.runtime.domain("theirs") is not None and node.runtime.domain("theirs").state == "STOPPED"  # type: ignore[union-attr]


async def test_after_a_host_reboot_the_next_pass_starts_what_should_run(node: Node) -> None:
    await node.converge(vm("a"), vm("b", "PAUSED"), vm("c", "STOPPED"))
    node.runtime.reboot()
    assert (await node.converge(vm("a"), vm("b", "PAUSED"), vm("c", "STOPPED"))).state == CONVERGED
    assert [(s.id, s.state) for s in node.conv.statuses] == [("a", "RUNNING"), ("b", "PAUSED"), ("c", "STOPPED")]


async def test_a_runtime_failure_fails_that_instance_only_and_the_next_pass_retries(node: Node) -> None:
    node.runtime.fail("a", "start", "qemu exited: could not open kernel")
    result = await node.converge(vm("a"), vm("b"))
    assert (result.state, result.reason, result.reported_state) == (FAILED, "InstanceFailed", FAILED)
    assert node.status("a").state == "ERROR" and node.status("a").message == "start: qemu exited: could not open kernel"
    assert node.status("b").state == "RUNNING"
    assert (await node.converge(vm("a"), vm("b"))).state == CONVERGED


async def test_a_missing_kernel_or_a_bad_spec_fails_the_instance(node: Node) -> None:
    result = await node.converge(vm("a", kernel="nope"), vm("b", vcpus=0), vm("c", runtime="libvirt-kvm"))
    assert result.state == FAILED
    assert "the kernel 'nope' is not in" in node.status("a").message
    assert "vcpus must be between 1 and 256" in node.status("b").message
    assert node.status("c").message == "the spec's instance.runtime must be one of qemu, libvirt, not 'libvirt-kvm'"


async def test_admission_refuses_an_oversize_start_which_stays_stopped(tmp_path: Path) -> None:
    # budget: 8192 - 1024 = 7168 MiB; a 4096 MiB VM commits 4096 + 128 + 256 = 4480
    node = Node(tmp_path, total_mib=8 * GIB)
    result = await node.converge(vm("a", memory_mib=4096), vm("b", memory_mib=4096))
    assert (result.state, result.reason, result.reported_state) == (PROGRESSING, "ResourcesExhausted", PROGRESSING)
    b = node.status("b")
    assert (b.state, b.message) == ("STOPPED", "ResourcesExhausted: 4480 MiB needed, 2688 MiB left")
    assert node.status("a").state == "RUNNING"
    # Stopping a in the same pass frees its memory before b's start is admitted.
    assert (await node.converge(vm("a", "STOPPED", memory_mib=4096), vm("b", memory_mib=4096))).state == CONVERGED
    assert node.status("b").state == "RUNNING"


async def test_a_resume_is_not_admitted_again_and_holds_count(tmp_path: Path) -> None:
    node = Node(tmp_path, total_mib=8 * GIB, holds=[2 * GIB * 1024 * 1024])
    await node.converge(vm("a", "PAUSED", memory_mib=4096))
    node.memory = HostMemory(4096)  # even a host with less: the paused VM's memory is already committed
    assert (await node.converge(vm("a", memory_mib=4096))).state == CONVERGED
    node.memory = HostMemory(8 * GIB)
    result = await node.converge(vm("a", memory_mib=4096), vm("b", memory_mib=1024))
    assert "ResourcesExhausted: 1312 MiB needed, 640 MiB left" in result.message  # 7168 - 4480 - 2048


async def test_the_running_and_paused_vms_commitment_is_what_holds_must_leave(node: Node) -> None:
    node.runtime.add_foreign("theirs", "RUNNING", memory_mib=8192)  # not bc's: not counted (reference)
    await node.converge(vm("a", memory_mib=1024), vm("b", "PAUSED", memory_mib=2048), vm("c", "STOPPED"))
    assert node.conv.committed_mib() == (1024 + 32 + 256) + (2048 + 64 + 256)


async def test_an_unreadable_host_starts_without_admission(tmp_path: Path) -> None:
    node = Node(tmp_path, total_mib=1)
    node.memory = None
    assert (await node.converge(vm("a", memory_mib=4096))).state == CONVERGED


async def test_domains_outlive_the_converger(tmp_path: Path) -> None:
    node = Node(tmp_path)
    await node.converge(vm("a"))
    again = FakeRuntime(tmp_path / "fake-instances.json")
    assert [(d.id, d.state, d.managed) for d in await again.list()] == [("a", "RUNNING", True)]


async def test_a_runtime_that_cannot_list_changes_nothing_and_keeps_the_section_progressing(node: Node) -> None:
    await node.converge(vm("a"))
    shown = list(node.conv.statuses)

    async def broken() -> list[object]:
        raise RuntimeFailure("cannot list /var/lib/bc/instances: Permission denied")

    node.runtime.list = broken  # type: ignore[method-assign,assignment]
    result = await node.converge(vm("a", "STOPPED"), vm("b"))
    assert (result.reported_state, result.reason) == (PROGRESSING, "RuntimeUnavailable")
    assert result.message == "runtime qemu: cannot list /var/lib/bc/instances: Permission denied"
    assert node.conv.statuses == shown and not node.conv.complete
    assert node.runtime.domain("a").state == "RUNNING" and node.runtime.domain("b") is None  # type: ignore[union-attr]
