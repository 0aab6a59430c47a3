"""An instance's root disk: a qcow2 overlay `instances/<id>/disk.qcow2` on its checked base image.

* Made with `qemu-img create -f qcow2 -u -b BASE -F FORMAT disk.qcow2 SIZE`: `-u` never opens the base
  (which is why the size is given: the base's virtual size from its header, or the spec's larger
  `disk_size_bytes`). Its base, format and digest are recorded in `disk.json` beside it (0600).
* Checked before every start (`agent.instances.qcow2.check_overlay`): a VMM that once ran the guest can
  rewrite the overlay's header, so it must still name exactly its recorded base and format, and nothing
  else (no data file, no encryption). An overlay of another image than the spec's now fails the instance:
  an instance's image does not change under it.
* Grown with `qemu-img resize -f qcow2` while stopped (after that check) when `disk_size_bytes` grows; a
  smaller size fails the instance (a disk never shrinks).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.instances import qcow2
from agent.instances.runtime import RuntimeFailure
from agent.instances.tool import ToolFailed, run_tool
from agent.offload import Offload
from bc.runtime.files import atomic_write

DISK: Final = "disk.qcow2"
RECORD: Final = "disk.json"
QEMU_IMG: Final = "qemu-img"


@dataclass(frozen=True)
class Base:
    path: Path
    format: str
    sha256: str
    size: int
    """Its virtual size in bytes."""


class Overlays:
    def __init__(self, root: Path, offload: Offload, *, qemu_img: str = QEMU_IMG) -> None:
        self.root = root
        self.offload = offload
        self.qemu_img = qemu_img

    def disk(self, instance_id: str) -> Path:
        return self.root / instance_id / DISK

    async def prepare(self, instance_id: str, base: Base, want_size: int) -> None:
        """Make, check and grow the instance's overlay (the instance is stopped); RuntimeFailure when it
        cannot be used."""
        disk = self.disk(instance_id)
        record = disk.parent / RECORD
        if not await self.offload(disk.exists):
            await self.offload(disk.parent.mkdir, mode=0o700, parents=True, exist_ok=True)  # qemu's define made it
            size = max(base.size, want_size)
            await self._run(
                "create", "-f", "qcow2", "-u", "-b", str(base.path), "-F", base.format, str(disk), str(size)
            )
            doc = {"base": str(base.path), "format": base.format, "sha256": base.sha256}
            await self.offload(atomic_write, record, json.dumps(doc, sort_keys=True).encode(), 0o600)
        h = await self.check(instance_id, base)
        if want_size and want_size < h.size:
            raise RuntimeFailure(
                f"disk_size_bytes {want_size} is smaller than its disk's {h.size} bytes: a disk never shrinks"
            )
        if want_size > h.size:
            await self._run("resize", "-f", "qcow2", str(disk), str(want_size))

    async def check(self, instance_id: str, base: Base) -> qcow2.Header:
        disk = self.disk(instance_id)
        try:
            text = await self.offload((disk.parent / RECORD).read_text)
            doc = json.loads(text)
            recorded = (str(doc["base"]), str(doc["format"]), str(doc["sha256"]))
        except (OSError, ValueError, KeyError, TypeError):
            raise RuntimeFailure(f"its disk {disk} has no record of its base image") from None
        if recorded[2] != base.sha256:
            raise RuntimeFailure(
                f"its disk was made from image {recorded[2][:12]}, not {base.sha256[:12]}: an instance's image does"
                " not change (delete it to rebuild)"
            )
        try:
            data, size = await self.offload(qcow2.read_head, disk)
            return qcow2.check_overlay(data, size, Path(recorded[0]), recorded[1])
        except OSError as e:
            raise RuntimeFailure(f"cannot read its disk {disk}: {e.strerror}") from None
        except qcow2.Qcow2Refused as e:
            raise RuntimeFailure(f"its disk {disk} {e}: refused") from None

    async def image_sha256(self, instance_id: str) -> str:
        """The digest of the base the instance's disk was made from ('' without one)."""
        try:
            doc = json.loads(await self.offload((self.root / instance_id / RECORD).read_text))
            return str(doc.get("sha256", "")) if isinstance(doc, dict) else ""
        except (OSError, ValueError):
            return ""

    async def bases(self) -> set[str] | None:
        """The SHA-256 of the base image every instance disk here was made from; None when a disk's record
        cannot be read (then no image may be pruned: it could be that disk's base)."""

        def read() -> set[str] | None:
            found: set[str] = set()
            try:
                dirs = sorted(self.root.iterdir())
            except FileNotFoundError:
                return found
            except OSError:
                return None
            for d in dirs:
                try:
                    if not (d / DISK).exists():
                        continue
                    doc = json.loads((d / RECORD).read_text())
                    found.add(str(doc["sha256"]))
                except (OSError, ValueError, KeyError, TypeError):
                    return None
            return found

        bases: set[str] | None = await self.offload(read)
        return bases

    async def forget(self, instance_id: str) -> None:
        """The instance is deleted: its disk goes (qemu's runtime removes the whole directory already)."""
        for name in (DISK, RECORD):
            await self.offload((self.root / instance_id / name).unlink, missing_ok=True)

    async def _run(self, *args: str) -> None:
        try:
            await run_tool([self.qemu_img, *args])
        except ToolFailed as e:
            if e.returncode is None:
                raise RuntimeFailure(e.line) from None
            raise RuntimeFailure(f"qemu-img {args[0]} failed: {e.line}") from None
