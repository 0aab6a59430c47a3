"""Tenant images and volumes through the `instances` converger (fake runtime; real https, qemu-img, files).

A real https server on 127.0.0.1 under a real CA serves the images: a download, a digest mismatch, an
http:// URL, a stalled server abandoned and tried again, a qcow2 naming a backing file; then the converger
waits on a download (PROGRESSING ImagePending), boots from an overlay on the verified base, keeps one writer
per volume, attaches and detaches volumes of a running domain, refuses a shrink and destroys an unlisted
volume. The guest side (qemu itself) is tests/integration/test_instances_qemu_disks.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from agent.converge.instance_disks import InstanceDisks
from agent.converge.instances import InstancesConverger
from agent.converge.run import CONVERGED, FAILED, PROGRESSING
from agent.instances import images as img_mod
from agent.instances.admission import HostMemory
from agent.instances.fake import FakeRuntime
from agent.instances.images import ImageStore
from agent.instances.overlay import Overlays
from agent.instances.volumes import VolumeStore
from agent.offload import to_thread
from agent.upgrade.download import StallGuard
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets, p256_key
from bc.protocol.pb import spec_pb2
from bc.seams.clock import LoopClock, SystemClock

Handler = Callable[[str, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(scope="module")
def pki() -> tuple[bytes, bytes, bytes]:
    ca = CertificateAuthority.create(SystemClock(), random.Random(1), SystemSecrets())
    key = p256_key(SystemSecrets())
    cert = ca.issue_server_cert(["127.0.0.1"], key)
    return ca.ca_pem, keys.cert_to_pem(cert) + ca.ca_pem, keys.key_to_pem(key)


class Server:
    """https://127.0.0.1:PORT/<name> serves `files[name]`; `stall` names ones that send 100 bytes and hang."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.stall: set[str] = set()
        self.requests: list[str] = []
        self.release = asyncio.Event()
        self.port = 0

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.port}/{name}"

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
            name = head.split(b" ")[1].decode().lstrip("/")
            self.requests.append(name)
            data = self.files.get(name)
            if data is None:
                w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            elif name in self.stall:
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data[:100])
                await w.drain()
                await self.release.wait()
            else:
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
            await w.drain()
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()


@pytest.fixture
async def server(pki: tuple[bytes, bytes, bytes], tmp_path: Path) -> AsyncIterator[Server]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    (tmp_path / "c.pem").write_bytes(pki[1])
    (tmp_path / "k.pem").write_bytes(pki[2])
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    s = Server()
    srv = await asyncio.start_server(s.handle, "127.0.0.1", 0, ssl=ctx)
    s.port = int(srv.sockets[0].getsockname()[1])
    yield s
    s.release.set()
    srv.close()


def qcow2_bytes(tmp: Path, *args: str) -> bytes:
    path = tmp / f"made-{len(list(tmp.glob('made-*')))}.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", *args, str(path), "8M"], check=True)
    return path.read_bytes()


def image(server: Server, name: str, data: bytes, fmt: str = "qcow2", sha: str | None = None) -> spec_pb2.TenantImage:
    server.files[name] = data
    return spec_pb2.TenantImage(
        name=name, url=server.url(name), sha256=sha or hashlib.sha256(data).hexdigest(), format=fmt
    )


class Node:
    def __init__(self, tmp: Path, ca_pem: bytes, **store: object) -> None:
        self.data = tmp / "d"
        (self.data / "instance-boot").mkdir(parents=True)
        self.changed = asyncio.Event()
        self.images = ImageStore(
            self.data / "images",
            to_thread,
            LoopClock(),
            ca_pem=ca_pem,
            on_change=self.changed.set,
            **store,  # type: ignore[arg-type]
        )
        self.overlays = Overlays(self.data / "instances", to_thread)
        self.volumes = VolumeStore(self.data / "volumes", to_thread, min_reserve=0)
        self.disks = InstanceDisks(self.images, self.overlays, self.volumes)
        self.runtime = FakeRuntime()
        self.conv = InstancesConverger(
            {"qemu": self.runtime}, self.data / "instance-boot", self.memory, list, to_thread, disks=self.disks
        )

    async def memory(self) -> HostMemory | None:
        return HostMemory(64 * 1024)

    async def downloaded(self) -> None:
        async with asyncio.timeout(30):
            await self.changed.wait()
        self.changed.clear()


def vm(iid: str, image_name: str = "", **kw: object) -> spec_pb2.Instance:
    return spec_pb2.Instance(id=iid, runtime="qemu", vcpus=1, memory_mib=64, image=image_name, **kw)  # type: ignore[arg-type]


async def test_an_image_downloads_once_into_the_cache_and_is_checked_again_before_use(
    server: Server, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    node = Node(tmp_path, pki[0])
    img = image(server, "base", qcow2_bytes(tmp_path))
    assert (await node.images.want(img)).state == img_mod.WAITING
    await node.downloaded()
    st = await node.images.want(img)
    assert st.state == img_mod.READY and st.path == node.data / "images" / f"{img.sha256}.qcow2"
    assert os.stat(st.path).st_mode & 0o777 == 0o644 and os.stat(node.data / "images").st_mode & 0o777 == 0o700
    assert await node.images.verify(img) == 8 << 20
    assert server.requests == ["base"] and [p.name for p in (node.data / "images").iterdir()] == [st.path.name]
    with st.path.open("r+b") as f:  # changed on disk after its download: never booted, fetched again
        f.seek(1 << 16)
        f.write(b"evil")
    with pytest.raises(img_mod.ImageError, match="changed on disk since its download"):
        await node.images.verify(img)
    assert not st.path.exists()


async def test_a_mismatch_a_backing_file_and_http_are_refused_and_a_stall_is_abandoned(
    server: Server, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    node = Node(tmp_path, pki[0], guard=StallGuard(min_bytes=64 * 1024, window_s=0.3), retry_s=0.0)
    bad = image(server, "bad", qcow2_bytes(tmp_path), sha="0" * 64)
    await node.images.want(bad)
    await node.downloaded()
    st = node.images._failures[f"{bad.sha256}.qcow2"]
    assert (
        st.fatal
        and st.message
        == f"image bad: its download's SHA-256 is {hashlib.sha256(server.files['bad']).hexdigest()},"
        f" not the spec's {'0' * 64}"
    )
    backed = image(server, "backed", qcow2_bytes(tmp_path, "-u", "-b", "/etc/shadow", "-F", "raw"))
    await node.images.want(backed)
    await node.downloaded()
    assert node.images._failures[f"{backed.sha256}.qcow2"].message == "image backed names a backing file: refused"
    stalled = image(server, "stalled", b"x" * (1 << 20), fmt="raw")
    server.stall.add("stalled")
    await node.images.want(stalled)
    await node.downloaded()
    failure = node.images._failures[f"{stalled.sha256}.raw"]
    assert not failure.fatal and "the transfer stalled" in failure.message and "tried again in 0 s" in failure.message
    server.stall.clear()  # retried (retry_s 0): now it comes whole
    assert (await node.images.want(stalled)).state == img_mod.WAITING
    await node.downloaded()
    assert (await node.images.want(stalled)).state == img_mod.READY
    assert sorted(p.name for p in (node.data / "images").iterdir()) == [f"{stalled.sha256}.raw"]  # no temp left
    # the node refuses an http:// image itself (the server's rules refuse it first)
    plain = spec_pb2.TenantImage(name="plain", url=f"http://127.0.0.1:{server.port}/x", sha256="1" * 64, format="raw")
    res = await node.conv.converge(spec_pb2.InstancesSection(instances=[vm("a", "plain")], images=[plain]), 1)
    assert res.state == FAILED
    assert node.conv.statuses[0].message.startswith("image: the spec's image plain:.url 'http://")
    assert "images are fetched over https only" in node.conv.statuses[0].message


async def test_the_converger_waits_on_the_download_then_boots_an_overlay_with_one_writer_per_volume(
    server: Server, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    node = Node(tmp_path, pki[0])
    img = image(server, "base", qcow2_bytes(tmp_path))
    vols = [
        spec_pb2.Volume(id="data", serial="data-1", size_bytes=1 << 20),
        spec_pb2.Volume(id="logs", serial="logs", size_bytes=1 << 20),
    ]
    a = vm("a", "base", disk_size_bytes=16 << 20, volumes=[spec_pb2.VolumeAttachment(volume="data")])
    b = vm("b", "base", volumes=[spec_pb2.VolumeAttachment(volume="data", read_only=True)])

    def section(*instances: spec_pb2.Instance, volumes: list[spec_pb2.Volume] = vols) -> spec_pb2.InstancesSection:
        return spec_pb2.InstancesSection(instances=instances, images=[img], volumes=volumes)

    res = await node.conv.converge(section(a), 1)
    assert (res.state, res.reason) == (PROGRESSING, "ImagePending")
    assert node.conv.statuses[0].message == "ImagePending: image base is downloading"
    assert node.runtime.domain("a") is None  # not even defined while it waits
    assert (node.data / "volumes" / "data.raw").stat().st_size == 1 << 20  # volumes come first
    await node.downloaded()
    res = await node.conv.converge(section(a, b), 2)
    assert res.state == FAILED
    sa, sb = node.conv.statuses
    assert (sa.state, list(sa.volumes), sa.image_sha256) == ("RUNNING", ["data"], img.sha256)
    assert (sb.state, sb.message) == (
        "ERROR",
        "start: volume data is open read-write in instance a: one writer at a time",
    )
    disk = node.data / "instances" / "a" / "disk.qcow2"
    info = json.loads(
        subprocess.run(["qemu-img", "info", "--output=json", "-U", str(disk)], capture_output=True, check=True).stdout
    )
    assert info["virtual-size"] == 16 << 20 and info["backing-filename"] == str(node.images.path(img))
    assert info["backing-filename-format"] == "qcow2"
    # a running domain: a volume attached and one detached as the spec changes
    a2 = vm("a", "base", disk_size_bytes=16 << 20, volumes=[spec_pb2.VolumeAttachment(volume="logs")])
    assert (await node.conv.converge(section(a2), 3)).state == CONVERGED
    assert node.runtime.domain("a").volumes == ("logs",)  # type: ignore[union-attr]
    assert node.runtime.calls[-2:] == [("detach", "a"), ("attach", "a")]
    grown = [vols[0], spec_pb2.Volume(id="logs", serial="logs", size_bytes=2 << 20)]  # resized live
    assert (await node.conv.converge(section(a2, volumes=grown), 3)).state == CONVERGED
    assert node.runtime.resized == {("a", "logs"): 2 << 20}
    assert (node.data / "volumes" / "logs.raw").stat().st_size == 2 << 20
    vols[1] = grown[1]
    # data is no longer listed and no domain has it open: destroyed after the pass
    assert (await node.conv.converge(section(a2, volumes=[vols[1]]), 4)).state == CONVERGED
    assert not (node.data / "volumes" / "data.raw").exists() and not (node.data / "volumes" / "data.json").exists()
    # the storage the status report carries
    assert node.disks.storage is not None and node.disks.storage.committed_bytes == 2 << 20
    # a shrink: the volume keeps its size and the instance that attaches it says why
    small = [spec_pb2.Volume(id="logs", serial="logs", size_bytes=512)]
    stopped = vm(
        "a", "base", state="STOPPED", disk_size_bytes=16 << 20, volumes=[spec_pb2.VolumeAttachment(volume="logs")]
    )
    await node.conv.converge(section(stopped, volumes=vols[1:]), 5)
    res = await node.conv.converge(
        section(
            vm("a", "base", disk_size_bytes=16 << 20, volumes=[spec_pb2.VolumeAttachment(volume="logs")]), volumes=small
        ),
        6,
    )
    assert res.state == FAILED
    assert (
        node.conv.statuses[0].message
        == "start: volume logs is 2097152 bytes and the spec says 512: a volume is never shrunk"
    )
    # a smaller root disk fails the instance too
    res = await node.conv.converge(section(vm("a", "base", disk_size_bytes=8 << 20)), 7)
    assert (
        node.conv.statuses[0].message
        == "disk: disk_size_bytes 8388608 is smaller than its disk's 16777216 bytes: a disk never shrinks"
    )
    # deleting the instance takes its overlay
    assert (await node.conv.converge(section(), 8)).state == CONVERGED
    assert not disk.exists()


async def test_a_volume_handed_over_in_one_pass_and_a_failed_stop_keeps_it(tmp_path: Path) -> None:
    node = Node(tmp_path, b"")
    vols = [spec_pb2.Volume(id="data", serial="data", size_bytes=1 << 20)]
    att = [spec_pb2.VolumeAttachment(volume="data")]
    boot = tmp_path / "d" / "instance-boot"
    (boot / "vmlinuz").write_bytes(b"k")

    def inst(iid: str, state: str) -> spec_pb2.Instance:
        return spec_pb2.Instance(
            id=iid, runtime="qemu", vcpus=1, memory_mib=64, kernel="vmlinuz", state=state, volumes=att
        )

    def section(*instances: spec_pb2.Instance) -> spec_pb2.InstancesSection:
        return spec_pb2.InstancesSection(instances=instances, volumes=vols)

    assert (await node.conv.converge(section(inst("a", "RUNNING"), inst("b", "STOPPED")), 1)).state == CONVERGED
    # b is listed first now, but a still has it open: b is refused, a keeps running
    res = await node.conv.converge(section(inst("b", "RUNNING"), inst("a", "RUNNING")), 2)
    assert res.state == FAILED
    by_id = {s.id: s for s in node.conv.statuses}
    assert by_id["b"].message == "start: volume data is open read-write in instance a: one writer at a time"
    assert (by_id["a"].state, list(by_id["a"].volumes)) == ("RUNNING", ["data"])
    # a stop that fails keeps the volume open: no second writer gets in
    node.runtime.fail("a", "stop", "qemu would not stop")
    res = await node.conv.converge(section(inst("a", "STOPPED"), inst("b", "RUNNING")), 3)
    by_id = {s.id: s for s in node.conv.statuses}
    assert by_id["a"].message == "stop: qemu would not stop"
    assert by_id["b"].message == "start: volume data is open read-write in instance a: one writer at a time"
    # handed over in one pass: a's stop runs before b's start
    assert (await node.conv.converge(section(inst("a", "STOPPED"), inst("b", "RUNNING")), 4)).state == CONVERGED
    by_id = {s.id: s for s in node.conv.statuses}
    assert (by_id["a"].state, list(by_id["a"].volumes)) == ("STOPPED", [])
    assert (by_id["b"].state, list(by_id["b"].volumes)) == ("RUNNING", ["data"])
    # a read-only reader beside a writer is refused too
    ro = spec_pb2.Instance(
        id="c", runtime="qemu", vcpus=1, memory_mib=64, kernel="vmlinuz",
        volumes=[spec_pb2.VolumeAttachment(volume="data", read_only=True)],
    )  # fmt: skip
    await node.conv.converge(section(inst("b", "RUNNING"), ro), 5)
    assert node.conv.statuses[1].message == "start: volume data is open read-write in instance b: one writer at a time"
    # the volume unlisted while b runs: refused by the rules, and the file is never destroyed under it
    res = await node.conv.converge(spec_pb2.InstancesSection(instances=[inst("b", "RUNNING")]), 6)
    assert (tmp_path / "d" / "volumes" / "data.raw").exists()
    assert (await node.conv.converge(spec_pb2.InstancesSection(), 7)).state == CONVERGED
    assert not (tmp_path / "d" / "volumes" / "data.raw").exists()  # its instance deleted in the same pass


async def test_a_cached_image_nothing_names_and_no_disk_was_made_from_is_removed_after_the_pass(
    server: Server, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    node = Node(tmp_path, pki[0])
    cache = node.data / "images"
    old = image(server, "old", b"o" * 65536, fmt="raw")
    new = image(server, "new", b"n" * 65536, fmt="raw")

    def section(img: spec_pb2.TenantImage, iid: str) -> spec_pb2.InstancesSection:
        return spec_pb2.InstancesSection(instances=[vm(iid, img.name)], images=[img])

    def cached() -> list[str]:
        return sorted(p.name for p in cache.iterdir())

    await node.conv.converge(section(old, "a"), 1)
    await node.downloaded()
    assert (await node.conv.converge(section(old, "a"), 1)).state == CONVERGED
    stale = f".{'e' * 64}.raw.part"  # a download a crash cut short
    for junk in (stale, "notes.txt"):
        (cache / junk).write_bytes(b"x")
    # Instance a goes with its spec, and with it the disk made from `old`; `new` is downloading.
    assert (await node.conv.converge(section(new, "b"), 2)).state == PROGRESSING
    downloading = {f".{new.sha256}.raw.part", f"{new.sha256}.raw"}  # its temp file, or itself if done already
    # `old` and the stale temp file removed; the download's own file kept, and a file of another name left alone
    assert set(cached()) - downloading == {"notes.txt"}
    await node.downloaded()
    assert (await node.conv.converge(section(new, "b"), 2)).state == CONVERGED
    assert cached() == [f"{new.sha256}.raw", "notes.txt"]

    # An image a disk here was made from stays while that disk does, listed or not.
    kept, other = "a" * 64, "b" * 64
    for sha in (kept, other):
        (cache / f"{sha}.raw").write_bytes(b"r")
    disk = node.data / "instances" / "z"
    disk.mkdir(parents=True)
    (disk / "disk.qcow2").write_bytes(b"")
    (disk / "disk.json").write_text(json.dumps({"base": str(cache / f"{kept}.raw"), "format": "raw", "sha256": kept}))
    await node.conv.converge(section(new, "b"), 3)
    assert cached() == [f"{kept}.raw", f"{new.sha256}.raw", "notes.txt"]
    (disk / "disk.json").write_text("{")  # a record that cannot be read: nothing may go
    (cache / f"{other}.raw").write_bytes(b"r")
    await node.conv.converge(section(new, "b"), 4)
    assert f"{other}.raw" in cached() and f"{kept}.raw" in cached()
    (disk / "disk.json").unlink()
    (disk / "disk.qcow2").unlink()
    await node.conv.converge(section(new, "b"), 5)
    assert cached() == [f"{new.sha256}.raw", "notes.txt"]
