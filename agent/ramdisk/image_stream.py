"""Stream an image over HTTP(S) onto an open disk, hashing every byte on its way to the disk.

The site's image cache serves plain HTTP on the boot network (https works too, against the system's roots
and the bc CA). No redirects are followed: the cache serves its images itself. The body is asked for as
`identity` so the bytes hashed are the image's, and more bytes than the image's stated size (or the
disk's) end the transfer at once. A read that brings nothing for `read_timeout_s` ends it as well.

What this module does not judge is the digest: it returns the SHA-256 of what it wrote and the caller
compares (agent.kinds.deploy_image), so a mismatch and a cut are handled in one place.
"""

from __future__ import annotations

import hashlib
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from agent.offload import Offload
from agent.ramdisk import blockdev
from agent.ramdisk.blockdev import OpenDisk

CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0


class StreamError(Exception):
    """The image did not arrive whole; `touched` says whether any byte reached the disk. One sentence."""

    def __init__(self, message: str, *, touched: bool) -> None:
        super().__init__(message)
        self.message, self.touched = message, touched


HEAD = 1 << 20
"""The image's first MiB, written only once its digest matched."""


@dataclass(frozen=True)
class Streamed:
    sha256: str
    size: int
    head: bytes
    """The image's first `HEAD` bytes (fewer for a smaller image), not on the disk yet."""


def check_url(url: str) -> None:
    """ValueError unless `url` is http(s) with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url[:200]!r} is not an http:// or https:// URL")


async def stream_image(
    url: str,
    disk: OpenDisk,
    *,
    limit: int,
    offload: Offload,
    ca_pem: bytes = b"",
    read_timeout_s: float = READ_TIMEOUT_S,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Streamed:
    """Write the body of `url` to `disk`, at most `limit` bytes; StreamError for anything short.

    The head is written last: once the server answers 200, the disk's first and last MiB are zeroed
    (`blockdev.invalidate`), then everything from `HEAD` on is written as it arrives, while the first `HEAD`
    bytes (MBR, primary GPT, most boot sectors) stay in memory and come back in `Streamed.head` for the
    caller to write once the digest matched. Whatever stops the agent mid-stream, a kill -9 included, leaves
    a disk with no partition table at either end: nothing a firmware would boot.
    """
    h = hashlib.sha256()
    received = 0
    head = bytearray()
    buf = bytearray()
    buf_at = HEAD
    touched = False
    verify: ssl.SSLContext | bool = True
    if ca_pem:
        verify = ssl.create_default_context()
        verify.load_verify_locations(cadata=ca_pem.decode())
    try:
        async with httpx.AsyncClient(
            verify=verify,
            follow_redirects=False,
            timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=read_timeout_s),
            transport=transport,
            trust_env=False,  # the site's cache is on the boot network: no proxy in between
        ) as client:
            async with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as resp:
                if resp.status_code != 200:
                    raise StreamError(f"{url} answered HTTP {resp.status_code}", touched=False)
                touched = True
                await offload(blockdev.invalidate, disk)
                async for chunk in resp.aiter_raw(blockdev.BLOCK):
                    if received + len(chunk) > limit:
                        raise StreamError(
                            f"{url} sent more than {limit} bytes (the image's size or the disk's)", touched=True
                        )
                    h.update(chunk)
                    rest = chunk
                    if received < HEAD:
                        take = min(HEAD - received, len(chunk))
                        head += chunk[:take]
                        rest = chunk[take:]
                    received += len(chunk)
                    buf += rest
                    if len(buf) >= blockdev.BLOCK:
                        await offload(blockdev.write_at, disk, bytes(buf), buf_at)
                        buf_at += len(buf)
                        buf.clear()
            if buf:
                await offload(blockdev.write_at, disk, bytes(buf), buf_at)
    except httpx.HTTPError as e:
        raise StreamError(f"fetching {url} failed: {type(e).__name__}: {e}", touched=touched) from None
    await offload(blockdev.sync, disk)
    return Streamed(h.hexdigest(), received, bytes(head))


async def write_head(disk: OpenDisk, streamed: Streamed, offload: Offload) -> None:
    """The image's first bytes, written last (see `stream_image`), then fsync."""
    await offload(blockdev.write_at, disk, streamed.head, 0)
    await offload(blockdev.sync, disk)


async def readback_sha256(disk: OpenDisk, size: int, offload: Offload) -> str:
    """The SHA-256 of the disk's first `size` bytes, read from the device (its cached pages dropped first), one
    piece per offloaded call so a cancel lands between two."""
    await offload(blockdev.drop_cache, disk)
    h = hashlib.sha256()
    off = 0
    while off < size:
        n = await offload(_hash_piece, disk, h, off, min(off + blockdev.PIECE, size))
        if n == 0:
            break  # the disk ended before the image did: the digest will say so
        off += n
    return h.hexdigest()


def _hash_piece(disk: OpenDisk, h: Any, start: int, end: int) -> int:
    off = start
    while off < end:
        data = blockdev.read_at(disk, off, min(blockdev.BLOCK, end - off))
        if not data:
            break
        h.update(data)
        off += len(data)
    return off - start
