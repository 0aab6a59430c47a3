"""Attack: one client address opens connections to the release endpoint and keeps them, to take every slot.
Before, every one was held (for a 60 s TLS handshake timeout); now an address holds at most
`MAX_PER_ADDRESS`: its 17th is closed at once, and a node on another address still downloads."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from bc.api.release_limits import MAX_PER_ADDRESS
from tests.security.relserver_helpers import download, release_server, stalled_tcp


async def test_one_address_gets_16_connections_and_its_17th_is_closed_at_once(tmp_path: Path) -> None:
    assert MAX_PER_ADDRESS == 16
    async with release_server(tmp_path, 1 << 16) as srv:
        held = [stalled_tcp(srv.port, "127.0.0.9") for _ in range(MAX_PER_ADDRESS)]
        try:
            # The 16 are accepted and held: each still open once the server has taken them all in.
            loop = asyncio.get_running_loop()
            r, w = await asyncio.open_connection("127.0.0.1", srv.port, local_addr=("127.0.0.9", 0))
            async with asyncio.timeout(3):  # closed by the server at once: no bytes, the end of the stream
                assert await r.read(1) == b""
            w.close()
            await srv.wait_log("refused_per_address=1", timeout=5)
            for s in held:  # the first 16 are still open: nothing to read, no end of stream
                try:
                    assert await asyncio.wait_for(loop.sock_recv(s, 1), 0.05) != b""
                except TimeoutError:
                    pass
            # Another address is not held back by this one.
            assert hashlib.sha256(await download(srv, source="127.0.0.10")).hexdigest() == srv.sha256
        finally:
            for s in held:
                s.close()
