"""The instances converger with network rules: loaded (real nft, in a private namespace) before any start;
a policy that cannot be expressed, or rules that do not load, fail the instance and stop it if it runs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, FAILED
from agent.instances import qemu_argv
from agent.instances.admission import HostMemory
from agent.instances.fake import FakeRuntime
from agent.instances.net.guard import InstanceNetwork
from agent.instances.net.names import tap_name
from agent.instances.net.ruleset import HostAddresses
from agent.instances.runtime import DomainConfig, NicConfig
from agent.offload import inline
from bc.protocol.pb import common_pb2, spec_pb2
from tests.instance_parts import instance
from tests.netns import NetNs, private_netns

pytestmark = pytest.mark.wall_clock  # real nft processes

NIC = spec_pb2.InstanceNic(bridge="br0", mac="52:54:00:00:00:01", addresses=["10.0.0.5/24"])


async def host(bridges: Iterable[str]) -> HostAddresses:
    return HostAddresses(("10.0.0.1",))


class CheckingRuntime(FakeRuntime):
    """The fake runtime, which at every start asks the namespace's nft whether the instance's taps are named
    in the loaded rules: the rules must exist before the guest does."""

    def __init__(self, ns: NetNs, path: Path) -> None:
        super().__init__(path)
        self.ns = ns
        self.ruled_at_start: dict[str, bool] = {}

    async def start(self, instance_id: str, *, paused: bool, user_data: Path | None = None) -> None:
        ruleset = self.ns.run("nft", "list", "ruleset").stdout
        self.ruled_at_start[instance_id] = tap_name(instance_id, 0) in ruleset
        await super().start(instance_id, paused=paused, user_data=user_data)


class Node:
    def __init__(self, tmp: Path, ns: NetNs | None) -> None:
        boot = tmp / "instance-boot"
        boot.mkdir()
        (boot / "vmlinuz").write_bytes(b"kernel")
        self.runtime: FakeRuntime = CheckingRuntime(ns, tmp / "fake.json") if ns else FakeRuntime(tmp / "fake.json")
        self.network = InstanceNetwork(nft_binary=str(ns.nft), host_addresses=host) if ns else None
        self.conv = InstancesConverger({"qemu": self.runtime}, boot, self._memory, list, inline, network=self.network)
        self.generation = 0

    async def _memory(self) -> HostMemory | None:
        return HostMemory(64 * 1024)

    async def converge(self, *instances: spec_pb2.Instance) -> tuple[str, str]:
        self.generation += 1
        r = await self.conv.converge(spec_pb2.InstancesSection(instances=instances), self.generation)
        return r.state, r.reason

    def status(self, iid: str) -> common_pb2.InstanceStatus:
        (found,) = [s for s in self.conv.statuses if s.id == iid]
        return found


def vm(iid: str, policy: str = "", nics: Iterable[spec_pb2.InstanceNic] = (), **kw: object) -> spec_pb2.Instance:
    return instance(iid, network_policy=policy, nics=list(nics), **kw)


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[NetNs]:
    with private_netns(tmp_path) as n:
        yield n


async def test_rules_are_loaded_before_the_guest_starts(tmp_path: Path, ns: NetNs) -> None:
    node = Node(tmp_path, ns)
    assert await node.converge(vm("web", "PRIVATE", [NIC], ssh_from_host_only=True)) == (CONVERGED, "")
    assert node.status("web").state == "RUNNING"
    assert isinstance(node.runtime, CheckingRuntime) and node.runtime.ruled_at_start == {"web": True}
    assert f'oifname "{tap_name("web", 0)}" tcp dport 22 drop' in ns.run("nft", "list", "ruleset").stdout


async def test_rules_that_do_not_load_stop_and_fail_the_instances_with_nics_only(tmp_path: Path, ns: NetNs) -> None:
    node = Node(tmp_path, ns)
    spec = (vm("web", nics=[NIC]), vm("plain"))
    await node.converge(*spec)
    assert node.status("web").state == "RUNNING" and node.status("plain").state == "RUNNING"
    broken = tmp_path / "nft-refuses"
    broken.write_text('#!/bin/sh\necho "Error: Could not process rule: Operation not supported" >&2\nexit 1\n')
    broken.chmod(0o755)
    assert node.network is not None
    node.network.nft_binary = str(broken)
    node.network.loaded = None  # as after a restart of the agent: the pass must load again
    assert await node.converge(*spec) == (FAILED, "InstanceFailed")
    web = node.status("web")
    assert web.state == "ERROR" and web.message.startswith("its network rules did not load: nft refused the rules")
    assert ("stop", "web") in node.runtime.calls
    assert node.status("plain").state == "RUNNING"
    node.network.nft_binary = str(ns.nft)
    assert await node.converge(*spec) == (CONVERGED, "")
    assert node.status("web").state == "RUNNING"


async def test_a_running_instance_whose_policy_cannot_be_expressed_is_stopped(tmp_path: Path, ns: NetNs) -> None:
    node = Node(tmp_path, ns)
    await node.converge(vm("web", nics=[NIC]))
    assert await node.converge(vm("web", "NONE", [spec_pb2.InstanceNic(bridge="br0")])) == (FAILED, "InstanceFailed")
    web = node.status("web")
    assert web.state == "ERROR" and "a policy that cannot be expressed" in web.message
    assert node.runtime.domain("web").state == "STOPPED"  # type: ignore[union-attr]


async def test_a_deleted_instance_keeps_its_guard_until_its_domain_is_gone(tmp_path: Path, ns: NetNs) -> None:
    node = Node(tmp_path, ns)
    await node.converge(vm("web", nics=[NIC]))
    node.runtime.fail("web", "delete", "busy")
    await node.converge(vm("web", nics=[NIC], state="DELETED"))
    assert tap_name("web", 0) in ns.run("nft", "list", "ruleset").stdout
    await node.converge(vm("web", nics=[NIC], state="DELETED"))
    await node.converge(vm("web", nics=[NIC], state="DELETED"))
    assert tap_name("web", 0) not in ns.run("nft", "list", "ruleset").stdout


async def test_without_rules_only_confined_instances_fail(tmp_path: Path) -> None:
    node = Node(tmp_path, None)
    assert await node.converge(
        vm("open", nics=[NIC]),
        vm("shut", "NONE", [NIC.__class__(bridge="br1", mac="52:54:00:00:00:02", addresses=["10.0.1.5/24"])]),
    ) == (FAILED, "InstanceFailed")
    assert node.status("open").state == "RUNNING"
    assert node.status("shut").state == "ERROR" and "cannot be enforced" in node.status("shut").message


def test_qemu_gets_each_nic_on_its_tap() -> None:
    config = DomainConfig(
        "web", 1, 256, None, None, "", nics=(NicConfig("bc0123456789abc", "br0", "52:54:00:00:00:01"),)
    )
    assert qemu_argv.nics(config) == [
        "-netdev",
        "tap,id=n0,ifname=bc0123456789abc,script=no,downscript=no",
        "-device",
        "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01",
    ]
