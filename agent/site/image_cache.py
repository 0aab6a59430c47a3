"""The site's image cache: `cache_images` pulled by URL, kept by SHA-256, re-checked before every serve.

An image is stored as `images/<sha256>` once its bytes hash to the digest the spec gave; it is downloaded
to `images/.<sha256>.part` while hashing, and renamed only when the digest matches. An image whose bytes
do not match is `mismatch` for the rest of that spec's generation (the section is FAILED, naming its URL)
and its bytes are dropped; a download that fails (the server is down, a 404) is retried on the next pass
while the section stays PROGRESSING. Warming runs in the background: `warm()` starts what is missing and
returns at once, and `on_change` wakes the converge loop when a download ends.

`open_verified()` is how the boot server reads an image: it hashes the open file and hands back that same
file, rewound, only when it still matches, so bytes changed on disk after the download are never served
(the file is removed and the next pass pulls it again).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx

from agent.offload import Offload

log = logging.getLogger(__name__)

READY, WARMING, RETRY, MISMATCH = "ready", "warming", "retry", "mismatch"
CHUNK = 1 << 20


@dataclass
class ImageState:
    url: str
    sha256: str
    state: str
    message: str = ""


def _hash_file(f: BinaryIO) -> str:
    h = hashlib.sha256()
    f.seek(0)
    while chunk := f.read(CHUNK):
        h.update(chunk)
    f.seek(0)
    return h.hexdigest()


class ImageCache:
    def __init__(
        self,
        root: Path,
        offload: Offload,
        on_change: Callable[[], None] = lambda: None,
        client: Callable[[], httpx.AsyncClient] = lambda: httpx.AsyncClient(timeout=30.0, trust_env=False),
    ) -> None:
        self.root = root
        self.offload = offload
        self.on_change = on_change
        self.client = client
        self.images: dict[str, ImageState] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._generation = -1

    def path(self, sha256: str) -> Path:
        return self.root / sha256

    def warm(self, wanted: list[tuple[str, str]], generation: int) -> list[ImageState]:
        """Start pulling each (url, sha256) not cached yet; the state of each, in order. A new generation
        forgets the mismatches of the last one (its spec may name other bytes)."""
        if generation != self._generation:
            self._generation = generation
            for s in self.images.values():
                if s.state == MISMATCH:
                    s.state = RETRY
        keep = {sha for _url, sha in wanted}
        for sha in list(self.images):
            if sha not in keep and sha not in self._tasks:
                del self.images[sha]
        out: list[ImageState] = []
        for url, sha in wanted:
            known = self.images.get(sha)
            if known is None or known.url != url:
                known = self.images[sha] = ImageState(url, sha, READY if self.path(sha).is_file() else RETRY)
            s = known
            if s.state == RETRY and sha not in self._tasks:
                s.state = WARMING
                self._tasks[sha] = asyncio.create_task(self._pull(s), name=f"site-image-{sha[:12]}")
            out.append(s)
        return out

    async def _pull(self, s: ImageState) -> None:
        part = self.root / f".{s.sha256}.part"
        try:
            await self.offload(self.root.mkdir, parents=True, exist_ok=True)
            h = hashlib.sha256()
            f = await self.offload(open, part, "wb")
            try:
                async with self.client() as client, client.stream("GET", s.url) as resp:
                    if resp.status_code != 200:
                        raise OSError(f"HTTP {resp.status_code}")
                    async for chunk in resp.aiter_bytes(CHUNK):
                        h.update(chunk)
                        await self.offload(f.write, chunk)
                await self.offload(f.flush)
                await self.offload(os.fsync, f.fileno())
            finally:
                await self.offload(f.close)
            got = h.hexdigest()
            if got != s.sha256:
                await self.offload(part.unlink, missing_ok=True)
                s.state, s.message = MISMATCH, f"{s.url}: its bytes hash to {got}, not {s.sha256}"
                log.warning("event=site.image.mismatch url=%s want=%s got=%s", s.url, s.sha256, got)
            else:
                await self.offload(os.replace, part, self.path(s.sha256))
                s.state, s.message = READY, ""
                log.info("event=site.image.cached url=%s sha256=%s", s.url, s.sha256)
        except asyncio.CancelledError:
            raise
        except (OSError, httpx.HTTPError) as e:
            s.state, s.message = RETRY, f"{s.url}: {type(e).__name__}: {e}"[:300]
            log.warning("event=site.image.pull-failed url=%s error=%r", s.url, str(e))
        finally:
            self._tasks.pop(s.sha256, None)
            self.on_change()

    async def open_verified(self, sha256: str) -> BinaryIO | None:
        """The cached image's file, rewound, when its bytes still hash to `sha256`; else None (and a bad
        file is removed, so the next pass pulls it again)."""
        f, got = await self.offload(self._open_and_hash, sha256)
        if f is None or got == sha256:
            return f
        s = self.images.get(sha256)
        if s is not None:
            s.state = RETRY
        log.error("event=site.image.corrupt sha256=%s got=%s: removed, not served", sha256, got)
        self.on_change()
        return None

    def _open_and_hash(self, sha256: str) -> tuple[BinaryIO | None, str]:
        p = self.path(sha256)
        try:
            f = open(p, "rb")  # noqa: SIM115 - handed to the caller, who closes it
        except FileNotFoundError:
            return None, ""
        got = _hash_file(f)
        if got != sha256:
            f.close()
            p.unlink(missing_ok=True)
        return f, got

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
