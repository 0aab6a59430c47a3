"""Snapshot transfers over https with httpx: an upload to a presigned URL, a download for a restore.

* https only, and redirects followed by hand only to https (each hop checked
  before it is dialled), at most `MAX_REDIRECTS`: a snapshot may hold a
  tenant's memory.
* Never hung: a window of `window_s` (2 minutes) that moves less than
  `min_bytes` (1 MiB), or a transfer over `max_s` (6 hours) in all, ends it
  (`Stall`, pure, decides; a watchdog on the loop's timers cancels the
  request). Both are parameters, small in tests.
* The download hashes what it writes (SHA-256), through the offload, in
  blocks of 1 MiB, and removes its file on any failure; the upload streams the
  staged file with a Content-Length (presigned PUTs need one).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from agent.hashing import BLOCK, hashing_writer
from agent.offload import Offload, to_thread
from bc.seams.clock import Clock, SystemClock

MAX_REDIRECTS = 5
CONNECT_TIMEOUT_S = 30.0
T = TypeVar("T")


class TransferError(Exception):
    """A transfer that did not complete: one sentence."""


@dataclass(frozen=True)
class Limits:
    min_bytes: int = 1 << 20
    window_s: float = 120.0
    max_s: float = 6 * 3600.0


@dataclass
class Stall:
    """Pure: bytes fed in with the time they moved; `verdict(now)` says why the transfer must end, or None.

    Windows are back to back from `start`; a window that closes with fewer than
    `min_bytes` in it ends the transfer, and so does `max_s` in all."""

    limits: Limits
    start: float
    window_start: float = field(init=False)
    in_window: int = field(init=False, default=0)
    total: int = field(init=False, default=0)
    failed: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.window_start = self.start

    def feed(self, n: int, now: float) -> None:
        self._roll(now)
        self.in_window += n
        self.total += n

    def _roll(self, now: float) -> None:
        """Close every window that ended by `now`; the first one short of `min_bytes` fails the transfer."""
        while self.failed is None and now >= self.window_start + self.limits.window_s:
            if self.in_window < self.limits.min_bytes:
                self.failed = (
                    f"the transfer stalled: {self.in_window} bytes in {self.limits.window_s:g} s, under the"
                    f" {self.limits.min_bytes} it must move"
                )
                return
            self.window_start += self.limits.window_s
            self.in_window = 0

    def verdict(self, now: float) -> str | None:
        if self.failed is None and now - self.start >= self.limits.max_s:
            self.failed = f"the transfer ran over {self.limits.max_s:g} s"
        self._roll(now)
        return self.failed

    def next_check(self) -> float:
        """When the verdict may change next (the end of this window, or the overall deadline)."""
        return min(self.window_start + self.limits.window_s, self.start + self.limits.max_s)


def check_https(url: str, what: str) -> None:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise TransferError(f"{what} {shown(url)!r} is not an https:// URL; snapshots move over https only")


def shown(url: str) -> str:
    """The URL without query, fragment or user info: a presigned URL's query is a credential."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def ssl_context(ca_pem: bytes) -> ssl.SSLContext:
    """The system's roots and, when given, the cluster CA (an air-gapped lab's own https server)."""
    ctx = ssl.create_default_context()
    if ca_pem:
        ctx.load_verify_locations(cadata=ca_pem.decode())
    return ctx


async def _watched(work: Awaitable[T], stall: Stall, clock: Clock) -> T:
    """Run `work`, cancelling it when the stall verdict says so (a timer per window, no polling of bytes)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            delay = max(0.0, stall.next_check() - clock.monotonic())
            done, _ = await asyncio.wait({task}, timeout=delay)
            if done:
                return task.result()
            why = stall.verdict(clock.monotonic())
            if why is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # abandoned, for `why`
                    pass
                raise TransferError(why)
    finally:
        if not task.done():
            task.cancel()


async def upload(
    path: Path,
    url: str,
    *,
    ca_pem: bytes = b"",
    limits: Limits = Limits(),
    clock: Clock | None = None,
    offload: Offload = to_thread,
    verify: ssl.SSLContext | None = None,
) -> int:
    """PUT the file to `url` (following https redirects); the HTTP status of the final answer."""
    clock = clock or SystemClock()
    check_https(url, "the upload URL")
    size = (await offload(path.stat)).st_size
    stall = Stall(limits, clock.monotonic())

    async def body() -> AsyncIterator[bytes]:
        f: BinaryIO = await offload(path.open, "rb")
        try:
            while chunk := await offload(f.read, BLOCK):
                stall.feed(len(chunk), clock.monotonic())
                yield chunk
        finally:
            await offload(f.close)

    async def put() -> int:
        target = url
        async with _client(ca_pem, verify) as client:
            for _ in range(MAX_REDIRECTS + 1):
                headers = {"Content-Length": str(size), "Content-Type": "application/x-tar"}
                resp = await client.put(target, content=body(), headers=headers)
                if resp.is_redirect:
                    target = _next(target, resp)
                    continue
                if not resp.is_success:
                    raise TransferError(f"PUT {shown(target)} answered HTTP {resp.status_code}")
                return resp.status_code
        raise TransferError(f"{shown(url)} redirects more than {MAX_REDIRECTS} times")

    return await _guarded(put(), stall, clock, "PUT", url)


async def download(
    url: str,
    dest: Path,
    *,
    max_size: int,
    ca_pem: bytes = b"",
    limits: Limits = Limits(),
    clock: Clock | None = None,
    offload: Offload = to_thread,
    verify: ssl.SSLContext | None = None,
) -> tuple[str, int]:
    """GET `url` into `dest` (following https redirects): its (sha256, size); no `dest` on any failure."""
    clock = clock or SystemClock()
    check_https(url, "the snapshot URL")
    stall = Stall(limits, clock.monotonic())

    async def get() -> tuple[str, int]:
        target = url
        async with _client(ca_pem, verify) as client:
            for _ in range(MAX_REDIRECTS + 1):
                async with client.stream("GET", target, headers={"Accept-Encoding": "identity"}) as resp:
                    if resp.is_redirect:
                        target = _next(target, resp)
                        continue
                    if resp.status_code != 200:
                        raise TransferError(f"GET {shown(target)} answered HTTP {resp.status_code}")
                    return await _receive(resp, dest, max_size, stall, clock, offload)
        raise TransferError(f"{shown(url)} redirects more than {MAX_REDIRECTS} times")

    try:
        return await _guarded(get(), stall, clock, "GET", url)
    except BaseException:
        await offload(dest.unlink, missing_ok=True)
        raise


async def _guarded(work: Awaitable[T], stall: Stall, clock: Clock, verb: str, url: str) -> T:
    try:
        return await _watched(work, stall, clock)
    except httpx.HTTPError as e:
        raise TransferError(f"{verb} {shown(url)} failed: {type(e).__name__}: {e}") from None
    except OSError as e:
        raise TransferError(f"{verb} {shown(url)} failed: {e.strerror or e}") from None


def _client(ca_pem: bytes, verify: ssl.SSLContext | None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        verify=verify or ssl_context(ca_pem),
        follow_redirects=False,
        timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None, write=None),
    )


def _next(current: str, resp: httpx.Response) -> str:
    nxt = urljoin(current, str(resp.headers.get("location", "")))
    check_https(nxt, f"{shown(current)} redirects to")
    return nxt


async def _receive(
    resp: httpx.Response, dest: Path, max_size: int, stall: Stall, clock: Clock, offload: Offload
) -> tuple[str, int]:
    async with hashing_writer(dest, offload) as w:
        async for chunk in resp.aiter_raw(BLOCK):
            stall.feed(len(chunk), clock.monotonic())
            if w.size + len(chunk) > max_size:
                raise TransferError(f"the snapshot is over {max_size} bytes")
            await w.write(chunk)
        return await w.finish(), w.size
