"""`disk.wipe` (ramdisk role; provision lane; attested, destructive): wipe whole disks, reported per disk.

Every named disk is checked before any is touched (gpu.reset's rule): a name /sys/block does not know
fails the command `unknown-disk`, and a disk that is mounted, a swap, held by another block device or
under the running root fails it `disk-in-use`; nothing is wiped then. Each disk is then opened
exclusively (the kernel's own refusal of a busy disk) and wiped by the best method it supports
(`method` "auto", the default):

1. `secure-discard`: BLKSECDISCARD, where the device supports it (it erases, not merely unmaps);
2. `discard`: BLKDISCARD, kept only when the samples then read back zero (a discard need not zero);
3. `overwrite`: zeros over every byte, in pieces a cancel can land between.

`method: "overwrite"` skips 1 and 2. Each disk's entry says the method used, the bytes, and whether its
samples (first and last MiB and 14 between) read zero afterwards. The result is signed by the node key
(attested) like every result of this kind.
"""

from __future__ import annotations

import logging
from typing import Any

from agent.kinds.base import INTERNAL, InvalidPayload, KindContext, KindResult, TypedExecutor
from agent.ramdisk import blockdev
from agent.ramdisk.blockdev import DiskBusy, OpenDisk
from agent.ramdisk.machine import DISK_IN_USE, DiskError, MachineTree, find_disk
from bc.protocol.pb import kinds_pb2

log = logging.getLogger(__name__)

WIPE_FAILED = "wipe-failed"
METHODS = ("", "auto", "overwrite")


def disk_lock(name: str) -> str:
    return f"disk:{name}"


class DiskWipe(TypedExecutor[kinds_pb2.DiskWipeRequest]):
    """Result: `disks` ([{disk, method, bytes, reads_zero, ok, message}] in request order)."""

    name = "disk.wipe"
    request_type = kinds_pb2.DiskWipeRequest

    def validate(self, request: kinds_pb2.DiskWipeRequest) -> None:
        if not request.disks:
            raise InvalidPayload("disks is empty: name the disks to wipe")
        if request.method not in METHODS:
            raise InvalidPayload(f"method {request.method[:40]!r} is not one of auto, overwrite")

    def locks(self, request: kinds_pb2.DiskWipeRequest) -> list[str]:
        return [disk_lock(d) for d in dict.fromkeys(request.disks)]

    async def execute(self, ctx: KindContext, request: kinds_pb2.DiskWipeRequest) -> KindResult:
        tree = ctx.machine
        if tree is None:
            return KindResult.failure(INTERNAL, "this agent has no machine tree: disk.wipe runs on a ramdisk")
        names = list(dict.fromkeys(request.disks))
        try:
            for name in names:  # every check before any disk is touched
                await ctx.offload(find_disk, tree, name)
        except DiskError as e:
            return KindResult.failure(e.code, e.message)
        entries: list[dict[str, Any]] = []
        for name in names:
            entries.append(await self._wipe_one(ctx, tree, name, overwrite_only=request.method == "overwrite"))
        failed = [e for e in entries if not e["ok"]]
        result = {"disks": entries}
        if failed:
            code = DISK_IN_USE if all(e.get("busy") for e in failed) else WIPE_FAILED
            words = "; ".join(f"{e['disk']}: {e['message']}" for e in failed)
            return KindResult.failure(code, f"{len(failed)} of {len(entries)} disks not wiped: {words}", result)
        methods = ", ".join(f"{e['disk']} by {e['method']}" for e in entries)
        return KindResult.success(result, f"wiped {methods}")

    async def _wipe_one(
        self, ctx: KindContext, tree: MachineTree, name: str, *, overwrite_only: bool
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"disk": name, "method": "", "bytes": 0, "reads_zero": False, "ok": False}
        try:
            disk = await ctx.offload(blockdev.open_disk, tree.device(name))
        except DiskBusy as e:
            return {**entry, "busy": True, "message": str(e)}
        except OSError as e:
            return {**entry, "message": f"open failed: {e.strerror or e}"}
        try:
            method = await self._method(ctx, disk, overwrite_only)
            entry.update(method=method, bytes=disk.size, reads_zero=await ctx.offload(blockdev.reads_zero, disk))
            entry["ok"] = entry["reads_zero"] or method == "secure-discard"
            entry["message"] = "wiped" if entry["ok"] else "the disk does not read back zero after the overwrite"
        except OSError as e:
            entry["message"] = f"I/O error: {e.strerror or e}"
        finally:
            await ctx.offload(blockdev.close, disk)
        log.warning("event=disk.wiped disk=%s method=%s ok=%s bytes=%d", name, entry["method"], entry["ok"], disk.size)
        return entry

    async def _method(self, ctx: KindContext, disk: OpenDisk, overwrite_only: bool) -> str:
        if not overwrite_only:
            if await ctx.offload(blockdev.discard, disk, secure=True):
                return "secure-discard"
            if await ctx.offload(blockdev.discard, disk, secure=False) and await ctx.offload(blockdev.reads_zero, disk):
                return "discard"
        off = 0
        while off < disk.size:  # one piece per offloaded call: a cancel lands between two
            off += await ctx.offload(blockdev.overwrite, disk, off, min(off + blockdev.PIECE, disk.size))
        await ctx.offload(blockdev.sync, disk)
        return "overwrite"
