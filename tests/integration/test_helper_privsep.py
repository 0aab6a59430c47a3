"""Privilege separation for real: `bc helper` as root in a subprocess, the agent's side as an unprivileged user.

The test creates a user (`useradd`; userdel at the end), starts `bc helper --allow-uid <it>` as root with its
root dir in a fresh temp dir, and runs the agent-side code as that user (`setpriv`): the real devices
converger on the helper-backed seams, then direct writes and forbidden requests. It shows (1) a hold's CDI
file lands through the helper where the user could not write it itself, (2) the user cannot write the CDI
directory or the sshd files directly, (3) a request with a path, a foreign slice name or a sysctl outside the
allowlist, and any request from another uid, is refused. Commands the helper would run (systemctl for the
hold's slice) are recorded by `--fake-commands`, not run: the test machine's systemd is not the test's.

The self-update and XID tests give the helper a root-owned A/B install (`<root>/opt/bc`), root's list of
release roots and a FIFO as its kernel log (`<root>/dev/kmsg`): the user stages releases it cannot write
into the install dir itself, the helper swaps in only the one whose signature and digest hold (a tampered
one is refused with a `helper:` sentence) and rolls it back, and XID lines the test writes to the kernel log,
which the user cannot open, reach the user's `HelperXids` through the helper's stream.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.helper.client import HelperClient, HelperRefused
from agent.upgrade.slots import install, read_disk
from bc.pki import releases
from tests.helper_process import helper_listening
from tests.system_user import User, as_user, system_user, traversable_dir, why_not

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@pytest.fixture
def user() -> Iterator[User]:
    with system_user("bct") as u:
        yield u


@pytest.fixture
def box() -> Iterator[Path]:
    with traversable_dir("bc-privsep-") as d:
        yield d


@dataclass
class Helper:
    socket: Path
    root: Path
    commands: Path


@pytest.fixture
async def helper(user: User, box: Path) -> AsyncIterator[Helper]:
    h = Helper(box / "run" / "helper.sock", box / "root", box / "commands.jsonl")
    h.root.mkdir(mode=0o755)
    async with helper_listening(
        "--socket", str(h.socket), "--allow-uid", str(user.uid), "--root", str(h.root),
        "--fake-commands", str(h.commands),
    ):  # fmt: skip
        yield h


AGENT = r"""
import asyncio, json, sys
from pathlib import Path
from agent.converge.devices import DevicesConverger
from agent.helper.client import HelperClient, HelperError
from agent.helper.wiring import helper_seams
from agent.hw.fake import FakeHardware
from agent.offload import to_thread
from bc.protocol.pb import common_pb2, spec_pb2

sock, data, root = map(Path, sys.argv[1:4])
out = {}

def attempt(key, fn):
    try:
        fn()
        out[key] = "written"
    except PermissionError as e:
        out[key] = f"PermissionError: {e.strerror}"

async def main():
    hw = FakeHardware("hgx-h100-8", "node-a")
    seams = await helper_seams(sock, hw, data, root=Path("/"), offload=to_thread)
    devices = DevicesConverger(seams.layout.cdi_dir, seams.layout.env_dir, hw, "node-a",
                               slices=seams.slices, files=seams.files)
    a = spec_pb2.DeviceAssignment(allocation_id="a1", reservation_id="r1", binding=spec_pb2.BINDING_HOLD,
        devices=[spec_pb2.DeviceRef(device_class="gpu", atom_id=hw.inventory().gpus[0].uuid)],
        limits=spec_pb2.ResourceLimits(cpus="0-1"))
    result = await devices.converge(spec_pb2.DevicesSection(assignments=[a]), 1)
    out["bind"] = [common_pb2.SectionState.Name(result.state), result.message]
    d = seams.layout.ssh_dir
    dropin = f"TrustedUserCAKeys {d}/ca.pub\nAuthorizedPrincipalsFile {d}/principals/%u\nRevokedKeys {d}/revoked.krl\n"
    await seams.client.call("sshd.write", file="dropin", data=dropin)
    attempt("direct_cdi", lambda: (seams.layout.cdi_dir / "bc-evil.json").write_text("{}"))
    attempt("direct_cdi_overwrite", lambda: (seams.layout.cdi_dir / "bc-a1.json").write_text("{}"))
    attempt("direct_sshd", lambda: (d / "ca.pub").write_text("ssh-ed25519 AAAA attacker\n"))
    attempt("direct_sshd_dropin", lambda: (d / "sshd.conf").write_text("PermitRootLogin yes\n"))
    client = HelperClient(sock)
    refusals = {
        "path": ("file.write", dict(kind="cdi", allocation_id="a2", data="{}", path="/etc/shadow")),
        "foreign_slice": ("slice.apply", dict(slice="sshd.service", limits={})),
        "sysctl": ("host.file.write", dict(file="sysctl", data="kernel.modprobe = /tmp/x\n")),
    }
    for key, (op, args) in refusals.items():
        try:
            await client.call(op, **args)
            out[key] = "done"
        except HelperError as e:
            out[key] = str(e)

asyncio.run(main())
print(json.dumps(out))
"""


async def test_an_unprivileged_agent_does_its_root_work_only_through_the_helper(
    user: User, box: Path, helper: Helper
) -> None:
    data = box / "agent"
    data.mkdir()
    os.chown(data, user.uid, user.gid)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(data),
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    argv = as_user(user.uid, gid=user.gid)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        sys.executable,
        "-c",
        AGENT,
        str(helper.socket),
        str(data),
        str(helper.root),
        cwd=str(data),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    out = json.loads(stdout.decode().splitlines()[-1])

    # (1) The hold landed, through the helper, as root's file in root's directory.
    assert out["bind"] == ["CONVERGED", ""], out
    cdi = helper.root / "etc/cdi/bc-a1.json"
    assert json.loads(cdi.read_text())["annotations"]["bc.dev/allocation-id"] == "a1"
    assert (cdi.stat().st_uid, cdi.parent.stat().st_uid) == (0, 0)
    recorded = [json.loads(line) for line in helper.commands.read_text().splitlines()]
    assert ["systemctl", "start", "bc-alloc-a1.slice"] in recorded
    # (2) The user could write none of it itself.
    for key in ("direct_cdi", "direct_cdi_overwrite", "direct_sshd", "direct_sshd_dropin"):
        assert out[key] == "PermissionError: Permission denied", (key, out[key])
    assert not (helper.root / "etc/cdi/bc-evil.json").exists()
    assert "PermitRootLogin" not in (helper.root / "etc/ssh/bc/sshd.conf").read_text()
    # (3) What is outside the table is refused, each with its reason.
    assert out["path"] == "helper: refused: file.write takes no path"
    assert out["foreign_slice"].startswith("helper: refused: slice.apply: slice 'sshd.service' is not a hold's slice")
    assert out["sysctl"].startswith("helper: refused: host.file.write: the drop-in sets sysctl kernel.modprobe")


async def test_a_peer_of_another_uid_is_refused_before_any_request(helper: Helper) -> None:
    # This process is root, not the node's user: the helper serves only the uid it was given.
    with pytest.raises(HelperRefused, match=r"^helper: refused: uid 0 may not use this helper$"):
        await HelperClient(helper.socket).call("file.write", kind="cdi", allocation_id="a9", data="{}")
    assert not (helper.root / "etc/cdi").exists()


UPDATER = r"""
import asyncio, base64, json, os, sys
from pathlib import Path
from agent.helper.client import HelperClient
from agent.helper.node_ops import HelperSlots, HelperXids
from agent.hw.nvml import KmsgXids
from agent.upgrade import swap_rules as sr
from agent.upgrade.slots import SlotsRefused
from bc.pki import releases

sock, data, root = map(Path, sys.argv[1:4])
spec = json.loads(sys.argv[4])
install_dir, out = root / "opt/bc", {}

def attempt(key, fn):
    try:
        fn()
        out[key] = "written"
    except PermissionError as e:
        out[key] = f"PermissionError: {e.strerror}"

async def main():
    client = HelperClient(sock)
    slots = HelperSlots(client, install_dir, data / "upgrade", lambda: [])
    attempt("direct_slot", lambda: (install_dir / "bc.b").write_bytes(b"#!/bin/sh\nid\n"))
    attempt("direct_link", lambda: (install_dir / "current.new").symlink_to("bc.b"))
    attempt("direct_record", lambda: (install_dir / "upgrade.json").write_text("{}"))
    attempt("direct_kmsg", lambda: os.close(os.open(root / "dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)))
    rel, signature = releases.Release(**spec["release"]), base64.b64decode(spec["signature"])
    body = base64.b64decode(spec["binary"])
    plan = sr.Plan("cmd-1", rel.version, rel.sequence, 1e12, rel.name)
    disk = await slots.read()
    for case, staged in (("tampered", body.replace(b"echo", b"curl")), ("good", body)):
        disk = await slots.take(disk, sr.Step.STAGE, plan)
        slots.partial_path(disk).write_bytes(staged)  # what the agent downloaded and checked, then changed or not
        try:
            disk = await slots.place(disk, plan, rel, signature)
            out[case] = "placed"
        except SlotsRefused as e:
            out[case] = str(e)
    for step in (sr.Step.ARM, sr.Step.SWITCH):
        disk = await slots.take(disk, step, plan)
    out["switched"] = os.readlink(install_dir / "current")
    for step in (sr.Step.DISARM, sr.Step.SWITCH_BACK, sr.Step.FAIL):
        disk = await slots.take(disk, step)
    out["rolled_back"] = [os.readlink(install_dir / "current"), disk.record.state]

    xids = HelperXids(client, fallback=KmsgXids(root / "dev/kmsg"))
    stopped = asyncio.Event()
    follower = asyncio.create_task(xids.run(stopped))
    async with asyncio.timeout(60):
        await xids.following.wait()
        print("following", flush=True)  # the test writes to the kernel log now
        while sum(map(len, (xids.by_pci() or {}).values())) < 2:
            await xids.changed.wait()
            xids.changed.clear()
    stopped.set()
    follower.cancel()
    out["xids"] = {":".join(f"{p:x}" for p in k): v for k, v in sorted((xids.by_pci() or {}).items())}

asyncio.run(main())
print(json.dumps(out), flush=True)
"""


def _public_pem(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


async def test_the_unprivileged_agents_release_is_swapped_in_by_the_helper_only_when_it_verifies(
    user: User, box: Path, helper: Helper
) -> None:
    install_dir = helper.root / "opt/bc"
    install(install_dir, b"#!/bin/sh\necho 'bc 1.0.0'\n", version="1.0.0")  # root's, as a package leaves it
    key = ed25519.Ed25519PrivateKey.generate()
    roots = helper.root / "etc/bc/release-roots.pem"
    roots.parent.mkdir(parents=True)
    roots.write_bytes(_public_pem(key))
    os.chmod(roots, 0o644)
    kmsg = helper.root / "dev/kmsg"
    kmsg.parent.mkdir()
    os.mkfifo(kmsg, 0o600)  # root's, as /dev/kmsg is under kernel.dmesg_restrict = 1
    binary = b"#!/bin/sh\necho 'bc 1.1.0'\n"
    rel = releases.Release("bc", "1.1.0", 1, releases.host_platform(), hashlib.sha256(binary).hexdigest(), len(binary))
    spec = {
        "release": dataclasses.asdict(rel),
        "signature": base64.b64encode(releases.sign(key, rel)).decode(),
        "binary": base64.b64encode(binary).decode(),
    }
    data = box / "agent"
    data.mkdir()
    os.chown(data, user.uid, user.gid)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(data), "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        *as_user(user.uid, gid=user.gid),
        sys.executable,
        "-c",
        UPDATER,
        str(helper.socket),
        str(data),
        str(helper.root),
        json.dumps(spec),
        cwd=str(data),
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    async with asyncio.timeout(120):
        line = await proc.stdout.readline()
        assert line == b"following\n", (line, await proc.stderr.read())
        fd = os.open(kmsg, os.O_WRONLY | os.O_NONBLOCK)  # the helper holds the FIFO open
        try:
            os.write(
                fd,
                b"6,40,1000000,-;usb 1-1: new high-speed USB device number 2\n"
                b"4,41,2000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"
                b"4,42,3000000,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE (double bit error) ECC error\n",
            )
        finally:
            os.close(fd)
        stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    out = json.loads(stdout.decode().splitlines()[-1])

    # The user can change nothing of the install dir, nor read the kernel log, itself.
    for key_ in ("direct_slot", "direct_link", "direct_record", "direct_kmsg"):
        assert out[key_] == "PermissionError: Permission denied", (key_, out[key_])
    # The tampered bytes were refused by the helper's own check; the signed ones were placed, swapped, rolled back.
    assert out["tampered"].startswith("helper: refused: update.install: the staged file is 26 bytes with sha256 ")
    assert out["good"] == "placed"
    assert out["switched"] == "bc.b"
    assert out["rolled_back"] == ["bc.a", "failed"]
    assert (install_dir / "bc.b").read_bytes() == binary
    assert ((install_dir / "bc.b").stat().st_uid, (install_dir / "upgrade.json").stat().st_uid) == (0, 0)
    assert read_disk(install_dir).record.failed_versions == ("1.1.0",)
    # The XIDs crossed, and the USB line did not.
    assert out["xids"] == {
        "0:18:0": [{"xid": 79, "message": "pid=1, GPU has fallen off the bus.", "uptime_s": 2.0}],
        "0:3b:0": [{"xid": 48, "message": "DBE (double bit error) ECC error", "uptime_s": 3.0}],
    }
