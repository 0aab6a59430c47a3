"""agent.instances.net.guard: the rules loaded for a section, kept loaded by the 5-s guard, and the instances
they fail, with real nft in a private network namespace (tests/netns.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from agent.instances.net.guard import InstanceNetwork, failures
from agent.instances.net.ruleset import BRIDGE_TABLE, INET_TABLE, HostAddresses
from bc.protocol.pb import spec_pb2
from tests.netns import NetNs, private_netns

pytestmark = pytest.mark.wall_clock  # real nft processes: work the virtual-time loop cannot see

NIC = spec_pb2.InstanceNic(bridge="br0", mac="52:54:00:00:00:01", addresses=["10.0.0.5/24"])


def inst(
    iid: str, policy: str = "", nics: Iterable[spec_pb2.InstanceNic] = (NIC,), ssh: bool = False
) -> spec_pb2.Instance:
    return spec_pb2.Instance(id=iid, network_policy=policy, nics=list(nics), ssh_from_host_only=ssh)


async def host(bridges: Iterable[str]) -> HostAddresses:
    return HostAddresses(("10.0.0.1",), ("fe80::1",))


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[NetNs]:
    with private_netns(tmp_path) as n:
        yield n


def count(ns: NetNs, family: str, name: str) -> int:
    return ns.run("nft", "-j", "list", "table", family, name).stdout.count('{"rule":')


class Restored:
    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.event = asyncio.Event()

    async def __call__(self, body: dict[str, object]) -> None:
        self.bodies.append(body)
        self.event.set()


async def test_apply_loads_the_rules_and_the_guard_puts_a_flushed_table_back(ns: NetNs) -> None:
    restored = Restored()
    net = InstanceNetwork(nft_binary=str(ns.nft), host_addresses=host, on_restored=restored)
    assert await net.apply([inst("a", "PRIVATE")]) is None
    assert net.loaded is not None
    expected = net.loaded.counts[BRIDGE_TABLE]
    assert count(ns, *BRIDGE_TABLE) == expected
    assert not await net.check()  # intact: nothing to do
    ns.run("nft", "flush", "table", "bridge", "bc_instances")
    assert await net.check()
    assert count(ns, *BRIDGE_TABLE) == expected
    assert restored.bodies == [{"tables": [f"bridge bc_instances: 0/{expected}"]}]
    ns.run("nft", "flush", "ruleset")
    assert await net.check()
    assert count(ns, *INET_TABLE) == 4 and net.restores == 2
    assert "bridge bc_instances: missing" in str(restored.bodies[-1])


async def test_a_rule_someone_added_is_drift_too(ns: NetNs) -> None:
    net = InstanceNetwork(nft_binary=str(ns.nft), host_addresses=host)
    await net.apply([inst("a")])
    ns.run("nft", "add", "rule", "inet", "bc_taps", "input", "accept")
    assert await net.check()
    assert count(ns, *INET_TABLE) == 4


async def test_the_guard_loop_restores_on_its_own(ns: NetNs) -> None:
    restored = Restored()
    net = InstanceNetwork(nft_binary=str(ns.nft), host_addresses=host, on_restored=restored, interval_s=0.05)
    await net.apply([inst("a", ssh=True)])
    stopped = asyncio.Event()
    task = asyncio.create_task(net.run(stopped))
    try:
        ns.run("nft", "delete", "table", "arp", "bc_taps")
        async with asyncio.timeout(10):
            await restored.event.wait()
        assert count(ns, "arp", "bc_taps") == 2
    finally:
        stopped.set()
        await task


async def test_a_failed_restore_is_tried_again(ns: NetNs, tmp_path: Path) -> None:
    net = InstanceNetwork(nft_binary=str(ns.nft), host_addresses=host)
    await net.apply([inst("a")])
    ns.run("nft", "flush", "ruleset")
    broken = tmp_path / "nft-refuses"
    broken.write_text(f'#!/bin/sh\ncase "$*" in *-f*) echo "Error: refused" >&2; exit 1;; esac\nexec {ns.nft} "$@"\n')
    broken.chmod(0o755)
    net.nft_binary = str(broken)
    assert not await net.check() and not net.whole
    net.nft_binary = str(ns.nft)
    assert await net.check() and net.whole
    ns.run("nft", "flush", "ruleset")
    net.nft_binary = str(broken)
    assert not await net.check()
    net.nft_binary = str(ns.nft)
    assert await net.apply([inst("a")]) is None  # the same section, but the guard could not restore: loaded
    assert count(ns, *BRIDGE_TABLE) == net.loaded.counts[BRIDGE_TABLE]  # type: ignore[union-attr]


async def test_a_changed_section_reloads_and_the_same_one_does_not(ns: NetNs) -> None:
    net = InstanceNetwork(nft_binary=str(ns.nft), host_addresses=host)
    await net.apply([inst("a")])
    first = net.loaded
    await net.apply([inst("a")])
    assert net.loaded is first
    await net.apply([inst("a", "NONE")])
    assert (
        net.loaded is not first and "drop" in ns.run("nft", "list", "chain", "bridge", "bc_instances", "forward").stdout
    )


async def test_rules_that_do_not_load_fail_every_instance_with_nics_and_keep_the_old_ones(
    ns: NetNs, tmp_path: Path
) -> None:
    net = InstanceNetwork(nft_binary=str(ns.nft), host_addresses=host)
    await net.apply([inst("a")])
    before = ns.run("nft", "list", "ruleset").stdout
    broken = tmp_path / "nft-refuses"
    broken.write_text('#!/bin/sh\necho "Error: Could not process rule: No such file or directory" >&2\nexit 1\n')
    broken.chmod(0o755)
    net.nft_binary = str(broken)
    plain = spec_pb2.Instance(id="plain")
    got = await failures(net, [inst("a"), inst("b", "NONE"), plain])
    assert set(got) == {"a", "b"}
    why = "nft refused the rules: Error: Could not process rule: No such file or directory"
    assert got["a"] == f"its network rules did not load: {why}"
    assert ns.run("nft", "list", "ruleset").stdout == before


async def test_without_a_loader_only_confined_instances_fail() -> None:
    got = await failures(None, [inst("a"), inst("b", "PRIVATE"), inst("c", ssh=True)])
    assert set(got) == {"b", "c"} and "cannot be enforced" in got["b"]


async def test_nothing_is_loaded_until_an_instance_has_a_nic(ns: NetNs) -> None:
    net = InstanceNetwork(nft_binary=str(ns.nft), host_addresses=host)
    assert await net.apply([spec_pb2.Instance(id="plain")]) is None
    assert net.loaded is None and "bc_" not in ns.run("nft", "list", "ruleset").stdout
    await net.apply([inst("a")])
    await net.apply([spec_pb2.Instance(id="plain")])  # the NICs went: the tables stay, with no tap's rules
    assert net.loaded is not None and "bc_instances" in ns.run("nft", "list", "ruleset").stdout
    assert "52:54:00:00:00:01" not in ns.run("nft", "list", "ruleset").stdout
