"""The release download: `bc serve`'s HTTPS release server and httpx on 127.0.0.1, real TLS under a bc CA.

https only, redirects only to https, a stalled or trickling transfer ends, more bytes than the release's size
end it, and nothing is left behind when it fails."""

from __future__ import annotations

import asyncio
import hashlib
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from agent.upgrade.download import DownloadError, StallGuard, download
from bc.api.release_http import ReleaseServer, url_for
from bc.pki import keys
from bc.pki.ca import CertificateAuthority
from bc.pki.secrets_source import SystemSecrets, p256_key
from bc.seams.clock import SystemClock

DATA = random.Random(7).randbytes(3 * (1 << 20) + 17)
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture(scope="module")
def pki() -> tuple[bytes, bytes, bytes]:
    """(ca_pem, server cert chain pem, server key pem) for 127.0.0.1."""
    ca = CertificateAuthority.create(SystemClock(), random.Random(1), SystemSecrets())
    key = p256_key(SystemSecrets())
    cert = ca.issue_server_cert(["127.0.0.1"], key)
    return ca.ca_pem, keys.cert_to_pem(cert) + ca.ca_pem, keys.key_to_pem(key)


@pytest.fixture
async def server(tmp_path: Path, pki: tuple[bytes, bytes, bytes]) -> AsyncIterator[str]:
    root = tmp_path / "releases"
    root.mkdir()
    (root / SHA).write_bytes(DATA)
    srv = ReleaseServer(root, pki[1], pki[2])
    port = await srv.start("127.0.0.1", 0)
    yield f"127.0.0.1:{port}"
    await srv.stop()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def custom_server(pki: tuple[bytes, bytes, bytes], tmp: Path, handler: Handler) -> tuple[asyncio.Server, int]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    (tmp / "c.pem").write_bytes(pki[1])
    (tmp / "k.pem").write_bytes(pki[2])
    ctx.load_cert_chain(tmp / "c.pem", tmp / "k.pem")

    async def wrapped(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readuntil(b"\r\n\r\n")
            await handler(r, w)
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(wrapped, "127.0.0.1", 0, ssl=ctx)
    return srv, int(srv.sockets[0].getsockname()[1])


async def test_the_release_server_serves_a_release_that_downloads_whole(
    server: str, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    dest = tmp_path / "bc.b.partial"
    got = await download(url_for(server, SHA), dest, ca_pem=pki[0], max_size=len(DATA))
    assert (got.sha256, got.size) == (SHA, len(DATA))
    assert dest.read_bytes() == DATA


async def test_an_unknown_release_is_404_and_leaves_nothing(
    server: str, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    dest = tmp_path / "x"
    with pytest.raises(DownloadError, match="answered HTTP 404"):
        await download(url_for(server, "0" * 64), dest, ca_pem=pki[0], max_size=10)
    with pytest.raises(DownloadError, match="answered HTTP 404"):
        await download(f"https://{server}/releases/../../etc/passwd", dest, ca_pem=pki[0], max_size=10)
    assert not dest.exists()


async def test_a_server_outside_the_bc_ca_is_refused(server: str, tmp_path: Path) -> None:
    other = CertificateAuthority.create(SystemClock(), random.Random(2), SystemSecrets()).ca_pem
    with pytest.raises(DownloadError, match="ConnectError"):
        await download(url_for(server, SHA), tmp_path / "x", ca_pem=other, max_size=len(DATA))


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/releases/x", "ftp://h/x", "https:///x", "file:///etc/passwd"])
async def test_only_https_urls(url: str, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="is not an https:// URL"):
        await download(url, tmp_path / "x", ca_pem=b"", max_size=1)


async def test_a_redirect_to_https_is_followed_and_to_http_is_refused(
    server: str, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    async def to(location: str) -> Handler:
        async def h(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())
            await w.drain()

        return h

    good, good_port = await custom_server(pki, tmp_path, await to(url_for(server, SHA)))
    bad, bad_port = await custom_server(pki, tmp_path, await to(f"http://{server}/releases/{SHA}"))
    try:
        got = await download(f"https://127.0.0.1:{good_port}/r", tmp_path / "ok", ca_pem=pki[0], max_size=len(DATA))
        assert got.sha256 == SHA
        with pytest.raises(DownloadError, match=r"redirects to 'http://.*' is not an https:// URL"):
            await download(f"https://127.0.0.1:{bad_port}/r", tmp_path / "no", ca_pem=pki[0], max_size=len(DATA))
        assert not (tmp_path / "no").exists()
    finally:
        good.close()
        bad.close()


@pytest.mark.parametrize("trickle", [False, True])
async def test_a_stalled_or_trickling_transfer_ends(
    trickle: bool, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    done = asyncio.Event()

    async def h(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 100)
        await w.drain()
        while trickle and not done.is_set():  # 100 bytes every 20 ms: alive, far under the floor
            w.write(b"x" * 100)
            await w.drain()
            await asyncio.sleep(0.02)
        await done.wait()

    srv, port = await custom_server(pki, tmp_path, h)
    guard = StallGuard(min_bytes=64 * 1024, window_s=0.5)
    try:
        with pytest.raises(DownloadError, match=r"the transfer stalled: .* in 0.5 s, under the 65536 bytes"):
            await download(f"https://127.0.0.1:{port}/r", tmp_path / "p", ca_pem=pki[0], max_size=10**6, guard=guard)
        assert not (tmp_path / "p").exists()
    finally:
        done.set()
        srv.close()


async def test_more_bytes_than_the_release_end_the_transfer(
    server: str, pki: tuple[bytes, bytes, bytes], tmp_path: Path
) -> None:
    with pytest.raises(DownloadError, match="more than the release's 1000 bytes"):
        await download(url_for(server, SHA), tmp_path / "p", ca_pem=pki[0], max_size=1000)
    assert not (tmp_path / "p").exists()
