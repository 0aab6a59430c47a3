"""Files written and hashed (SHA-256) in one pass: what the agent fetches or builds, and then reports by digest.

Two shapes, one for each way the bytes arrive:

* `HashingSink`, a blocking file object for `tarfile` to write into (the
  snapshot tar, the logs tarball), run off the loop by its caller; an optional
  cap raises `TooLarge` before the byte past it reaches the file.
* `HashingWriter`, on the loop, for a stream of network chunks (a release, a
  snapshot download): each chunk is hashed and counted as it comes, and the
  file writes go through the `Offload` in blocks of `BLOCK`, so a slow disk
  never holds up the loop. `finish` fsyncs: the caller renames a file it
  trusts only after the digest matched, and a crash must not leave a torn one.

Caps on a download stay with its caller (`writer.size` says what came so
far): each names its limit in its own error.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO

from agent.offload import Offload

BLOCK = 1 << 20


class TooLarge(Exception):
    """More bytes than a `HashingSink`'s cap."""


class HashingSink(io.RawIOBase):
    """Writes through to a file, hashing and counting; TooLarge past `cap` (when given)."""

    def __init__(self, f: IO[bytes], cap: int | None = None) -> None:
        self._f = f
        self._cap = cap
        self.size = 0
        self.sha256 = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.size += len(data)
        if self._cap is not None and self.size > self._cap:
            raise TooLarge
        self.sha256.update(data)
        self._f.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size


class HashingWriter:
    """Chunks from the loop to a file through the offload, hashed and counted; open with `hashing_writer`."""

    def __init__(self, f: BinaryIO, offload: Offload) -> None:
        self._f = f
        self._offload = offload
        self._buf = bytearray()
        self._h = hashlib.sha256()
        self.size = 0

    async def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self._h.update(chunk)
        self._buf += chunk
        if len(self._buf) >= BLOCK:
            await self._offload(self._f.write, bytes(self._buf))
            self._buf.clear()

    async def finish(self) -> str:
        """Write what is buffered and fsync; the hex digest of every byte written."""
        if self._buf:
            await self._offload(self._f.write, bytes(self._buf))
            self._buf.clear()
        await self._offload(_sync, self._f)
        return self._h.hexdigest()


@asynccontextmanager
async def hashing_writer(dest: Path, offload: Offload) -> AsyncIterator[HashingWriter]:
    """`dest` opened (truncated) for a `HashingWriter`, and closed however the block ends; removing a partial
    file is the caller's (it knows whether the bytes were wanted)."""
    f: BinaryIO = await offload(dest.open, "wb")
    try:
        yield HashingWriter(f, offload)
    finally:
        await offload(f.close)


def _sync(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
