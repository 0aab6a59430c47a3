"""`deploy.image` (ramdisk role; provision lane; destructive): write an image from the site's cache to a disk.

In order, each step's failure a result of its own:

1. the disk is checked like disk.wipe's (`unknown-disk`, `disk-in-use`) and opened exclusively;
2. the image streams from `url` straight onto the disk, hashed as it is written
   (agent.ramdisk.image_stream): an unreachable URL or an HTTP error before the body is
   `download-failed` with the disk untouched; a transfer cut mid-stream is `download-failed` too. Once the
   body starts, the disk's ends are zeroed and the image's first MiB is held back until its digest
   matched, so a ramdisk killed mid-write leaves nothing that boots;
3. the digest of what arrived must be `sha256` (`digest-mismatch`), and the digest read back from the
   disk must be it too (`readback-mismatch`): the bytes on the disk are the image's;
4. the partition table and filesystems are read back with sfdisk and blkid (`image-check-failed`).

Whenever a byte reached the disk and a later step failed, the disk's first and last MiB are zeroed
before the failure is reported (`invalidated: true` in the result), so a half-written or wrong image
never boots and nothing is reported deployed. Only a command that passed every step succeeds, with the
digest, the size and what sfdisk and blkid found.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from agent.kinds.base import INTERNAL, InvalidPayload, KindContext, KindResult, TypedExecutor
from agent.kinds.disk_wipe import disk_lock
from agent.ramdisk import blockdev, image_check, image_stream
from agent.ramdisk.blockdev import DiskBusy, OpenDisk
from agent.ramdisk.machine import DISK_IN_USE, DiskError, find_disk
from bc.protocol.pb import kinds_pb2

log = logging.getLogger(__name__)

DOWNLOAD_FAILED = "download-failed"
DIGEST_MISMATCH = "digest-mismatch"
READBACK_MISMATCH = "readback-mismatch"
IMAGE_CHECK_FAILED = "image-check-failed"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class DeployImage(TypedExecutor[kinds_pb2.DeployImageRequest]):
    """Result: `disk`, `url`, `sha256`, `bytes`, `partition_table` (label, partitions with fstype and uuid,
    or the whole disk's `filesystem`), and on failure `invalidated` (the disk's ends were zeroed)."""

    name = "deploy.image"
    request_type = kinds_pb2.DeployImageRequest

    def validate(self, request: kinds_pb2.DeployImageRequest) -> None:
        try:
            image_stream.check_url(request.url)
        except ValueError as e:
            raise InvalidPayload(f"url: {e}") from None
        if not _SHA256.fullmatch(request.sha256):
            raise InvalidPayload("sha256 must be 64 lowercase hex digits")
        if not request.disk:
            raise InvalidPayload("disk is empty: name the disk to write")
        if request.size < 0:
            raise InvalidPayload(f"size is {request.size}; it must not be negative")

    def locks(self, request: kinds_pb2.DeployImageRequest) -> list[str]:
        return [disk_lock(request.disk)]

    async def execute(self, ctx: KindContext, request: kinds_pb2.DeployImageRequest) -> KindResult:
        tree = ctx.machine
        if tree is None:
            return KindResult.failure(INTERNAL, "this agent has no machine tree: deploy.image runs on a ramdisk")
        try:
            await ctx.offload(find_disk, tree, request.disk)
            disk = await ctx.offload(blockdev.open_disk, tree.device(request.disk))
        except DiskError as e:
            return KindResult.failure(e.code, e.message)
        except DiskBusy as e:
            return KindResult.failure(DISK_IN_USE, str(e))
        base: dict[str, Any] = {"disk": request.disk, "url": request.url, "sha256": request.sha256}
        try:
            return await self._deploy(ctx, request, disk, tree.device(request.disk), base)
        except BaseException:  # cancelled (or worse) at any step: never leave half an image that could boot
            await ctx.offload(blockdev.invalidate, disk)
            raise
        finally:
            await ctx.offload(blockdev.close, disk)

    async def _deploy(
        self,
        ctx: KindContext,
        request: kinds_pb2.DeployImageRequest,
        disk: OpenDisk,
        device: Path,
        base: dict[str, Any],
    ) -> KindResult:
        if request.size > disk.size:
            return KindResult.failure(
                IMAGE_CHECK_FAILED, f"the image ({request.size} bytes) is larger than disk {request.disk} ({disk.size})"
            )
        limit = request.size or disk.size
        try:
            streamed = await image_stream.stream_image(
                request.url, disk, limit=limit, offload=ctx.offload, ca_pem=ctx.ca_pem
            )
        except image_stream.StreamError as e:
            return await self._failed(ctx, disk, DOWNLOAD_FAILED, e.message, base, touched=e.touched)
        base["bytes"] = streamed.size
        if request.size and streamed.size != request.size:
            why = f"the image is {streamed.size} bytes, not the {request.size} the request said"
            return await self._failed(ctx, disk, DOWNLOAD_FAILED, why, base, touched=True)
        if streamed.sha256 != request.sha256:
            why = f"the image's SHA-256 is {streamed.sha256}, not {request.sha256}"
            return await self._failed(ctx, disk, DIGEST_MISMATCH, why, base, touched=True)
        await image_stream.write_head(disk, streamed, ctx.offload)  # the image is whole: now it may boot
        on_disk = await image_stream.readback_sha256(disk, streamed.size, ctx.offload)
        if on_disk != request.sha256:
            why = f"disk {request.disk} reads back SHA-256 {on_disk} after the write, not the image's"
            return await self._failed(ctx, disk, READBACK_MISMATCH, why, base, touched=True)
        try:
            check = await image_check.check_image(device)
        except image_check.CheckError as e:
            return await self._failed(ctx, disk, IMAGE_CHECK_FAILED, str(e), base, touched=True)
        except TimeoutError:
            why = "sfdisk or blkid did not answer in time"
            return await self._failed(ctx, disk, IMAGE_CHECK_FAILED, why, base, touched=True)
        base["partition_table"] = check.as_dict()
        if not check.ok:
            return await self._failed(ctx, disk, IMAGE_CHECK_FAILED, check.why_not(), base, touched=True)
        log.warning("event=image.deployed disk=%s sha256=%s bytes=%d", request.disk, request.sha256, streamed.size)
        parts = f"{check.label or 'no'} partition table, {len(check.partitions)} partitions"
        return KindResult.success(base, f"deployed {streamed.size} bytes to {request.disk} ({parts})")

    async def _failed(
        self, ctx: KindContext, disk: OpenDisk, code: str, why: str, base: dict[str, Any], *, touched: bool
    ) -> KindResult:
        if touched:
            await ctx.offload(blockdev.invalidate, disk)
        log.warning("event=image.not_deployed disk=%s code=%s invalidated=%s why=%r", base["disk"], code, touched, why)
        return KindResult.failure(code, why, {**base, "invalidated": touched})
