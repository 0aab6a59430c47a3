"""What a written image holds, as util-linux reads it back from the disk: `sfdisk --json` for the partition
table, `blkid -p` (probing, no cache) for each partition's filesystem by its offset, so no partition
device node is needed (a loop device attached without `-P` has none).

An image passes when it has a partition table with at least one partition whose filesystem blkid
recognises, or, without a table, a filesystem on the whole disk. Anything else (zeros, a truncated
table, garbage that happens to match its digest) fails `image-check-failed`: a digest proves the bytes
are the ones published, not that they boot.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.hw.base import run_process

TOOL_TIMEOUT_S = 60.0


class CheckError(Exception):
    """The tools could not be run (missing, timed out); one sentence."""


@dataclass
class ImageCheck:
    label: str = ""  # gpt | dos | "" (no partition table)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    filesystem: dict[str, str] = field(default_factory=dict)  # the whole disk's, when there is no table

    @property
    def ok(self) -> bool:
        if self.label:
            return any(p.get("fstype") for p in self.partitions)
        return bool(self.filesystem.get("TYPE"))

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "partitions": self.partitions, "filesystem": self.filesystem}

    def why_not(self) -> str:
        if self.label and not self.partitions:
            return f"the {self.label} partition table lists no partition"
        if self.label:
            return f"none of the {len(self.partitions)} partitions holds a filesystem blkid recognises"
        return "the disk holds neither a partition table nor a filesystem"


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        raise CheckError(f"{name} is not installed (util-linux): the image cannot be checked")
    return path


def _export(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("TYPE", "UUID", "LABEL", "PTTYPE", "PARTUUID", "VERSION"):
            out[key] = value
    return out


async def _blkid(device: Path, offset: int | None = None, size: int | None = None) -> dict[str, str]:
    argv = [_tool("blkid"), "-p", "-o", "export"]
    if offset is not None and size is not None:
        argv += ["--offset", str(offset), "--size", str(size)]
    res = await run_process([*argv, str(device)], timeout_s=TOOL_TIMEOUT_S)
    # blkid exits 2 when it recognises nothing: an answer, not a failure.
    return _export(res.stdout.decode("utf-8", "replace")) if res.returncode == 0 else {}


async def check_image(device: Path) -> ImageCheck:
    """Read the disk's partition table and filesystems back (CheckError when the tools cannot run)."""
    try:
        res = await run_process([_tool("sfdisk"), "--json", str(device)], timeout_s=TOOL_TIMEOUT_S)
    except TimeoutError:
        raise CheckError("sfdisk did not answer in time") from None
    result = ImageCheck()
    table: dict[str, Any] = {}
    if res.returncode == 0:
        try:
            table = json.loads(res.stdout).get("partitiontable", {})
        except ValueError:
            table = {}
    if not table:
        result.filesystem = await _blkid(device)
        return result
    result.label = str(table.get("label", ""))
    sector = int(table.get("sectorsize", 512))
    for i, part in enumerate(table.get("partitions", []), start=1):
        start, size = int(part.get("start", 0)), int(part.get("size", 0))
        fs = await _blkid(device, start * sector, size * sector) if size > 0 else {}
        result.partitions.append(
            {
                "number": i,
                "start_bytes": start * sector,
                "size_bytes": size * sector,
                "type": str(part.get("type", "")),
                "fstype": fs.get("TYPE", ""),
                "uuid": fs.get("UUID", ""),
                "label": fs.get("LABEL", ""),
            }
        )
    return result
