"""disk.wipe and deploy.image on a real disk: a loop device (a disk image file attached with `losetup`) or,
where loop devices are not available, the file itself (`mode` in each test's id says which), with the image
served by a real HTTP server on 127.0.0.1.

What is asserted is what an operator (or the next boot) sees: the bytes of the disk image file afterwards,
and the command's result and error code. A deploy that does not pass every step leaves the disk's ends
zeroed (no partition table a firmware would boot) and reports nothing deployed.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import any_pb2

from agent.hw.fake import FakeHardware
from agent.kinds import REGISTRY, KindContext, KindResult
from agent.ramdisk.machine import DISK_IN_USE, UNKNOWN_DISK
from bc.protocol.pb import kinds_pb2
from tests.http_server import serving
from tests.ramdisk_disks import Disk, disk_under_test, loop_devices_available, mount

MIB = 1 << 20
NO_LOOP = loop_devices_available()
MODES = [pytest.param("loop", marks=pytest.mark.skipif(bool(NO_LOOP), reason=NO_LOOP or "-")), "file"]
NEEDS_TOOLS = pytest.mark.skipif(
    not (shutil.which("sfdisk") and shutil.which("mkfs.ext4") and shutil.which("blkid")),
    reason="needs util-linux's sfdisk and blkid and e2fsprogs' mkfs.ext4 (.ci/run installs fdisk)",
)


@pytest.fixture(params=MODES)
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk]:
    with disk_under_test(request.param, tmp_path) as d:
        yield d


def context(tmp_path: Path, disk: Disk) -> KindContext:
    hw = FakeHardware("hgx-h100-8", "r1", state_dir=tmp_path / "data")
    return KindContext(
        node_id="r1", data_dir=tmp_path / "data", hw=hw, cdi_dir=tmp_path / "cdi", boot_id="b", machine=disk.tree
    )


async def run(kind: str, ctx: KindContext, request: Any) -> KindResult:
    payload = any_pb2.Any()
    payload.Pack(request)
    executor = REGISTRY[kind]
    return await executor.run(ctx, executor.parse(payload))


def content(disk: Disk, offset: int = 0, length: int = MIB, *, device: bool = False) -> bytes:
    """The disk's bytes as its backing file holds them (or, `device`, as the device shows them now, written
    back or not: a loop device's writes reach its file when the kernel flushes them)."""
    with (disk.path if device else disk.image).open("rb") as f:
        f.seek(offset)
        return f.read(length)


def all_zero(disk: Disk) -> bool:
    with disk.image.open("rb") as f:
        while block := f.read(4 * MIB):
            if block.count(0) != len(block):
                return False
    return True


# -- disk.wipe -----------------------------------------------------------------------------------


async def test_a_wipe_leaves_every_byte_zero_and_says_how(disk: Disk, tmp_path: Path) -> None:
    res = await run("disk.wipe", context(tmp_path, disk), kinds_pb2.DiskWipeRequest(disks=[disk.name]))
    assert res.ok, res
    [entry] = res.result["disks"]
    # A loop device discards (its file's blocks are punched out, and read back zero); a file cannot.
    assert entry["method"] == ("discard" if disk.mode == "loop" else "overwrite"), entry
    assert entry["reads_zero"] and entry["bytes"] == 32 * MIB and entry["disk"] == disk.name
    assert all_zero(disk)


async def test_an_overwrite_is_an_overwrite_even_where_discard_works(disk: Disk, tmp_path: Path) -> None:
    req = kinds_pb2.DiskWipeRequest(disks=[disk.name], method="overwrite")
    res = await run("disk.wipe", context(tmp_path, disk), req)
    assert res.ok and res.result["disks"][0]["method"] == "overwrite"
    assert all_zero(disk)


async def test_a_mounted_disk_is_refused_and_not_touched(disk: Disk, tmp_path: Path) -> None:
    ctx = context(tmp_path, disk)
    if disk.mode == "file":
        mount(disk.tree.root, disk.name, "/mnt/data")
        res = await run("disk.wipe", ctx, kinds_pb2.DiskWipeRequest(disks=[disk.name]))
    else:
        subprocess.run(["mkfs.ext4", "-q", "-F", str(disk.path)], check=True)
        point = tmp_path / "mnt"
        point.mkdir()
        subprocess.run(["mount", str(disk.path), str(point)], check=True)
        try:
            res = await run("disk.wipe", ctx, kinds_pb2.DiskWipeRequest(disks=[disk.name]))
        finally:
            subprocess.run(["umount", str(point)], check=True)
    assert not res.ok and res.reason == DISK_IN_USE, res
    assert "in use" in res.message and disk.name in res.message
    assert not all_zero(disk)


async def test_every_disk_is_checked_before_any_is_wiped(disk: Disk, tmp_path: Path) -> None:
    req = kinds_pb2.DiskWipeRequest(disks=[disk.name, "nosuch9"])
    res = await run("disk.wipe", context(tmp_path, disk), req)
    assert not res.ok and res.reason == UNKNOWN_DISK and "nosuch9" in res.message
    assert content(disk) == b"\x5a" * MIB, "the known disk was wiped although the command was refused"


# -- deploy.image --------------------------------------------------------------------------------


@dataclass
class Image:
    data: bytes
    sha256: str


def build_image(tmp_path: Path) -> Image:
    """A 16 MiB GPT image with a 12 MiB ext4 partition, built by the real sfdisk and mkfs.ext4."""
    path = tmp_path / "image.raw"
    with path.open("wb") as f:
        f.truncate(16 * MIB)
    subprocess.run(["sfdisk", "-q", str(path)], input=b"label: gpt\n2048,24576,L\n", check=True)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", "installed", "-E", f"offset={2048 * 512}", str(path), "12M"], check=True
    )
    data = path.read_bytes()
    return Image(data, hashlib.sha256(data).hexdigest())


@dataclass
class Served:
    body: bytes
    cut_at: int | None = None  # close the connection after this many bytes (Content-Length says all)


@pytest.fixture
def image_server() -> Iterator[tuple[str, dict[str, Served]]]:
    routes: dict[str, Served] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served = routes.get(self.path)
            if served is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(served.body)))
            self.end_headers()
            body = served.body if served.cut_at is None else served.body[: served.cut_at]
            self.wfile.write(body)
            if served.cut_at is not None:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url, routes


def deploy(url: str, image: Image, disk: Disk, size: int = 0) -> kinds_pb2.DeployImageRequest:
    return kinds_pb2.DeployImageRequest(url=url, sha256=image.sha256, disk=disk.name, size=size)


@NEEDS_TOOLS
async def test_an_image_is_written_verified_and_its_partitions_read_back(
    disk: Disk, tmp_path: Path, image_server: tuple[str, dict[str, Served]]
) -> None:
    url, routes = image_server
    image = build_image(tmp_path)
    routes["/images/os.raw"] = Served(image.data)
    res = await run(
        "deploy.image", context(tmp_path, disk), deploy(f"{url}/images/os.raw", image, disk, len(image.data))
    )
    assert res.ok, res
    assert res.result["sha256"] == image.sha256 and res.result["bytes"] == len(image.data)
    table = res.result["partition_table"]
    assert table["label"] == "gpt"
    [part] = table["partitions"]
    assert (part["fstype"], part["label"], part["start_bytes"]) == ("ext4", "installed", 2048 * 512)
    assert content(disk, 0, len(image.data)) == image.data
    assert content(disk, len(image.data), MIB) == b"\x5a" * MIB, "the deploy wrote past the image"


@NEEDS_TOOLS
async def test_a_digest_mismatch_mid_stream_deploys_nothing(
    disk: Disk, tmp_path: Path, image_server: tuple[str, dict[str, Served]]
) -> None:
    url, routes = image_server
    image = build_image(tmp_path)
    corrupt = bytearray(image.data)
    corrupt[len(corrupt) // 2] ^= 0xFF  # one byte in the middle of the stream
    routes["/os.raw"] = Served(bytes(corrupt))
    res = await run("deploy.image", context(tmp_path, disk), deploy(f"{url}/os.raw", image, disk))
    assert not res.ok and res.reason == "digest-mismatch", res
    assert res.result["invalidated"] is True and "partition_table" not in res.result
    assert content(disk) == bytes(MIB), "the half-checked image's partition table is still on the disk"
    assert content(disk, 32 * MIB - MIB) == bytes(MIB), "the backup GPT is still on the disk"


@NEEDS_TOOLS
async def test_an_interrupted_transfer_deploys_nothing(
    disk: Disk, tmp_path: Path, image_server: tuple[str, dict[str, Served]]
) -> None:
    url, routes = image_server
    image = build_image(tmp_path)
    routes["/os.raw"] = Served(image.data, cut_at=9 * MIB + 123)
    res = await run("deploy.image", context(tmp_path, disk), deploy(f"{url}/os.raw", image, disk))
    assert not res.ok and res.reason == "download-failed", res
    assert res.result["invalidated"] is True
    assert content(disk) == bytes(MIB)


async def test_an_unreachable_url_fails_and_leaves_the_disk_untouched(disk: Disk, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    image = Image(b"", "0" * 64)
    res = await run("deploy.image", context(tmp_path, disk), deploy(f"http://127.0.0.1:{port}/os.raw", image, disk))
    assert not res.ok and res.reason == "download-failed" and "ConnectError" in res.message, res
    assert res.result["invalidated"] is False
    assert content(disk) == b"\x5a" * MIB


@NEEDS_TOOLS
async def test_bytes_that_match_their_digest_but_hold_no_filesystem_fail_the_check(
    disk: Disk, tmp_path: Path, image_server: tuple[str, dict[str, Served]]
) -> None:
    url, routes = image_server
    junk = os.urandom(4 * MIB)
    image = Image(junk, hashlib.sha256(junk).hexdigest())
    routes["/junk.raw"] = Served(junk)
    res = await run("deploy.image", context(tmp_path, disk), deploy(f"{url}/junk.raw", image, disk))
    assert not res.ok and res.reason == "image-check-failed", res
    assert res.result["invalidated"] is True and content(disk) == bytes(MIB)


async def test_a_deploy_to_the_disk_under_the_root_is_refused_before_any_download(tmp_path: Path) -> None:
    with disk_under_test("file", tmp_path) as disk:  # a fake tree: this machine's own root stays out of it
        mount(disk.tree.root, disk.name, "/")
        image = Image(b"", "0" * 64)
        res = await run("deploy.image", context(tmp_path, disk), deploy("http://127.0.0.1:9/never", image, disk))
        assert not res.ok and res.reason == DISK_IN_USE and "(/)" in res.message
        assert content(disk) == b"\x5a" * MIB


@pytest.fixture
def stalling_server() -> Iterator[tuple[str, threading.Event]]:
    """Serves 9 MiB of a 16 MiB body, then stalls until released: a deploy stays mid-write."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(16 * MIB))
            self.end_headers()
            self.wfile.write(b"\x33" * (9 * MIB))
            self.wfile.flush()
            release.wait(30)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        try:
            yield url, release
        finally:
            release.set()


async def test_mid_write_and_after_a_cancel_the_disk_holds_nothing_that_boots(
    disk: Disk, tmp_path: Path, stalling_server: tuple[str, threading.Event]
) -> None:
    url, _ = stalling_server
    image = Image(b"", "0" * 64)
    executor = REGISTRY["deploy.image"]
    payload = any_pb2.Any()
    payload.Pack(deploy(f"{url}/os.raw", image, disk))
    task = asyncio.create_task(executor.run(context(tmp_path, disk), executor.parse(payload)))
    async with asyncio.timeout(20):  # the image's blocks after its first MiB reach the disk
        while content(disk, MIB, 16, device=True) != b"\x33" * 16:
            await asyncio.sleep(0.02)
    # What a kill -9 now would leave: the image's head is held back, the disk's ends are zero.
    assert content(disk, 0, MIB, device=True) == bytes(MIB)
    assert content(disk, 32 * MIB - MIB, MIB, device=True) == bytes(MIB)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert content(disk) == bytes(MIB) and content(disk, 32 * MIB - MIB) == bytes(MIB)
    assert content(disk, MIB, 16) == b"\x33" * 16, "the cancel came before the write: nothing was tested"
