"""The helper's update and kmsg operations over a real unix socket, with the agent's side of each seam (same uid).

`HelperSlots` stages a release in chunks and the helper places it only when
root's list of release roots vouches for it and the bytes are the release's;
swap and roll-back are the helper's steps on its own install dir. The kernel
log is a FIFO under the helper's root: what is written there reaches the
stream as XID records, and nothing else does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent.helper import ops
from agent.helper.client import HelperClient, HelperRefused
from agent.helper.node_ops import HelperSlots, HelperXids
from agent.helper.ops import Layout
from agent.helper.server import HelperServer
from agent.helper.update_ops import MAX_CHUNK
from agent.helper.wiring import helper_seams
from agent.hw.fake import FakeHardware
from agent.hw.nvml import KmsgXids, NvmlHardware
from agent.offload import to_thread
from agent.upgrade import swap_rules as sr
from agent.upgrade.slots import SlotsRefused, SlotsUnavailable, install, read_disk
from bc.pki import releases
from bc.protocol.pb import common_pb2

ROOT_KEY = ed25519.Ed25519PrivateKey.generate()
ENDORSED_KEY = ed25519.Ed25519PrivateKey.generate()


def pem(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass
class Rig:
    tmp: Path
    layout: Layout
    client: HelperClient
    slots: HelperSlots
    helper: HelperServer


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    layout = Layout(tmp_path / "root")
    install(layout.install_dir, b"#!/bin/sh\necho 'bc 1.0.0'\n", version="1.0.0")
    layout.release_roots.parent.mkdir(parents=True)
    layout.release_roots.write_bytes(b"# the fleet's release root\n" + pem(ROOT_KEY))
    chain = [(releases.public_bytes(ENDORSED_KEY), releases.endorse(ROOT_KEY, releases.public_bytes(ENDORSED_KEY)))]
    helper = HelperServer(layout, os.getuid())
    server = await helper.start(tmp_path / "h.sock")
    client = HelperClient(tmp_path / "h.sock")
    slots = HelperSlots(client, layout.install_dir, tmp_path / "data", lambda: chain)
    async with server:
        yield Rig(tmp_path, layout, client, slots, helper)
        server.close()
        await helper.close_streams()
    await server.wait_closed()


def release_of(data: bytes, version: str = "1.1.0", sequence: int = 1) -> releases.Release:
    digest = hashlib.sha256(data).hexdigest()
    return releases.Release("bc", version, sequence, releases.host_platform(), digest, len(data))


async def stage(rig: Rig, data: bytes, rel: releases.Release, signer: ed25519.Ed25519PrivateKey) -> sr.Disk:
    """What the controller does before it swaps: STAGE, the download into the agent's dir, PLACE."""
    plan = sr.Plan("cmd-1", rel.version, rel.sequence, 1e9, rel.name)
    disk = await rig.slots.take(await rig.slots.read(), sr.Step.STAGE, plan)
    rig.slots.partial_path(disk).write_bytes(data)
    return await rig.slots.place(disk, plan, rel, releases.sign(signer, rel))


async def test_a_release_staged_in_chunks_is_verified_placed_swapped_and_rolled_back(rig: Rig) -> None:
    data = random.Random(1).randbytes(2 * MAX_CHUNK + 12_345)  # three update.stage calls
    rel = release_of(data)
    disk = await stage(rig, data, rel, ENDORSED_KEY)  # a key root endorsed, as the agent's bundle carries it
    install_dir = rig.layout.install_dir
    assert (install_dir / "bc.b").read_bytes() == data
    assert stat.S_IMODE((install_dir / "bc.b").stat().st_mode) == 0o755
    assert not list(install_dir.glob("*.partial")) and not list((rig.tmp / "data").iterdir())
    assert disk.record.slots["b"] == sr.Installed("1.1.0", 1, "bc") and disk.current == "a"

    plan = sr.Plan("cmd-1", "ignored", 99, 1234.0)  # ARM arms the placed slot, whatever the plan says
    for step in (sr.Step.ARM, sr.Step.SWITCH):
        disk = await rig.slots.take(disk, step, plan)
    assert os.readlink(install_dir / "current") == "bc.b"
    on_disk = read_disk(install_dir)
    assert (on_disk.record.state, on_disk.record.version, on_disk.record.sequence) == ("pending", "1.1.0", 1)
    assert on_disk.record.deadline == 1234.0 and on_disk == disk

    for step in (sr.Step.DISARM, sr.Step.SWITCH_BACK, sr.Step.FAIL):
        disk = await rig.slots.take(disk, step)
    assert os.readlink(install_dir / "current") == "bc.a"
    assert read_disk(install_dir).record.failed_versions == ("1.1.0",)
    with pytest.raises(SlotsRefused, match=r"^helper: refused: update.step: slot b: .*\(failed-before\)"):
        await rig.slots.take(disk, sr.Step.ARM, plan)  # what failed is never armed again


async def test_a_tampered_release_is_refused_with_the_helpers_sentence_and_nothing_is_left_staged(rig: Rig) -> None:
    data = b"#!/bin/sh\necho 'bc 1.1.0'\n"
    before = read_disk(rig.layout.install_dir)
    rel = release_of(data)
    plan = sr.Plan("cmd-1", rel.version, rel.sequence, 1e9, rel.name)
    disk = await rig.slots.take(before, sr.Step.STAGE, plan)
    rig.slots.partial_path(disk).write_bytes(data.replace(b"echo", b"curl"))  # changed after the agent's check
    with pytest.raises(SlotsRefused, match=r"^helper: refused: update.install: the staged file is .* not the release"):
        await rig.slots.place(disk, plan, rel, releases.sign(ROOT_KEY, rel))
    with pytest.raises(SlotsRefused, match=r"does not verify under the helper's release roots \(1 in its list\)"):
        await stage(rig, data, rel, ed25519.Ed25519PrivateKey.generate())  # a key only the agent's bundle names
    assert read_disk(rig.layout.install_dir) == before
    assert sorted(p.name for p in rig.layout.install_dir.iterdir()) == ["bc.a", "current", "upgrade.json"]


async def test_without_roots_list_or_with_one_others_may_write_nothing_is_installed(rig: Rig) -> None:
    data = b"x" * 100
    rig.layout.release_roots.chmod(0o666)
    with pytest.raises(SlotsRefused, match=r"release-roots.pem must be a file of uid \d+ that no one else may write"):
        await stage(rig, data, release_of(data), ROOT_KEY)
    rig.layout.release_roots.unlink()
    with pytest.raises(SlotsRefused, match=r"release-roots.pem does not exist: the helper installs only releases"):
        await stage(rig, data, release_of(data), ROOT_KEY)
    assert "b" not in read_disk(rig.layout.install_dir).slots


async def test_a_helper_that_is_down_leaves_the_install_as_it_was(rig: Rig, tmp_path: Path) -> None:
    down = HelperSlots(HelperClient(tmp_path / "none.sock"), rig.layout.install_dir, tmp_path / "d2", list)
    with pytest.raises(SlotsUnavailable, match=r"^helper: cannot reach"):
        await down.take(await down.read(), sr.Step.STAGE, sr.Plan("", "1.1.0", 1, 0.0))


async def test_xid_records_written_to_the_kernel_log_reach_the_stream_and_nothing_else_does(rig: Rig) -> None:
    fifo = rig.layout.kmsg
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    stream = rig.client.stream("kmsg.follow", after_seq=1)
    assert await anext(stream) == {"following": str(fifo)}
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the helper holds it open: a writer does not block
    try:
        os.write(
            fd,
            b"6,1,100,-;NVRM: Xid (PCI:0000:18:00): 79, an old one the agent has\n"
            b"6,2,200,-;usb 1-1: new device\n"
            b"4,3,300,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"
            b"4,4,400,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE (double bit error) " + b"x" * 4000 + b"\n",
        )
        first, second = await anext(stream), await anext(stream)
    finally:
        os.close(fd)
        await stream.aclose()
    assert first == {
        "seq": 3,
        "pci": "0000:18:00",
        "xid": 79,
        "text": "pid=1, GPU has fallen off the bus.",
        "uptime_s": 0.0,
    }
    assert (second["seq"], second["pci"], second["xid"], len(second["text"])) == (4, "0000:3b:00", 48, 200)


async def test_a_kernel_log_that_is_a_plain_file_is_refused(rig: Rig) -> None:
    rig.layout.kmsg.parent.mkdir(parents=True)
    rig.layout.kmsg.write_text("NVRM: Xid (PCI:0000:18:00): 79, x\n")
    with pytest.raises(HelperRefused, match=r"^helper: kmsg.follow failed: .* is neither the kernel log"):
        await anext(rig.client.stream("kmsg.follow", after_seq=-1))


async def test_an_unprivileged_nvml_node_takes_its_xids_from_the_helpers_stream(rig: Rig) -> None:
    rig.layout.kmsg.parent.mkdir(parents=True)
    os.mkfifo(rig.layout.kmsg)
    nvml = NvmlHardware(kmsg_path=rig.tmp / "no-kmsg")  # what it would read itself: nothing, here
    seams = await helper_seams(rig.client.socket_path, nvml, rig.tmp / "data", root=Path("/"), offload=to_thread)
    assert seams.xids is not None and nvml.xids is seams.xids
    assert nvml.xids.by_pci() is None  # not following yet: unknown, not "none"
    stopped = asyncio.Event()
    follower = asyncio.create_task(seams.xids.run(stopped))
    try:
        async with asyncio.timeout(30):
            await seams.xids.following.wait()
            assert nvml.xids.by_pci() == {}
            fd = os.open(rig.layout.kmsg, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"4,9,1500000,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")
            os.close(fd)
            await seams.xids.changed.wait()
    finally:
        stopped.set()
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    assert nvml.xids.by_pci() == {
        (0, 0x18, 0): [{"xid": 79, "message": "GPU has fallen off the bus.", "uptime_s": 1.5}]
    }


async def test_a_helper_without_kmsg_follow_leaves_the_direct_read(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(ops.TABLE, "kmsg.follow")  # an older helper's table
    direct = rig.tmp / "kmsg"
    direct.write_text("6,1,2,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE\n")
    xids = HelperXids(rig.client, fallback=KmsgXids(direct))
    await xids.run(asyncio.Event())  # returns: nothing to follow
    assert xids.refused is not None and "'kmsg.follow' is not in the helper's table" in xids.refused
    assert xids.by_pci() == {(0, 0x3B, 0): [{"xid": 48, "message": "DBE", "uptime_s": 0.0}]}


async def test_at_most_four_streams_follow_the_kernel_log_at_once(rig: Rig) -> None:
    rig.layout.kmsg.parent.mkdir(parents=True)
    os.mkfifo(rig.layout.kmsg)
    streams = [rig.client.stream("kmsg.follow", after_seq=-1) for _ in range(5)]
    try:
        for s in streams[:4]:
            assert "following" in await anext(s)
        with pytest.raises(HelperRefused, match=r"^helper: refused: kmsg.follow: 4 streams are open already$"):
            await anext(streams[4])
        await streams[0].aclose()  # the agent closes one: its place is free again once the helper sees it go
        async with asyncio.timeout(10):
            while len(rig.helper.streams) > 3:
                await asyncio.sleep(0)
        again = rig.client.stream("kmsg.follow", after_seq=-1)
        streams.append(again)
        assert "following" in await anext(again)
    finally:
        for s in streams:
            await s.aclose()


async def test_self_update_goes_through_the_helper_only_from_the_helpers_install_dir(rig: Rig) -> None:
    hw = FakeHardware("hgx-h100-8", "node-a")
    seams = await helper_seams(rig.client.socket_path, hw, rig.tmp / "data", root=Path("/"), offload=to_thread)
    assert seams.xids is None  # the fake backend makes its own XIDs
    bundle = common_pb2.TrustBundle(release_keys=[releases.public_bytes(ENDORSED_KEY)])
    assert seams.install_slots(rig.tmp / "elsewhere/opt/bc", lambda: bundle) is None
    slots = seams.install_slots(rig.layout.install_dir, lambda: bundle)
    assert slots is not None and slots.dir == rig.layout.install_dir and slots.keys() == [(bundle.release_keys[0], b"")]
