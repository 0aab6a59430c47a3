"""The persistent volume store: sparse raw files `<data-dir>/volumes/<id>.raw` (0600) with `<id>.json` beside.

Raw, not qcow2: the format is fixed and never probed, there is no header a VMM could rewrite, and a volume
grows by truncation. `sync` creates the section's missing volumes and grows those whose size grew, before any
instance is defined, each through the space rule of `agent.instances.volume_rules`; a smaller size is refused
(never shrunk) and so is one that does not fit: the volume keeps its size, and `sync` answers why, for the
instances that attach it. `destroy` removes a volume the section no longer lists once no instance has it
open: its blocks are punched out first (so a stray open file frees its space too), then it is unlinked.

Blocking file work goes through the `Offload` seam.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from agent.instances.volume_rules import MIN_RESERVE, Space, promise_refusal, reserve
from agent.offload import Offload
from bc.protocol.pb import common_pb2, spec_pb2
from bc.runtime.files import atomic_write

log = logging.getLogger(__name__)

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


@dataclass(frozen=True)
class OnDisk:
    id: str
    size: int
    allocated: int

    @property
    def unwritten(self) -> int:
        return max(self.size - self.allocated, 0)


class VolumeStore:
    def __init__(self, root: Path, offload: Offload, *, min_reserve: int = MIN_RESERVE) -> None:
        self.root = root
        self.offload = offload
        self.min_reserve = min_reserve
        self.grown: dict[str, int] = {}
        """The volumes the last `sync` grew, with their new size (for a live resize in running guests)."""

    def path(self, volume_id: str) -> Path:
        return self.root / f"{volume_id}.raw"  # an id is 1-80 of A-Za-z0-9_- (bc.protocol.disk_rules): never a path

    # -- blocking helpers -------------------------------------------------
    def _scan(self) -> dict[str, OnDisk]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        out: dict[str, OnDisk] = {}
        for p in self.root.glob("*.raw"):
            st = p.lstat()
            out[p.stem] = OnDisk(p.stem, st.st_size, st.st_blocks * 512)
        return out

    def _statfs(self) -> tuple[int, int]:
        st = os.statvfs(self.root)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def _space(self, found: dict[str, OnDisk]) -> Space:
        total, available = self._statfs()
        return Space(
            total,
            available,
            reserve(total, self.min_reserve),
            sum(v.size for v in found.values()),
            sum(v.unwritten for v in found.values()),
        )

    def _create_or_grow(self, vol: spec_pb2.Volume, exists: bool) -> None:
        flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | (0 if exists else os.O_CREAT | os.O_EXCL)
        fd = os.open(self.path(vol.id), flags, 0o600)
        try:
            os.ftruncate(fd, vol.size_bytes)  # sparse: the blocks are promised, not taken
            os.fsync(fd)
        finally:
            os.close(fd)
        self._write_meta(vol)

    def _write_meta(self, vol: spec_pb2.Volume) -> None:
        doc = {"id": vol.id, "serial": vol.serial, "size_bytes": vol.size_bytes}
        atomic_write(self.root / f"{vol.id}.json", json.dumps(doc, sort_keys=True).encode(), 0o600)

    def _destroy(self, volume_id: str) -> None:
        path = self.path(volume_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            try:
                size = os.fstat(fd).st_size
                if size:
                    _punch(fd, size)
            finally:
                os.close(fd)
        path.unlink(missing_ok=True)
        (self.root / f"{volume_id}.json").unlink(missing_ok=True)

    # -- the store --------------------------------------------------------
    async def sync(self, volumes: list[spec_pb2.Volume]) -> dict[str, str]:
        """Create and grow the section's volumes; the ones that could not be, with why (one clause each)."""
        found = await self.offload(self._scan)
        problems: dict[str, str] = {}
        self.grown = {}
        for vol in volumes:
            have = found.get(vol.id)
            if have is not None and have.size == vol.size_bytes:
                continue
            if have is not None and have.size > vol.size_bytes:
                problems[vol.id] = (
                    f"volume {vol.id} is {have.size} bytes and the spec says {vol.size_bytes}: a volume is never shrunk"
                )
                continue
            needed = vol.size_bytes - (have.size if have is not None else 0)
            space = await self.offload(self._space, found)
            why = promise_refusal(vol.id, needed, space)
            if why is not None:
                problems[vol.id] = why
                log.warning("event=volume.refused volume=%s %s", vol.id, why)
                continue
            try:
                await self.offload(self._create_or_grow, vol, have is not None)
            except OSError as e:
                problems[vol.id] = f"volume {vol.id}: cannot {'grow' if have else 'create'} it: {e.strerror}"
                continue
            found[vol.id] = OnDisk(vol.id, vol.size_bytes, have.allocated if have is not None else 0)
            if have is not None:
                self.grown[vol.id] = vol.size_bytes
            log.info("event=volume.%s volume=%s size=%d", "grown" if have else "created", vol.id, vol.size_bytes)
        return problems

    async def destroy_unlisted(self, listed: set[str], open_ids: set[str]) -> list[str]:
        """Destroy every volume the section does not list and no instance has open; the ids destroyed."""
        found = await self.offload(self._scan)
        gone: list[str] = []
        for vid in sorted(set(found) - listed - open_ids):
            try:
                await self.offload(self._destroy, vid)
            except OSError as e:
                log.warning("event=volume.destroy-failed volume=%s error=%r", vid, e.strerror)
                continue
            gone.append(vid)
            log.info("event=volume.destroyed volume=%s", vid)
        return gone

    async def storage(self) -> common_pb2.VolumeStorage:
        found = await self.offload(self._scan)
        s = await self.offload(self._space, found)
        return common_pb2.VolumeStorage(
            total_bytes=s.total,
            available_bytes=s.available,
            reserved_bytes=s.reserved,
            committed_bytes=s.committed,
            outstanding_bytes=s.outstanding,
        )


def _punch(fd: int, size: int) -> None:
    """Blocking: free the file's blocks (fallocate PUNCH_HOLE | KEEP_SIZE; not in the stdlib)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    if libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
