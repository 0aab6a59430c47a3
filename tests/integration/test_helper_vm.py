"""`vm.vfio` and `vm.unvfio` through a real `bc helper` (a root subprocess on a socket in a temp dir), asked by
a process of the node's uid, over the fake VFIO tree (`--fake-sysfs`: `<root>/sys`, group nodes as regular
files in `<root>/dev/vfio`). Root reads the instance's `vm.json` under `--node-data-dir` itself: the request
names only the instance. A "running VMM" is a real process of that VMM uid (`setpriv … sleep`)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.instances.confine import VMM_UID_BASE, is_vmm_uid
from agent.instances.fake_vfio import FakeVfio, add_device, build_tree
from agent.instances.qemu_argv import volume_node
from agent.instances.runtime import DomainConfig, config_record
from tests.helper_process import ask_as, helper_listening
from tests.qemu_guest import console_says, initrd, kernel, kill_qemus
from tests.system_user import as_user, traversable_dir, why_not

REPO = Path(__file__).resolve().parents[2]
NODE_UID = 61_917  # the node's user: no passwd entry is needed for a uid
BUS = ["00000000:18:00.0", "00000000:2A:00.0"]
GPU0, AUDIO0, GPU1 = "0000:18:00.0", "0000:18:00.1", "0000:2a:00.0"
A, B = VMM_UID_BASE + 5, VMM_UID_BASE + 6

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@dataclass
class Helper:
    socket: Path
    root: Path
    node: Path
    vfio: FakeVfio

    def record(self, iid: str, uid: object, gpus: tuple[str, ...], **extra: object) -> Path:
        d = self.node / "instances" / iid
        d.mkdir(parents=True, exist_ok=True)
        doc = {**config_record(DomainConfig(iid, 1, 256, None, None, "", gpus=gpus)), "uid": uid, **extra}
        (d / "vm.json").write_text(json.dumps(doc))
        return d

    def node_of(self, group: str) -> tuple[int, int, int]:
        st = (self.root / "dev" / "vfio" / group).stat()
        return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)

    async def ask(self, *calls: tuple[str, str]) -> list[dict[str, object]]:
        """Each (op, instance) asked by a process of the node's uid, in order."""
        return await self.ask_with(*[(op, {"instance_id": iid}) for op, iid in calls])

    async def ask_with(self, *calls: tuple[str, dict[str, object]]) -> list[dict[str, object]]:
        """Each (op, arguments) asked by a process of the node's uid, in order."""
        return await ask_as(NODE_UID, self.socket, calls)


@pytest.fixture
def box() -> Iterator[Path]:
    with traversable_dir("bc-helper-vm-") as d:
        yield d


@pytest.fixture
async def helper(box: Path) -> AsyncIterator[Helper]:
    root, node = box / "root", box / "node"
    build_tree(root / "sys", BUS, nodes=root / "dev" / "vfio")
    (node / "instances").mkdir(parents=True)
    h = Helper(box / "run" / "helper.sock", root, node, FakeVfio(root / "sys", root / "dev" / "vfio"))
    async with helper_listening(
        "--socket", str(h.socket), "--allow-uid", str(NODE_UID), "--root", str(root),
        "--node-data-dir", str(node), "--fake-sysfs", "--fake-commands", str(box / "commands.jsonl"),
    ):  # fmt: skip
        yield h


@pytest.fixture
async def running_vmm() -> AsyncIterator[asyncio.subprocess.Process]:
    """A process of VMM uid A, as a confined qemu is."""
    proc = await asyncio.create_subprocess_exec(*as_user(A), "sleep", "120")
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_vm_vfio_hands_the_group_to_the_vmm_user_and_vm_unvfio_gives_it_back(
    helper: Helper, running_vmm: asyncio.subprocess.Process
) -> None:
    helper.record("a", A, (GPU0,))
    helper.record("b", B, (GPU0,))
    (given,) = await helper.ask(("vm.vfio", "a"))
    assert given == {"ok": {"uid": A, "groups": ["0"], "moved": [GPU0, AUDIO0]}}
    assert helper.vfio.on_vfio() == [GPU0, AUDIO0] and helper.node_of("0") == (A, A, 0o600)
    assert helper.node_of("1") == (0, 0, 0o600)  # the other GPU's group is untouched
    # while A's VMM runs, no other instance's record takes its group, and it is not taken back
    second, back_early = await helper.ask(("vm.vfio", "b"), ("vm.unvfio", "a"))
    assert second == {"error": f"helper: refused: vm.vfio: VFIO group 0 is held by the running VMM user {A}"}
    assert back_early == {"error": f"helper: refused: vm.unvfio: VFIO group 0 is held by the running VMM user {A}"}
    assert helper.node_of("0") == (A, A, 0o600) and helper.vfio.on_vfio() == [GPU0, AUDIO0]
    running_vmm.kill()
    await running_vmm.wait()
    (back,) = await helper.ask(("vm.unvfio", "a"))
    assert back == {"ok": {"groups": ["0"], "stuck": []}}
    assert helper.node_of("0") == (0, 0, 0o600) and helper.vfio.on_vfio() == []
    assert (helper.vfio.driver(GPU0), helper.vfio.driver(AUDIO0)) == ("nvidia", "snd_hda_intel")


async def test_a_record_root_does_not_accept_is_refused_and_nothing_changes(helper: Helper) -> None:
    outside = helper.record("outside", A, (GPU0,), disk="/etc/shadow")
    helper.record("baduid", 1000, (GPU0,))
    linked = helper.record("linked", A, (GPU0,))
    (linked / "console.log").symlink_to("/etc/passwd")
    (helper.node / "instances" / "dirlink").symlink_to(outside)
    helper.record("notgpu", A, ("0000:00:1f.0",))
    nodes = helper.root / "dev" / "vfio"
    add_device(helper.root / "sys", "0000:00:1f.0", 7, "0x020000", "e1000e", vendor="0x8086", nodes=nodes)
    add_device(
        helper.root / "sys", "0000:29:00.0", 1, "0x020000", "e1000e", vendor="0x8086", nodes=nodes
    )  # GPU1's group
    helper.record("sharedgroup", A, (GPU1,))
    got = await helper.ask(
        *[("vm.vfio", i) for i in ("outside", "baduid", "linked", "dirlink", "notgpu", "sharedgroup", "none")],
        ("vm.vfio", "../etc"),
        ("vm.launch", "outside"),
        ("vm.launch", "linked"),
    )
    assert [g.get("error") for g in got] == [
        "helper: refused: vm.vfio: instance outside's record names its disk '/etc/shadow', outside "
        f"{helper.node / 'instances' / 'outside'}",
        "helper: refused: vm.vfio: instance baduid's record has VMM user '1000', outside bc's range",
        "helper: refused: vm.vfio: instance linked's directory holds a symlink, 'console.log'",
        "helper: refused: vm.vfio: instance dirlink's directory is a symlink or not a directory",
        "helper: refused: vm.vfio: 0000:00:1f.0 is not one of this host's GPUs (an NVIDIA display or 3D controller)",
        "helper: refused: vm.vfio: the IOMMU group of 0000:2a:00.0 also holds 0000:29:00.0 (class 0x020000),"
        " which is not a GPU's",
        "helper: refused: vm.vfio: instance none has no directory",
        "helper: refused: vm.vfio: instance_id '../etc' is not an instance id",
        "helper: refused: vm.launch: instance outside's record names its disk '/etc/shadow', outside "
        f"{helper.node / 'instances' / 'outside'}",
        "helper: refused: vm.launch: instance linked's directory holds a symlink, 'console.log'",
    ]
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755 and outside.stat().st_gid == 0  # no grant either
    assert helper.vfio.on_vfio() == [] and helper.node_of("0") == helper.node_of("1") == (0, 0, 0o600)
    assert helper.vfio.driver("0000:29:00.0") == "e1000e"


QMP = r"""
import asyncio, json, sys
from pathlib import Path
from agent.instances.qmp import QmpClient

async def main():
    async with await QmpClient.connect(Path(sys.argv[1]), 5.0) as q:
        print(json.dumps(await q.execute("query-status")))

asyncio.run(main())
"""
MARKER = "BC-HELPER-GUEST-UP"
INIT = f"""#!/bin/busybox sh
/bin/busybox echo {MARKER}
while true; do /bin/busybox sleep 5; done
"""


def ended(pid: int) -> bool:
    """Gone, or a zombie its parent (this container's init, since qemu daemonized) has not reaped."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


async def as_node(*argv: str) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = await asyncio.create_subprocess_exec(
        *as_user(NODE_UID), *argv, cwd="/", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_vm_launch_runs_root_s_qemu_as_the_vmm_user_and_vm_stop_ends_it(helper: Helper) -> None:
    """A real guest (TCG or KVM), launched by root from the record alone; the node reaches its QMP socket."""
    boot = helper.node / "instance-boot"
    boot.mkdir()
    vmlinuz = kernel()
    (boot / "vmlinuz").write_bytes(vmlinuz.read_bytes())
    (boot / "initrd").write_bytes(initrd(INIT, vmlinuz))
    for f in boot.iterdir():
        f.chmod(0o644)
    uid = VMM_UID_BASE + 7
    d = helper.node / "instances" / "g"
    d.mkdir(parents=True)
    doc = config_record(DomainConfig("g", 1, 256, boot / "vmlinuz", boot / "initrd", "console=ttyS0 quiet panic=-1"))
    (d / "vm.json").write_text(json.dumps({**doc, "uid": uid}))
    for p in (helper.node, helper.node / "instances", d, d / "vm.json"):  # the node's own, as it writes them
        os.chown(p, NODE_UID, NODE_UID)
        p.chmod(0o700 if p.is_dir() else 0o600)
    pid: object = None
    try:
        start = {"instance_id": "g", "accel": ["tcg"]}  # KVM boots no guest on these machines
        launched, again = await helper.ask_with(("vm.launch", start), ("vm.launch", start))
        pid = launched.get("ok", {}).get("pid")  # type: ignore[union-attr]
        assert isinstance(pid, int), launched
        assert again == {"error": f"helper: refused: vm.launch: VMM user {uid} of instance g runs a process already"}
        status = Path(f"/proc/{pid}/status").read_text()
        assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in status, status
        await console_says(d / "console.log", MARKER)
        info = d.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (NODE_UID, uid, 0o3770)
        assert json.loads(await as_node(sys.executable, "-c", QMP, str(d / "qmp.sock")))["status"] == "running"
        assert MARKER in await as_node("cat", str(d / "console.log"))  # the node reads its console
        (stopped, again_stopped) = await helper.ask_with(
            ("vm.stop", {"instance_id": "g"}), ("vm.stop", {"instance_id": "g"})
        )
        assert stopped == {"ok": {"killed": True, "groups": []}} and again_stopped == {
            "ok": {"killed": False, "groups": []}
        }
        assert ended(pid)
    finally:
        if isinstance(pid, int) and not ended(pid):
            os.kill(pid, 9)


AGENT = r"""
import asyncio, json, os, sys
from pathlib import Path
from agent.helper.client import HelperClient
from agent.helper.vm_client import HelperVmm
from agent.instances.qemu import QemuRuntime
from agent.instances.runtime import DomainConfig
from agent.offload import to_thread
from tests.qemu_guest import console_says

sock, marker = sys.argv[1], sys.argv[4]
instances, boot, user_data = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[5])

async def main():
    rt = QemuRuntime(instances, to_thread, accel=("tcg",), stop_grace_s=1.0, confine=False, use_systemd=False,
                     steps=HelperVmm(HelperClient(Path(sock))))
    await rt.define(DomainConfig("h", 1, 256, boot / "vmlinuz", boot / "initrd", "console=ttyS0 quiet panic=-1"))
    await rt.start("h", paused=False, user_data=user_data)
    out = {"listed": [[d.id, d.state] for d in await rt.list()]}
    st = user_data.stat()
    out["user_data"] = [st.st_uid, st.st_gid, st.st_mode & 0o777]
    await console_says(instances / "h" / "console.log", marker)
    pid = int((instances / "h" / "qemu.pid").read_text())
    out["uid"] = os.stat(f"/proc/{pid}").st_uid
    out["fw_cfg"] = f"file={user_data}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    out["record_uid"] = json.loads((instances / "h" / "vm.json").read_text())["uid"]
    await rt.stop("h")
    out["stopped"] = [[d.id, d.state] for d in await rt.list()]
    await rt.delete("h")
    out["gone"] = not (instances / "h").exists()
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_an_unprivileged_agent_s_qemu_runtime_starts_its_vmm_through_the_helper(helper: Helper) -> None:
    """The runtime as the node's user (QemuRuntime with HelperVmm): define, start (vm.launch), the guest up
    as its VMM user, stop over QMP, delete."""
    boot = helper.node / "instance-boot"
    boot.mkdir()
    vmlinuz = kernel()
    (boot / "vmlinuz").write_bytes(vmlinuz.read_bytes())
    (boot / "initrd").write_bytes(initrd(INIT, vmlinuz))
    for f in boot.iterdir():
        f.chmod(0o644)
    user_data = helper.root / "run" / "bc" / "user-data" / "h"  # the node unit's runtime directory
    user_data.parent.mkdir(parents=True)
    user_data.write_text("#cloud-config\n")
    for p in (helper.node, helper.node / "instances", user_data.parent.parent, user_data.parent, user_data):
        os.chown(p, NODE_UID, NODE_UID)
        p.chmod(0o700 if p.is_dir() else 0o600)
    try:
        out = json.loads(
            (
                await as_node(
                    sys.executable,
                    "-c",
                    AGENT,
                    str(helper.socket),
                    str(helper.node / "instances"),
                    str(boot),
                    MARKER,
                    str(user_data),
                )
            ).splitlines()[-1]
        )
    finally:
        kill_qemus(helper.node / "instances")
    assert out["listed"] == [["h", "RUNNING"]]
    assert out["uid"] == out["record_uid"] and is_vmm_uid(out["uid"])  # its own VMM user, not the node's
    assert out["user_data"] == [NODE_UID, out["uid"], 0o640] and out["fw_cfg"] is True  # its user data, read-only
    assert out["stopped"] == [["h", "STOPPED"]] and out["gone"] is True


async def test_a_launch_qemu_fails_gives_the_group_node_back(helper: Helper) -> None:
    """The fake tree's GPUs are no devices qemu can open: the launch fails after root took the group, and the
    node goes back to root at once (the devices stay on vfio-pci until vm.unvfio, as the node's detach asks)."""
    d = helper.record("f", A, (GPU0,))
    failed, back = await helper.ask_with(
        ("vm.launch", {"instance_id": "f", "accel": ["tcg"]}), ("vm.unvfio", {"instance_id": "f"})
    )
    error = str(failed.get("error"))
    assert error.startswith("helper: vm.launch failed: qemu did not start: ") and "vfio" in error, failed
    assert stat.S_IMODE(d.stat().st_mode) == 0o3770 and d.stat().st_gid == A  # granted, then qemu failed
    assert back == {"ok": {"groups": ["0"], "stuck": []}}
    assert helper.node_of("0") == (0, 0, 0o600) and helper.vfio.on_vfio() == []


RESTORE = r"""
import asyncio, json, os, sys
from pathlib import Path
from agent.helper.client import HelperClient
from agent.helper.vm_client import HelperVmm
from agent.instances.qemu import QemuRuntime
from agent.instances.qemu_snapshot import QemuSnapshots
from agent.instances.runtime import DomainConfig
from agent.instances.snapshot_meta import MEMORY
from agent.offload import to_thread
from tests.qemu_guest import console_says

sock, marker = sys.argv[1], sys.argv[4]
instances, boot, staging = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[5])

async def main():
    rt = QemuRuntime(instances, to_thread, accel=("tcg",), stop_grace_s=1.0, confine=False, use_systemd=False,
                     steps=HelperVmm(HelperClient(Path(sock))))
    snaps = QemuSnapshots(rt, migrate_s=60.0)
    await rt.define(DomainConfig("m", 1, 128, boot / "vmlinuz", boot / "initrd", "console=ttyS0 quiet panic=-1"))
    await rt.start("m", paused=False)
    await console_says(instances / "m" / "console.log", marker)
    captured = await snaps.capture("m", True, staging)
    await rt.stop("m")
    out = {"captured": captured.memory is not None and captured.memory.stat().st_size > 0}
    os.replace(captured.memory, instances / "m" / MEMORY)  # as a restore unpacks it
    await rt.start("m", paused=False)
    pid = int((instances / "m" / "qemu.pid").read_text())
    out["incoming"] = b"-incoming" in Path(f"/proc/{pid}/cmdline").read_bytes()
    out["uid"] = os.stat(f"/proc/{pid}").st_uid
    out["listed"] = [[d.id, d.state] for d in await rt.list()]
    out["state_left"] = (instances / "m" / MEMORY).exists()
    await rt.delete("m")
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_a_memory_restore_starts_through_the_helper(helper: Helper) -> None:
    """A memory snapshot of a guest started through vm.launch, restored as its next start: root starts qemu
    with `-incoming defer -S` (it finds the state in the instance's directory), the node feeds the state over
    QMP from the file it opened, and the guest runs on as its VMM user."""
    boot = helper.node / "instance-boot"
    boot.mkdir()
    vmlinuz = kernel()
    (boot / "vmlinuz").write_bytes(vmlinuz.read_bytes())
    (boot / "initrd").write_bytes(initrd(INIT, vmlinuz))
    for f in boot.iterdir():
        f.chmod(0o644)
    staging = helper.node / "staging"
    staging.mkdir()
    for p in (helper.node, helper.node / "instances", staging):
        os.chown(p, NODE_UID, NODE_UID)
        p.chmod(0o700)
    try:
        args = (str(helper.socket), str(helper.node / "instances"), str(boot), MARKER, str(staging))
        out = json.loads((await as_node(sys.executable, "-c", RESTORE, *args)).splitlines()[-1])
    finally:
        kill_qemus(helper.node / "instances")
    assert is_vmm_uid(out["uid"])  # the lowest free when it was defined: other tests' guests may hold the lowest
    assert out == {
        "captured": True,
        "incoming": True,
        "uid": out["uid"],
        "listed": [["m", "RUNNING"]],
        "state_left": False,
    }


async def test_vm_grant_volume_gives_a_live_attach_s_volume_to_the_running_vmm_s_group_and_back(
    helper: Helper, running_vmm: asyncio.subprocess.Process
) -> None:
    """A live attach under the helper: the node lists the volume in the record, root gives the running VMM's
    group that file (0660, or 0640 read-only) and, at the detach, back to the node's group (0600)."""
    vols = helper.node / "volumes"
    vols.mkdir()
    os.chown(helper.node / "instances", NODE_UID, NODE_UID)
    listed = []
    for vid, ro in (("rw1", False), ("ro1", True)):
        f = vols / f"{vid}.raw"
        f.write_bytes(b"\0" * 4096)
        os.chown(f, NODE_UID, NODE_UID)
        f.chmod(0o600)
        listed.append({"id": vid, "path": str(f), "serial": vid, "read_only": ro})
    helper.record("v", A, (), volumes=listed)
    helper.record("idle", B, (), volumes=listed)  # B runs nothing
    rw, ro, unlisted, idle = await helper.ask_with(
        ("vm.grant-volume", {"instance_id": "v", "volume_id": "rw1"}),
        ("vm.grant-volume", {"instance_id": "v", "volume_id": "ro1"}),
        ("vm.grant-volume", {"instance_id": "v", "volume_id": "other"}),
        ("vm.grant-volume", {"instance_id": "idle", "volume_id": "rw1"}),
    )
    assert rw == {"ok": {"gid": A, "mode": "0660"}} and ro == {"ok": {"gid": A, "mode": "0640"}}

    def owner(vid: str) -> tuple[int, int, int]:
        st = (vols / f"{vid}.raw").stat()
        return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)

    assert owner("rw1") == (NODE_UID, A, 0o660) and owner("ro1") == (NODE_UID, A, 0o640)  # still the node's
    assert unlisted == {"error": "helper: refused: vm.grant-volume: instance v's record lists no volume other"}
    assert idle == {
        "error": f"helper: refused: vm.grant-volume: instance idle's VMM user {B} runs no process: vm.launch grants"
        " its volumes"
    }
    assert owner("rw1") == (NODE_UID, A, 0o660)  # the refusal changed nothing
    (back,) = await helper.ask_with(("vm.revoke-volume", {"instance_id": "v", "volume_id": "rw1"}))
    assert back == {"ok": {"gid": NODE_UID, "mode": "0600"}} and owner("rw1") == (NODE_UID, NODE_UID, 0o600)


ATTACH = r"""
import asyncio, json, os, sys
from pathlib import Path
from agent.helper.client import HelperClient
from agent.helper.vm_client import HelperVmm
from agent.instances.qemu import QemuRuntime
from agent.instances.qmp import QmpClient
from agent.instances.runtime import DomainConfig, VolumeConfig
from agent.offload import to_thread
from tests.qemu_guest import console_says

sock, marker = sys.argv[1], sys.argv[4]
instances, boot, volume = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[5])

async def main():
    rt = QemuRuntime(instances, to_thread, accel=("tcg",), stop_grace_s=1.0, confine=False, use_systemd=False,
                     steps=HelperVmm(HelperClient(Path(sock))))
    await rt.define(DomainConfig("w", 1, 128, boot / "vmlinuz", boot / "initrd", "console=ttyS0 quiet panic=-1"))
    await rt.start("w", paused=False)
    await console_says(instances / "w" / "console.log", marker)
    await rt.attach_volume("w", VolumeConfig("v1", volume, "v1"))
    st = volume.stat()
    out = {"volume": [st.st_uid, st.st_gid, st.st_mode & 0o777]}
    async with await QmpClient.connect(instances / "w" / "qmp.sock", 5.0) as q:
        out["nodes"] = sorted(n.get("node-name", "") for n in await q.execute("query-named-block-nodes"))
    rec = json.loads((instances / "w" / "vm.json").read_text())
    out["record"] = [[v["id"] for v in rec["volumes"]], rec.get("uid")]
    await rt.delete("w")
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_a_live_volume_attach_through_the_helper_reaches_the_vmm(helper: Helper) -> None:
    """The qemu runtime as the node's user attaches a volume to a guest started through vm.launch: the record
    lists it, root gives the VMM's group the file (vm.grant-volume), and qemu, as the VMM's user, opens it."""
    boot = helper.node / "instance-boot"
    boot.mkdir()
    vmlinuz = kernel()
    (boot / "vmlinuz").write_bytes(vmlinuz.read_bytes())
    (boot / "initrd").write_bytes(initrd(INIT, vmlinuz))
    for f in boot.iterdir():
        f.chmod(0o644)
    volume = helper.node / "volumes" / "v1.raw"
    volume.parent.mkdir()
    volume.write_bytes(b"\0" * (1 << 20))
    for p in (helper.node, helper.node / "instances", volume.parent, volume):
        os.chown(p, NODE_UID, NODE_UID)
        p.chmod(0o700 if p.is_dir() else 0o600)
    try:
        args = (str(helper.socket), str(helper.node / "instances"), str(boot), MARKER, str(volume))
        out = json.loads((await as_node(sys.executable, "-c", ATTACH, *args)).splitlines()[-1])
    finally:
        kill_qemus(helper.node / "instances")
    uid = out["record"][1]
    assert is_vmm_uid(uid)
    assert out["volume"] == [NODE_UID, uid, 0o660]  # the node's file, the VMM's group
    assert volume_node("v1") in out["nodes"]  # qemu, as the VMM's user, opened it
    assert out["record"] == [["v1"], uid]  # listed, and the record keeps its VMM user
