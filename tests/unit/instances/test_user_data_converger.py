"""agent.converge.instances' user data: asked of the secret port before a start, a 0600 file, removed at stop."""

from __future__ import annotations

import stat
from pathlib import Path

from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, FAILED, PROGRESSING, SectionResult
from agent.converge.secret_port import SecretRefused
from agent.instances.admission import HostMemory
from agent.instances.fake import FakeRuntime
from agent.instances.user_data import UserDataFiles
from agent.offload import inline
from bc.protocol.pb import common_pb2, spec_pb2
from tests.instance_parts import SecretPort, instance


class Port(SecretPort):
    """The secret port, recording what the converger asks and releases."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str, int, str]] = []  # (name, section, generation, allocation id)
        self.released: list[str] = []

    async def get(self, name: str, section: str, generation: int, unit: str = "", allocation_id: str = "") -> bytes:
        assert unit == ""
        self.asked.append((name, section, generation, allocation_id))
        return await super().get(name, section, generation, unit, allocation_id)

    def release(self, section: str, unit: str = "") -> None:
        self.released.append(section)


class Node:
    def __init__(self, tmp_path: Path) -> None:
        boot = tmp_path / "instance-boot"
        boot.mkdir()
        (boot / "vmlinuz").write_bytes(b"kernel")
        self.runtime = FakeRuntime(tmp_path / "fake-instances.json")
        self.port = Port()
        self.files = UserDataFiles(tmp_path / "run" / "user-data", inline)
        self.conv = InstancesConverger(
            {"qemu": self.runtime}, boot, self._memory, list, inline, secrets=self.port, user_data=self.files
        )
        self.generation = 0

    async def _memory(self) -> HostMemory | None:
        return HostMemory(64 * 1024)

    async def converge(self, *instances: spec_pb2.Instance) -> SectionResult:
        self.generation += 1
        return await self.conv.converge(spec_pb2.InstancesSection(instances=instances), self.generation)

    def status(self, iid: str) -> common_pb2.InstanceStatus:
        (found,) = [s for s in self.conv.statuses if s.id == iid]
        return found


def vm(iid: str, state: str = "RUNNING", ref: str = "", allocation: str = "") -> spec_pb2.Instance:
    return instance(iid, state=state, user_data_secret_ref=ref, allocation_id=allocation)


async def test_the_user_data_reaches_the_start_as_a_0600_file_removed_at_stop_and_delete(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.port.values["ud"] = b"#cloud-config\npassword: hunter2\n"
    assert (await node.converge(vm("a", ref="ud"), vm("b"))).state == CONVERGED
    path, given = node.runtime.user_data["a"]
    assert given == b"#cloud-config\npassword: hunter2\n" and path == node.files.path("a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert "b" not in node.runtime.user_data and not node.files.path("b").exists()
    assert node.port.asked == [("ud", "instances", 1, "")]
    await node.converge(vm("a", ref="ud"), vm("d", ref="ud", allocation="alloc-1"))  # bound to its allocation
    assert node.port.asked[-1] == ("ud", "instances", 2, "alloc-1")
    assert b"hunter2" not in (tmp_path / "fake-instances.json").read_bytes()
    assert all("hunter2" not in s.message for s in node.conv.statuses)

    await node.converge(vm("a", "STOPPED", ref="ud"))
    assert not path.exists()
    await node.converge(vm("a", ref="ud"))
    assert path.exists()
    node.runtime.reboot()  # the guest is gone without a stop of bc's: the next pass finds it stopped
    await node.converge(vm("a", "STOPPED", ref="ud"))
    assert not path.exists()
    node.port.values["ud"] = b"rotated"  # a rotation reaches the guest at its next start
    await node.converge(vm("a", ref="ud"))
    assert node.runtime.user_data["a"][1] == b"rotated" and path.exists()
    await node.converge(vm("a", "DELETED", ref="ud"))
    assert not path.exists() and node.runtime.domain("a") is None
    await node.converge(vm("c", ref="ud"))
    assert node.port.released == []
    await node.converge()  # no spec names c any more: deleted, its file too, and the value held is dropped
    assert not node.files.path("c").exists() and node.port.released == ["instances"]


async def test_an_unavailable_broker_keeps_the_instance_stopped_and_the_section_progressing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = await node.converge(vm("a", ref="ud"), vm("b"))
    assert (result.reported_state, result.reason) == (PROGRESSING, "SecretUnavailable")
    assert node.status("a").state == "STOPPED" and node.status("a").message.startswith("SecretUnavailable: ")
    assert ("start", "a") not in node.runtime.calls and node.status("b").state == "RUNNING"
    node.port.values["ud"] = b"now"
    assert (await node.converge(vm("a", ref="ud"), vm("b"))).state == CONVERGED
    assert node.runtime.user_data["a"][1] == b"now"


async def test_a_refusal_fails_that_instance_only(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.port.values["ud"] = SecretRefused("out-of-scope", "the secret's scope does not admit this node")
    result = await node.converge(vm("a", ref="ud"), vm("b"))
    assert (result.state, result.reason) == (FAILED, "InstanceFailed") and result.terminal
    a = node.status("a")
    assert a.state == "ERROR" and a.message == (
        "user data 'ud' refused: out-of-scope: the secret's scope does not admit this node"
    )
    assert ("start", "a") not in node.runtime.calls and node.status("b").state == "RUNNING"
    assert not node.files.path("a").exists()


async def test_a_failed_start_leaves_no_file_and_an_agent_without_a_broker_fails_the_instance(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.port.values["ud"] = b"x"
    node.runtime.fail("a", "start", "qemu exited")
    assert (await node.converge(vm("a", ref="ud"))).state == FAILED
    assert not node.files.path("a").exists()
    node.conv.secrets = None
    await node.converge(vm("a", ref="ud"))
    assert "this agent has no secret broker" in node.status("a").message
