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

Anyone who reaches the port can open connections, so each is bounded
(`bc.api.release_limits`): the server accepts plain TCP and counts the
connection before it starts TLS, so a connection that never finishes its
handshake holds a slot, and a timeout, like any other; the caps are checked
at accept, before a byte is read. Drops are logged as one summary line per
interval (`bc.api.release_droplog`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bc.api.release_droplog import DropLog
from bc.api.release_limits import ReleaseLimits

log = logging.getLogger(__name__)

PATH_RE = re.compile(r"/releases/([0-9a-f]{64})")
BLOCK = 1 << 20


def url_for(advertise: str, sha256: str) -> str:
    return f"https://{advertise}/releases/{sha256}"


class _Dropped(Exception):
    """The connection ends without an answer; `kind` says why (`bc.api.release_droplog.KINDS`)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass(eq=False)
class _Conn:
    address: str
    transport: asyncio.WriteTransport
    task: asyncio.Task[None] | None
    waiting_head: bool = True  # no full request head yet: the one a newcomer may push out at the cap
    evicted: bool = False


@dataclass
class ReleaseStats:
    """What the server holds now: for tests, figures and the summary line."""

    open: int = 0
    by_address: Counter[str] = field(default_factory=Counter)


class ReleaseServer:
    def __init__(self, root: Path, cert_pem: bytes, key_pem: bytes, limits: ReleaseLimits | None = None) -> None:
        self.root = root
        self.limits = limits or ReleaseLimits()
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
        self._conns: dict[_Conn, None] = {}  # insertion order: the oldest first
        self._by_address: Counter[str] = Counter()
        self._drops: DropLog | None = None
        self._flusher: asyncio.Task[None] | None = None

    @property
    def drops(self) -> DropLog:
        assert self._drops is not None, "start first"
        return self._drops

    def stats(self) -> ReleaseStats:
        return ReleaseStats(len(self._conns), Counter(self._by_address))

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._drops = DropLog(self.limits.log_summary_every_s, loop.time())
        # Plain TCP here, TLS started per connection once it has a slot (`_handle`).
        self.server = await asyncio.start_server(self._handle, host, port, limit=self.limits.max_head_bytes)
        self.port = int(self.server.sockets[0].getsockname()[1])
        self._flusher = asyncio.create_task(self._flush_loop(), name="releases-droplog")
        log.info(
            "event=releases.listening host=%s port=%d max_connections=%d max_per_address=%d",
            host,
            self.port,
            self.limits.max_connections,
            self.limits.max_per_address,
        )
        return self.port

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        if self.server is not None:
            self.server.close()
            for c in list(self._conns):
                c.transport.abort()
            await self.server.wait_closed()
        self._summary()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.limits.log_summary_every_s)
            self._summary()

    def _summary(self) -> None:
        if self._drops is not None and (line := self._drops.due(asyncio.get_running_loop().time())):
            self._log_drops(line)

    def _drop(self, kind: str) -> None:
        if line := self.drops.note(kind, asyncio.get_running_loop().time()):
            self._log_drops(line)

    def _log_drops(self, line: str) -> None:
        log.warning(
            "event=releases.dropped %s open=%d every_s=%.0f", line, len(self._conns), self.limits.log_summary_every_s
        )

    def _admit(self, address: str, transport: asyncio.WriteTransport) -> _Conn | None:
        """A slot for a new connection, or None (refused, counted). At the overall cap the oldest connection
        still waiting for its request head is pushed out: it has cost the least, and it is what a flood of
        idle connections is made of."""
        if self._by_address[address] >= self.limits.max_per_address:
            self._drop("refused_per_address")
            return None
        if len(self._conns) >= self.limits.max_connections:
            oldest = next((c for c in self._conns if c.waiting_head), None)
            if oldest is None:
                self._drop("refused_full")
                return None
            self._forget(oldest)
            oldest.evicted = True
            oldest.transport.abort()
            self._drop("evicted")
        conn = _Conn(address, transport, asyncio.current_task())
        self._conns[conn] = None
        self._by_address[address] += 1
        return conn

    def _forget(self, conn: _Conn) -> None:
        if conn in self._conns:  # not yet forgotten (an eviction forgets it before its handler ends)
            del self._conns[conn]
            self._by_address[conn.address] -= 1
            if not self._by_address[conn.address]:
                del self._by_address[conn.address]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        conn = self._admit(str(peer[0]) if peer else "?", writer.transport)
        if conn is None:
            writer.transport.abort()
            return
        try:
            try:
                async with asyncio.timeout(self.limits.head_timeout_s):
                    await _start_tls(writer, self.ctx)
                    head = await reader.readuntil(b"\r\n\r\n")
            except TimeoutError:
                raise _Dropped("head_timeout") from None
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError, ssl.SSLError):
                raise _Dropped("bad_request") from None
            conn.waiting_head = False
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            target = rest.split(" ", 1)[0]
            await self._answer(method, target, writer)
            writer.close()
            async with asyncio.timeout(self.limits.write_stall_s):  # the TLS close_notify, as any write
                await writer.wait_closed()
        except _Dropped as e:
            if not conn.evicted:  # an eviction was counted when it happened
                self._drop(e.kind)
        except (TimeoutError, OSError, ssl.SSLError):
            pass  # the peer went away, or did not take the close: the transport is aborted below
        finally:
            self._forget(conn)
            # No-op after a clean close; never waits on a peer that reads nothing. The TLS transport, once
            # started (a start_tls cut short leaves the writer none), and the TCP one under it.
            if writer.transport is not None:
                writer.transport.abort()
            conn.transport.abort()

    async def _answer(self, method: str, target: str, writer: asyncio.StreamWriter) -> None:
        if method not in ("GET", "HEAD"):
            self._drop("not_found")
            return await self._send(writer, _status(405, "Method Not Allowed"))
        m = PATH_RE.fullmatch(target)
        path = self.root / m.group(1) if m else None
        if path is None or not await asyncio.to_thread(path.is_file):
            self._drop("not_found")
            return await self._send(writer, _status(404, "Not Found"))
        f: BinaryIO = await asyncio.to_thread(path.open, "rb")
        try:
            size = await asyncio.to_thread(lambda: path.stat().st_size)
            await self._send(
                writer,
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                + f"Content-Length: {size}\r\nConnection: close\r\n\r\n".encode(),
            )
            if method == "GET":
                while block := await asyncio.to_thread(f.read, BLOCK):
                    await self._send(writer, block)
        finally:
            await asyncio.to_thread(f.close)
        log.info("event=releases.served sha256=%s method=%s", m.group(1) if m else "", method)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write `data` a slice at a time; a slice the peer does not take within `write_stall_s` drops it."""
        step = self.limits.write_slice
        view = memoryview(data)
        for i in range(0, len(view), step):
            writer.write(view[i : i + step])
            try:
                async with asyncio.timeout(self.limits.write_stall_s):
                    await writer.drain()
            except TimeoutError:
                raise _Dropped("write_stalled") from None


async def _start_tls(writer: asyncio.StreamWriter, ctx: ssl.SSLContext) -> None:
    """TLS on an accepted connection. CPython 3.11's `StreamWriter.start_tls` on a connection lost during the
    handshake (a peer gone, or one pushed out at the cap) gets no transport back and fails on it with an
    AttributeError, leaving the writer without a transport: that is a connection reset, not a bug to log with a
    traceback for each, and the writer gets its TCP transport back so that it can be closed."""
    raw = writer.transport
    try:
        await writer.start_tls(ctx)
    except AttributeError:
        setattr(writer, "_transport", raw)  # noqa: B010 (private to asyncio: what start_tls replaced)
        raise ConnectionResetError("the connection was lost during the TLS handshake") from None


def _status(code: int, text: str) -> bytes:
    return f"HTTP/1.1 {code} {text}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
