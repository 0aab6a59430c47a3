"""Tenant images: downloaded once over https into `<data-dir>/images/<sha256>.<format>`, checked before use.

* **Download** (`want`): in the background, never in the converge pass. https only, redirects only to
  https, a stalled or trickling transfer (under 1 MiB in a 2-minute window) abandoned
  (agent.upgrade.download). The bytes go to a temp file in `images/` (0700), hashed on the way; the file is
  renamed to `<sha256>.<format>` (0644) only once its SHA-256 is the spec's and, for `qcow2`, its header
  passes `agent.instances.qcow2.check_base`. `on_change` wakes the converger when a download ends.
* A download that failed (network, stall, mismatch, refused header) is reported for `retry_s` (60 s), then
  tried again. A network failure or a stall keeps the instance waiting; a mismatch or a refused header fails
  it, since the spec's image is bad.
* **Each use** (`verify`): the file is hashed again and, for qcow2, its header checked again, so a file
  changed on disk after its download is never booted (it is removed, and the next pass fetches it again).

* **Pruned** (`prune`, at the end of each pass): a cached image whose digest neither the section's images
  nor any instance disk's record (`instances/<id>/disk.json`: the base its overlay was made from) names is
  removed, and so is a temp file no download writes (one a crash left). A disk whose record cannot be read
  keeps every image (`Overlays.bases` answers None). Files of other names are left alone.

`raw` images are never probed. Nothing here opens a file an image names.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.instances import qcow2
from agent.offload import Offload
from agent.upgrade.download import DownloadError, StallGuard, download
from bc.protocol.pb import spec_pb2
from bc.seams.clock import Clock

log = logging.getLogger(__name__)

MAX_IMAGE_BYTES: Final = 1 << 40
RETRY_S: Final = 60.0
CHUNK: Final = 1 << 20

READY, WAITING, FAILED = "ready", "waiting", "failed"
_CACHED: Final = re.compile(r"([0-9a-f]{64})\.(qcow2|raw)")
_PART: Final = re.compile(r"\.([0-9a-f]{64}\.(?:qcow2|raw))\.part")


@dataclass(frozen=True)
class ImageState:
    state: str
    message: str = ""
    path: Path | None = None


@dataclass
class _Failure:
    message: str
    fatal: bool
    at: float


class ImageError(Exception):
    """An image that may not be used; one sentence."""


class ImageStore:
    def __init__(
        self,
        root: Path,
        offload: Offload,
        clock: Clock,
        *,
        ca_pem: bytes = b"",
        guard: StallGuard | None = None,
        retry_s: float = RETRY_S,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.root = root
        self.offload = offload
        self.clock = clock
        self.ca_pem = ca_pem
        self.guard = guard or StallGuard()
        self.retry_s = retry_s
        self.on_change = on_change
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._failures: dict[str, _Failure] = {}

    def path(self, img: spec_pb2.TenantImage) -> Path:
        return self.root / f"{img.sha256}.{img.format}"  # a checked digest and format: never a path

    async def want(self, img: spec_pb2.TenantImage) -> ImageState:
        """Where the image stands now; starts its download when it is missing (never blocks)."""
        key = self.path(img).name
        if key in self._tasks:
            return ImageState(WAITING, f"image {img.name} is downloading")
        if await self.offload(self.path(img).is_file):
            return ImageState(READY, path=self.path(img))
        failure = self._failures.get(key)
        if failure is not None and self.clock.monotonic() - failure.at < self.retry_s:
            return ImageState(FAILED if failure.fatal else WAITING, failure.message)
        self._failures.pop(key, None)
        self._tasks[key] = asyncio.create_task(self._fetch(img, key), name=f"image-{img.sha256[:12]}")
        return ImageState(WAITING, f"image {img.name} is downloading")

    async def prune(self, keep: set[str]) -> list[str]:
        """Remove the cached images whose SHA-256 is not in `keep`, and temp files no download writes; the
        names removed. A download under way keeps its file."""
        busy = set(self._tasks)  # read on the loop: the sweep below runs on a thread

        def sweep() -> list[str]:
            try:
                entries = sorted(self.root.iterdir())
            except FileNotFoundError:
                return []
            gone = []
            for path in entries:
                cached, part = _CACHED.fullmatch(path.name), _PART.fullmatch(path.name)
                if cached is not None:
                    if cached.group(1) in keep or path.name in busy:
                        continue
                elif part is None or part.group(1) in busy:
                    continue  # not an image of ours, or a download's own temp file
                path.unlink(missing_ok=True)
                gone.append(path.name)
            return gone

        gone: list[str] = await self.offload(sweep)
        for name in gone:
            log.info("event=image.pruned file=%s", name)
        return gone

    async def close(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        for t in list(self._tasks.values()):
            try:
                await t
            except asyncio.CancelledError:
                pass

    async def _fetch(self, img: spec_pb2.TenantImage, key: str) -> None:
        tmp = self.root / f".{key}.part"
        try:
            await self.offload(self.root.mkdir, mode=0o700, parents=True, exist_ok=True)
            got = await download(
                img.url, tmp, ca_pem=self.ca_pem, max_size=MAX_IMAGE_BYTES, guard=self.guard, offload=self.offload
            )
            if got.sha256 != img.sha256:
                raise ImageError(
                    f"image {img.name}: its download's SHA-256 is {got.sha256}, not the spec's {img.sha256}"
                )
            if img.format == "qcow2":
                await self._check_qcow2(img, tmp)
            await self.offload(os.chmod, tmp, 0o644)
            await self.offload(os.replace, tmp, self.path(img))
            log.info("event=image.ready image=%s sha256=%s size=%d", img.name, img.sha256, got.size)
        except DownloadError as e:
            self._failed(key, f"image {img.name}: {e}; tried again in {self.retry_s:g} s", fatal=False)
        except ImageError as e:
            self._failed(key, str(e), fatal=True)
        except OSError as e:
            self._failed(key, f"image {img.name}: cannot store it in {self.root}: {e.strerror}", fatal=False)
        finally:
            await self.offload(tmp.unlink, missing_ok=True)
            self._tasks.pop(key, None)
            self.on_change()

    def _failed(self, key: str, message: str, *, fatal: bool) -> None:
        self._failures[key] = _Failure(message, fatal, self.clock.monotonic())
        log.warning("event=image.failed key=%s fatal=%s message=%r", key, fatal, message)

    async def _check_qcow2(self, img: spec_pb2.TenantImage, path: Path) -> qcow2.Header:
        data, size = await self.offload(qcow2.read_head, path)
        try:
            return qcow2.check_base(data, size)
        except qcow2.Qcow2Refused as e:
            raise ImageError(f"image {img.name} {e}: refused") from None

    async def verify(self, img: spec_pb2.TenantImage) -> int:
        """Before each use: the stored file still hashes to the digest and (qcow2) passes the header checks.
        Its virtual size in bytes; ImageError (and the file removed, so it is fetched again) when not."""
        path = self.path(img)
        try:
            digest = await self.offload(_sha256, path)
        except OSError as e:
            raise ImageError(f"image {img.name}: cannot read {path}: {e.strerror}") from None
        if digest != img.sha256:
            await self.offload(path.unlink, missing_ok=True)
            raise ImageError(f"image {img.name} changed on disk since its download (SHA-256 {digest}); fetched again")
        if img.format == "qcow2":
            return (await self._check_qcow2(img, path)).size
        return int((await self.offload(path.stat)).st_size)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
