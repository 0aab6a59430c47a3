"""Fetch a release over HTTPS with httpx: https only, redirects only to https, no stall.

* The URL and every redirect must be `https://`; anything else ends the
  download with one sentence (`DownloadError`) before a byte is read from it.
  Redirects are followed here, by hand, at most `MAX_REDIRECTS`, so each hop is
  checked before it is dialled.
* The server's certificate is checked against the system's roots and the bc
  CA, so a `bc serve` of the same lab (an air-gapped one) is trusted without
  another CA on the host.
* A stalled or trickling transfer ends: fewer than `min_bytes` (1 MiB) in any
  window of `window_s` (120 s), both configurable (`bc node
  --download-min-bytes`, `--download-window-s`), and the partial file is
  removed. More bytes than the release's size end it as well.

The bytes go to `dest` through the agent's offload in blocks of 1 MiB, hashed
on the way; the caller compares the digest and size with the signed release.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx

from agent.hashing import BLOCK, hashing_writer
from agent.offload import Offload, to_thread
from bc.seams.clock import Clock, SystemClock

MAX_REDIRECTS = 5
MIN_BYTES = 1 << 20
WINDOW_S = 120.0
CONNECT_TIMEOUT_S = 30.0


class DownloadError(Exception):
    """A download that ended without the whole file; the message is one sentence."""


@dataclass(frozen=True)
class Downloaded:
    sha256: str
    size: int


@dataclass(frozen=True)
class StallGuard:
    """Fewer than `min_bytes` in `window_s` ends the transfer."""

    min_bytes: int = MIN_BYTES
    window_s: float = WINDOW_S


def check_https(url: str, what: str = "the release URL") -> None:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise DownloadError(f"{what} {url!r} is not an https:// URL; releases are fetched over https only")


def ssl_context(ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if ca_pem:
        ctx.load_verify_locations(cadata=ca_pem.decode())
    return ctx


async def download(
    url: str,
    dest: Path,
    *,
    ca_pem: bytes,
    max_size: int,
    guard: StallGuard | None = None,
    clock: Clock | None = None,
    offload: Offload = to_thread,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Downloaded:
    """Fetch `url` into `dest`; DownloadError (and no `dest`) for anything short of the whole file."""
    clock = clock or SystemClock()
    guard = guard or StallGuard()
    check_https(url)
    try:
        async with httpx.AsyncClient(
            verify=ssl_context(ca_pem),
            follow_redirects=False,
            timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None),
            transport=transport,
        ) as client:
            for _ in range(MAX_REDIRECTS + 1):
                # identity: the bytes hashed are the bytes sent, which the signature covers
                async with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as resp:
                    if resp.is_redirect:
                        location = resp.headers.get("location", "")
                        nxt = urljoin(url, location)
                        check_https(nxt, what=f"{url} redirects to")
                        url = nxt
                        continue
                    if resp.status_code != 200:
                        raise DownloadError(f"{url} answered HTTP {resp.status_code}")
                    return await _receive(resp, dest, max_size, guard, clock, offload)
            raise DownloadError(f"{url} redirects more than {MAX_REDIRECTS} times")
    except httpx.HTTPError as e:
        await offload(_remove, dest)
        raise DownloadError(f"fetching {url} failed: {type(e).__name__}: {e}") from None
    except BaseException:
        await offload(_remove, dest)
        raise


async def _receive(
    resp: httpx.Response, dest: Path, max_size: int, guard: StallGuard, clock: Clock, offload: Offload
) -> Downloaded:
    async with hashing_writer(dest, offload) as w:
        chunks = resp.aiter_raw(BLOCK).__aiter__()
        window_start, in_window = clock.monotonic(), 0
        while True:
            remaining = window_start + guard.window_s - clock.monotonic()
            if remaining <= 0:
                if in_window < guard.min_bytes:
                    raise _stalled(guard, in_window)
                window_start, in_window = clock.monotonic(), 0
                continue
            try:
                async with asyncio.timeout(remaining):  # a deadline on the loop: no task per chunk
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                if in_window < guard.min_bytes:
                    raise _stalled(guard, in_window) from None
                continue
            in_window += len(chunk)
            if w.size + len(chunk) > max_size:
                raise DownloadError(f"the server sent more than the release's {max_size} bytes")
            await w.write(chunk)
        return Downloaded(await w.finish(), w.size)


def _stalled(guard: StallGuard, got: int) -> DownloadError:
    return DownloadError(
        f"the transfer stalled: {got} bytes in {guard.window_s:g} s, under the {guard.min_bytes} bytes it must move"
    )


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
