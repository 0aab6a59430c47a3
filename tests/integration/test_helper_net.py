"""`vm.taps`, `vm.untaps` and `vm.rules` through a real `bc helper` (root, in a private network namespace of
its own: `unshare -n`, so its bridges, taps and nftables tables live and die with it), asked by a process of
the node's uid. Root reads the instance's `vm.json` and the network record `instance-net.json` under
`--node-data-dir` itself; what it made is read back with `ip` and `nft` inside its namespace."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.helper.vm_net_rules import NET_RECORD, net_record
from agent.instances.confine import VMM_UID_BASE
from agent.instances.net.names import tap_name
from agent.instances.runtime import DomainConfig, NicConfig, config_record
from bc.protocol.pb import spec_pb2
from tests.helper_process import ask_as, helper_listening
from tests.system_user import as_user, traversable_dir, why_not

REPO = Path(__file__).resolve().parents[2]
NODE_UID = 61_918
A = VMM_UID_BASE + 7
MAC = "52:54:00:00:00:0a"


def _why_not() -> str | None:
    for tool in ("unshare", "nsenter", "nft", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return why_not()


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@dataclass
class NetHelper:
    socket: Path
    node: Path
    pid: int

    def inside(self, *argv: str) -> str:
        """A command run in the helper's network namespace: its stdout."""
        done = subprocess.run(["nsenter", "-t", str(self.pid), "-n", *argv], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def link(self, name: str) -> dict[str, object] | None:
        found = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-n", "ip", "-d", "-j", "link", "show", name], capture_output=True
        )
        return dict(json.loads(found.stdout)[0]) if found.returncode == 0 else None

    def record(self, iid: str, *bridges: str) -> list[str]:
        """The instance's vm.json with a NIC on each bridge (as the node defines it); its tap names."""
        d = self.node / "instances" / iid
        d.mkdir(parents=True, exist_ok=True)
        nics = tuple(NicConfig(tap_name(iid, i), b, MAC) for i, b in enumerate(bridges))
        doc = {**config_record(DomainConfig(iid, 1, 256, None, None, "", nics=nics)), "uid": A}
        (d / "vm.json").write_text(json.dumps(doc))
        return [n.tap for n in nics]

    def network(self, *instances: spec_pb2.Instance) -> None:
        """The network record, as the agent writes it each pass (agent.helper.vm_client.HelperNetwork)."""
        (self.node / NET_RECORD).write_text(json.dumps(net_record(instances)))

    async def ask(self, *calls: tuple[str, dict[str, object]]) -> list[dict[str, object]]:
        """Each (op, arguments) asked by a process of the node's uid, in order."""
        return await ask_as(NODE_UID, self.socket, calls)


def _instance(iid: str, bridge: str, mac: str, address: str) -> spec_pb2.Instance:
    inst = spec_pb2.Instance(id=iid, network_policy="NONE")
    inst.nics.add(bridge=bridge, mac=mac, addresses=[address])
    return inst


@pytest.fixture
def box() -> Iterator[Path]:
    with traversable_dir("bc-helper-net-") as d:
        yield d


@pytest.fixture
async def helper(box: Path) -> AsyncIterator[NetHelper]:
    node = box / "node"
    (node / "instances").mkdir(parents=True)
    async with helper_listening(
        "--socket", str(box / "run" / "helper.sock"),
        "--allow-uid", str(NODE_UID), "--root", str(box / "root"), "--node-data-dir", str(node),
        "--instance-bridge", "br0",
        prefix=("unshare", "-n"),
    ) as proc:  # fmt: skip
        h = NetHelper(box / "run" / "helper.sock", node, proc.pid)
        for br in ("br0", "br1"):
            h.inside("ip", "link", "add", br, "type", "bridge")
        yield h


def _rules(h: NetHelper) -> int:
    doc = json.loads(h.inside("nft", "-j", "list", "table", "bridge", "bc_instances"))
    return sum(1 for item in doc["nftables"] if "rule" in item)


async def test_vm_taps_makes_the_record_s_taps_for_its_vmm_user_once_root_loaded_their_rules(
    helper: NetHelper,
) -> None:
    (tap,) = helper.record("a", "br0")
    helper.network(_instance("a", "br0", MAC, "10.0.0.10/24"))
    (early,) = await helper.ask(("vm.taps", {"instance_id": "a"}))
    assert early == {
        "error": f"helper: refused: vm.taps: instance a's tap {tap} is in no rules root loaded (vm.rules first)"
    }
    assert helper.link(tap) is None  # no tap before its rules
    loaded, made = await helper.ask(("vm.rules", {"restore": False}), ("vm.taps", {"instance_id": "a"}))
    assert loaded["ok"]["loaded"] is True and loaded["ok"]["rules"] > 0  # type: ignore[index]
    rules = helper.inside("nft", "list", "table", "bridge", "bc_instances")
    assert f"pre_{tap}" in rules and "10.0.0.10" in rules and MAC in rules
    assert made == {"ok": {"taps": [tap]}}
    link = helper.link(tap)
    assert link is not None
    assert link["linkinfo"] == {**link["linkinfo"], "info_kind": "tun"}  # type: ignore[dict-item]
    assert link["linkinfo"]["info_data"]["user"] == A  # type: ignore[index]
    assert link["master"] == "br0" and "UP" in link["flags"]  # type: ignore[operator]
    (gone,) = await helper.ask(("vm.untaps", {"instance_id": "a"}))
    assert gone == {"ok": {"taps": [tap]}} and helper.link(tap) is None


async def test_a_bridge_not_given_to_the_helper_and_an_interface_that_is_not_a_tap_are_refused(
    helper: NetHelper,
) -> None:
    (tap_b,) = helper.record("b", "br1")  # br1 exists, but the helper was given br0 only
    (tap_c,) = helper.record("c", "br0")
    helper.inside("ip", "link", "add", tap_c, "type", "bridge")  # that name, but not a tap
    helper.network(
        _instance("b", "br1", MAC, "10.0.0.10/24"), _instance("c", "br0", "52:54:00:00:00:0c", "10.0.0.12/24")
    )
    _, refused, taken = await helper.ask(
        ("vm.rules", {"restore": False}), ("vm.taps", {"instance_id": "b"}), ("vm.taps", {"instance_id": "c"})
    )
    assert refused == {
        "error": "helper: refused: vm.taps: instance b's NIC 0: the bridge br1 is not one bc helper was given"
        " (--instance-bridge: br0)"
    }
    assert helper.link(tap_b) is None
    assert taken == {
        "error": f"helper: vm.taps failed: an interface named {tap_c} exists and is not a tap; it is left alone"
    }
    assert helper.link(tap_c)["linkinfo"]["info_kind"] == "bridge"  # type: ignore[index]
    (kept,) = await helper.ask(("vm.untaps", {"instance_id": "c"}))
    assert kept == {"ok": {"taps": [tap_c]}} and helper.link(tap_c) is not None  # never deletes what is not a tap


async def test_a_flushed_table_is_restored_and_reported(helper: NetHelper) -> None:
    helper.record("a", "br0")
    helper.network(_instance("a", "br0", MAC, "10.0.0.10/24"))
    loaded, quiet = await helper.ask(("vm.rules", {"restore": False}), ("vm.rules", {"restore": True}))
    assert quiet == {"ok": {"restored": False, "tables": []}}
    want = _rules(helper)
    assert loaded["ok"]["loaded"] is True and want > 0  # type: ignore[index]
    helper.inside("nft", "flush", "table", "bridge", "bc_instances")
    assert _rules(helper) == 0
    (restored,) = await helper.ask(("vm.rules", {"restore": True}))
    assert restored == {"ok": {"restored": True, "tables": [f"bridge bc_instances: 0/{want}"]}}
    assert _rules(helper) == want
    again, unchanged = await helper.ask(("vm.rules", {"restore": True}), ("vm.rules", {"restore": False}))
    assert again == {"ok": {"restored": False, "tables": []}} and unchanged["ok"]["loaded"] is False  # type: ignore[index]


async def test_a_network_record_root_refuses_loads_nothing(helper: NetHelper) -> None:
    (helper.node / NET_RECORD).write_text(
        json.dumps({"instances": [{"id": "a", "nics": [{"bridge": "br0", "mac": "", "addresses": ["1.2.3.4/24 }"]}]}]})
    )
    (refused,) = await helper.ask(("vm.rules", {"restore": False}))
    assert refused == {
        "error": "helper: refused: vm.rules: the network record's instance a.nics[0].addresses[0] '1.2.3.4/24 }'"
        " is not an address with a prefix length"
    }
    done = subprocess.run(
        ["nsenter", "-t", str(helper.pid), "-n", "nft", "list", "table", "bridge", "bc_instances"], capture_output=True
    )
    assert done.returncode != 0  # no table was made


AGENT = r"""
import asyncio, json, sys
from pathlib import Path
from agent.helper.client import HelperClient
from agent.helper.vm_client import HelperNetwork, HelperVmm
from agent.instances.net import guard
from agent.offload import to_thread
from bc.protocol.pb import spec_pb2

async def main():
    sock, data = Path(sys.argv[1]), Path(sys.argv[2])
    seen = []
    async def restored(body):
        seen.append(body)
    net = HelperNetwork(HelperClient(sock), data, to_thread, on_restored=restored)
    inst = spec_pb2.Instance(id="a", network_policy="NONE")
    inst.nics.add(bridge="br0", mac=sys.argv[3], addresses=["10.0.0.10/24"])
    failed = await guard.failures(net, [inst])
    await HelperVmm(net.client).taps("a")
    print(json.dumps({"failed": failed}), flush=True)
    sys.stdin.readline()  # the test flushes the table meanwhile
    print(json.dumps({"restored": await net.check(), "seen": seen, "restores": net.restores}), flush=True)

asyncio.run(main())
"""


async def test_an_unprivileged_agent_s_network_has_root_load_and_restore_its_rules(helper: NetHelper) -> None:
    """HelperNetwork as the converger and the guard use it, and HelperVmm's taps, run as the node's user: the
    pass writes the network record and root loads it; a flushed table is put back and journalled."""
    (tap,) = helper.record("a", "br0")
    os.chown(helper.node, NODE_UID, NODE_UID)  # the node's data dir, where it writes its network record
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = await asyncio.create_subprocess_exec(
        *as_user(NODE_UID), sys.executable, "-c", AGENT, str(helper.socket), str(helper.node), MAC,
        cwd="/", env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        async with asyncio.timeout(60):
            first = await proc.stdout.readline()
            assert json.loads(first) == {"failed": {}}, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
            assert helper.link(tap)["linkinfo"]["info_data"]["user"] == A  # type: ignore[index]
            want = _rules(helper)
            helper.inside("nft", "flush", "table", "bridge", "bc_instances")
            proc.stdin.write(b"go\n")
            second = json.loads(await proc.stdout.readline())
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert second == {"restored": True, "seen": [{"tables": [f"bridge bc_instances: 0/{want}"]}], "restores": 1}
    assert _rules(helper) == want
    assert json.loads((helper.node / NET_RECORD).read_text())["instances"][0]["id"] == "a"
