"""The boot server's HTTP half: iPXE scripts for live leases and the cached images they name.

Built in (h11 over asyncio, which httpx already brings) rather than a second daemon: what it serves is
decided per request by the agent's own state (the live leases, the cache's fresh digest check), and there
are three routes, all GET, one request per connection:

* `/boot.ipxe`: the chain script (to `boot/<mac>.ipxe`);
* `/boot/<mac>.ipxe`: the machine's script, only while its lease is live; else 404;
* `/images/<sha256>`: a cached image, only while a live lease names it (its kernel, its initramfs, or one of
  its `images`: the OS image `deploy.image` streams from here) and only when its bytes hash to
  the digest at this request (`ImageCache.open_verified`); else 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable

import h11

from agent.site import boot_config
from agent.site.image_cache import ImageCache
from agent.site.leases import Lease

log = logging.getLogger(__name__)

MACHINE_SCRIPT = re.compile(r"/boot/([0-9a-f]{2}(?::[0-9a-f]{2}){5})\.ipxe")
IMAGE = re.compile(r"/images/([0-9a-f]{64})")
CHUNK = 1 << 16

LiveLeases = Callable[[], dict[str, Lease]]
"""The live leases by MAC, now."""


class BootHttp:
    def __init__(self, cache: ImageCache, live_by_mac: LiveLeases, http_address: Callable[[], str]) -> None:
        self.cache = cache
        self.live_by_mac = live_by_mac
        self.http_address = http_address
        self.server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[object]] = set()

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and end the connections being served (3.11's wait_closed does not wait for them)."""
        if self.server is not None:
            self.server.close()
            conns, self._conns = list(self._conns), set()
            for t in conns:
                t.cancel()
            await asyncio.gather(*conns, return_exceptions=True)
            await self.server.wait_closed()
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        conn = h11.Connection(h11.SERVER)
        try:
            async with asyncio.timeout(30):
                event = await self._next_request(conn, reader)
            if event is not None:
                await self._answer(conn, writer, event)
        except (TimeoutError, ConnectionError, h11.ProtocolError) as e:
            log.debug("event=site.http.dropped error=%r", str(e))
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _next_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Request | None:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(CHUNK))
                continue
            return event if isinstance(event, h11.Request) else None

    async def _answer(self, conn: h11.Connection, writer: asyncio.StreamWriter, req: h11.Request) -> None:
        path = req.target.decode("ascii", errors="replace").split("?", 1)[0]
        if req.method != b"GET":
            return await self._small(conn, writer, 405, b"")
        if path == "/boot.ipxe":
            return await self._small(conn, writer, 200, boot_config.chain_script(self.http_address()).encode())
        m = MACHINE_SCRIPT.fullmatch(path)
        if m is not None:
            lease = self.live_by_mac().get(m.group(1))
            if lease is None:
                log.info("event=site.http.no-lease mac=%s", m.group(1))
                return await self._small(conn, writer, 404, b"")
            script = boot_config.machine_script(lease, self.http_address())
            return await self._small(conn, writer, 200, script.encode())
        m = IMAGE.fullmatch(path)
        if m is not None:
            sha = m.group(1)
            named = any(lease.serves(sha) for lease in self.live_by_mac().values())
            f = await self.cache.open_verified(sha) if named else None
            if f is None:
                return await self._small(conn, writer, 404, b"")
            try:
                size = await self.cache.offload(lambda: f.seek(0, 2))
                await self.cache.offload(f.seek, 0)
                headers = [("Content-Length", str(size)), ("Content-Type", "application/octet-stream")]
                writer.write(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
                while chunk := await self.cache.offload(f.read, CHUNK):
                    writer.write(conn.send(h11.Data(data=chunk)) or b"")
                    await writer.drain()
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
            finally:
                await self.cache.offload(f.close)
            log.info("event=site.http.image-served sha256=%s bytes=%d", sha, size)
            return None
        return await self._small(conn, writer, 404, b"")

    async def _small(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        headers = [("Content-Length", str(len(body))), ("Content-Type", "text/plain"), ("Connection", "close")]
        writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
        writer.write(conn.send(h11.Data(data=body)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
