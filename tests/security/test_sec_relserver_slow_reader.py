"""Attack: a client asks the release endpoint for a release and then reads nothing, to hold the server's
buffers, descriptor and task for as long as it likes. Before, the server's write waited forever; now a
response that makes no progress for the write-stall limit is dropped, and the drop is logged."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

from tests.security.relserver_helpers import client_context, release_server

SIZE = 32 << 20  # far more than the socket buffers of both ends hold


async def test_a_reader_that_stops_reading_is_cut_off(tmp_path: Path) -> None:
    async with release_server(tmp_path, SIZE, write_stall_s=1.0) as srv:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.port))
        sock.setblocking(False)
        r, w = await asyncio.open_connection(sock=sock, ssl=client_context(srv.ca_pem), server_hostname="127.0.0.1")
        w.write(f"GET /releases/{srv.sha256} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        w.transport.pause_reading()  # the attack: read nothing more

        line = await srv.wait_log("write_stalled=1", timeout=15)
        assert "event=releases.dropped" in line, line

        # What the client gets now: part of the release, then the end of the connection.
        w.transport.resume_reading()
        got = 0
        try:
            async with asyncio.timeout(15):
                while chunk := await r.read(1 << 20):
                    got += len(chunk)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        assert got < SIZE, "the whole release arrived: the server waited for the stalled reader"
        w.transport.abort()
