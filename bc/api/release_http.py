"""`bc serve --release-listen HOST:PORT`: the releases `bc serve` keeps, over HTTPS, for nodes to fetch.

An air-gapped lab has no other web server, so `bc serve` serves the files
`bc release publish` uploaded, from `<data-dir>/releases/<sha256>`, with the
same server certificate as its gRPC port (issued by the bc CA, which every
node trusts). Nodes need no client certificate: a release is public bytes,
and what makes it safe is its signature, which the node checks.

The server is the smallest HTTP/1.1 that does the job: `GET` or `HEAD` of
`/releases/<sha256>` (64 lowercase hex digits, nothing else reaches the
filesystem), one request per connection, the file streamed in 1 MiB blocks
read off the loop. Anything else is 404 or 405.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import tempfile
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

PATH_RE = re.compile(r"/releases/([0-9a-f]{64})")
BLOCK = 1 << 20
REQUEST_TIMEOUT_S = 30.0


def url_for(advertise: str, sha256: str) -> str:
    return f"https://{advertise}/releases/{sha256}"


class ReleaseServer:
    def __init__(self, root: Path, cert_pem: bytes, key_pem: bytes) -> None:
        self.root = root
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        root.mkdir(parents=True, exist_ok=True)
        # ssl loads a chain only from files: a private temporary directory (0700) holds them for the call.
        with tempfile.TemporaryDirectory(prefix="bc-release-tls-") as tmp:
            certfile, keyfile = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            certfile.write_bytes(cert_pem)
            fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key_pem)
            self.ctx.load_cert_chain(certfile, keyfile)
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(self._handle, host, port, ssl=self.ctx)
        self.port = int(self.server.sockets[0].getsockname()[1])
        log.info("event=releases.listening host=%s port=%d", host, self.port)
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            target = rest.split(" ", 1)[0]
            await self._answer(method, target, writer)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, ssl.SSLError):
                pass

    async def _answer(self, method: str, target: str, writer: asyncio.StreamWriter) -> None:
        if method not in ("GET", "HEAD"):
            return await _status(writer, 405, "Method Not Allowed")
        m = PATH_RE.fullmatch(target)
        path = self.root / m.group(1) if m else None
        if path is None or not await asyncio.to_thread(path.is_file):
            return await _status(writer, 404, "Not Found")
        f: BinaryIO = await asyncio.to_thread(path.open, "rb")
        try:
            size = await asyncio.to_thread(lambda: path.stat().st_size)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                + f"Content-Length: {size}\r\nConnection: close\r\n\r\n".encode()
            )
            if method == "GET":
                while block := await asyncio.to_thread(f.read, BLOCK):
                    writer.write(block)
                    await writer.drain()
            await writer.drain()
        finally:
            await asyncio.to_thread(f.close)
        log.info("event=releases.served sha256=%s method=%s", m.group(1) if m else "", method)


async def _status(writer: asyncio.StreamWriter, code: int, text: str) -> None:
    writer.write(f"HTTP/1.1 {code} {text}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
