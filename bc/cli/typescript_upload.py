"""The typescript a `bc shell --record` sends: what its pty wrote, in order, in chunks of at most 64 KiB, bound to
the tunnel's sid (`Tunnels.UploadTypescript`, docs/access.md "Typescripts").

`feed` never waits (it is called with each read of the pty): it keeps at most `limit` bytes in all, the most the
control plane accepts of one session, and drops the rest (counted in `dropped`). `run` sends what was fed while
the session lasts, one call at a time; after `close` it sends the rest and marks the typescript complete. An
upload the control plane refuses ends the recording; the error is kept for the caller to say once the terminal
is itself again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from bc.errors import BcError

CHUNK = 64 * 1024
LIMIT = 8 * 1024 * 1024

Upload = Callable[[int, bytes, bool], Awaitable[int]]
"""(offset, data, done) -> the bytes the control plane holds."""


class TypescriptUpload:
    def __init__(self, upload: Upload, *, limit: int = LIMIT, chunk: int = CHUNK) -> None:
        self.upload, self.limit, self.chunk = upload, limit, chunk
        self.pending = bytearray()
        self.fed = 0  # bytes taken, of at most `limit`
        self.sent = 0
        self.dropped = 0
        self.error: BcError | None = None
        self._more = asyncio.Event()
        self._closed = False

    def feed(self, data: bytes) -> None:
        room = max(0, self.limit - self.fed)
        keep = data[:room]
        self.dropped += len(data) - len(keep)
        if keep:
            self.pending += keep
            self.fed += len(keep)
            self._more.set()

    async def _send(self, done: bool) -> None:
        while self.error is None and (self.pending or done):
            piece = bytes(self.pending[: self.chunk])
            last = done and len(self.pending) <= self.chunk
            try:
                self.sent = await self.upload(self.sent, piece, last)
            except BcError as e:
                self.error = e
                return
            del self.pending[: len(piece)]
            if last:
                return

    async def run(self) -> None:
        """Send what is fed; once closed, the rest with the mark `done`."""
        while self.error is None:
            await self._more.wait()
            self._more.clear()
            if self._closed:
                await self._send(done=True)
                return
            await self._send(done=False)

    def close(self) -> None:
        self._closed = True
        self._more.set()
