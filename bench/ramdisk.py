"""Ramdisk disk figures (docs/metal-ramdisk.md), printed, never asserted.

On a loop device (a sparse image file attached with `losetup`, so the backing file's filesystem and the
page cache are what is measured, not a real disk): `disk.wipe` by discard and by overwrite, and
`deploy.image` of an image served by an HTTP server on 127.0.0.1 (streamed, hashed, written, fsynced,
read back and hashed again, then sfdisk and blkid). Run as root, where loop devices exist.

Usage: python -m bench.ramdisk [--size-mib 1024] [--image-mib 512]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import subprocess
import tempfile
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from google.protobuf import any_pb2

from agent.hw.fake import FakeHardware
from agent.kinds import REGISTRY, KindContext, KindResult
from agent.ramdisk.machine import MachineTree
from bc.protocol.pb import kinds_pb2
from tests.http_server import serving

MIB = 1 << 20


async def _run(kind: str, ctx: KindContext, request: Any) -> tuple[KindResult, float]:
    payload = any_pb2.Any()
    payload.Pack(request)
    executor = REGISTRY[kind]
    t0 = time.perf_counter()
    res = await executor.run(ctx, executor.parse(payload))
    return res, time.perf_counter() - t0


def _image(path: Path, mib: int) -> bytes:
    with path.open("wb") as f:
        f.truncate(mib * MIB)
    subprocess.run(["sfdisk", "-q", str(path)], input=b"label: gpt\n2048,,L\n", check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", f"offset={2048 * 512}", str(path), f"{mib - 2}M"], check=True)
    return path.read_bytes()


async def measure(root: Path, dev: Path, size_mib: int, image_mib: int, data: bytes) -> None:
    hw = FakeHardware("hgx-h100-8", "bench", state_dir=root / "data")
    ctx = KindContext(
        node_id="bench", data_dir=root / "data", hw=hw, cdi_dir=root / "cdi", boot_id="b", machine=MachineTree()
    )
    for method in ("auto", "overwrite"):
        res, s = await _run("disk.wipe", ctx, kinds_pb2.DiskWipeRequest(disks=[dev.name], method=method))
        entry = res.result["disks"][0]
        print(f"disk.wipe {method:9s} {size_mib} MiB: {entry['method']:9s} {s:6.2f} s  {size_mib / s:8.0f} MiB/s")
    digest = hashlib.sha256(data).hexdigest()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        req = kinds_pb2.DeployImageRequest(url=f"{url}/os.raw", sha256=digest, disk=dev.name, size=len(data))
        res, s = await _run("deploy.image", ctx, req)
    assert res.ok, res
    print(f"deploy.image {image_mib} MiB over HTTP: {s:6.2f} s  {image_mib / s:8.0f} MiB/s (with read-back)")


def main(size_mib: int, image_mib: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bc-bench-ramdisk-") as tmp:
        root = Path(tmp)
        disk = root / "disk.img"
        with disk.open("wb") as f:
            f.truncate(size_mib * MIB)
        data = _image(root / "os.raw", image_mib)
        out = subprocess.run(["losetup", "-f", "--show", str(disk)], capture_output=True, text=True, check=True)
        dev = Path(out.stdout.strip())
        try:
            asyncio.run(measure(root, dev, size_mib, image_mib, data))
        finally:
            subprocess.run(["losetup", "-d", str(dev)], check=False)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--image-mib", type=int, default=512)
    args = ap.parse_args()
    main(args.size_mib, args.image_mib)
