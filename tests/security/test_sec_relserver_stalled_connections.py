"""Attack: 600 stalled connections on the release HTTPS endpoint (`bc serve --release-listen`), from many
addresses: half plain TCP that never sends a ClientHello, half that finish TLS and never send a request.
Before, each held a file descriptor and a task for 30 to 60 s, without bound; now the endpoint holds at most
`MAX_CONNECTIONS`, pushes the oldest idle one out for a newcomer, and a node's download is served within a
second while the flood is still open."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

from bc.api.release_limits import MAX_CONNECTIONS, MAX_PER_ADDRESS
from tests.security.relserver_helpers import download, release_server, stalled_tcp, stalled_tls

FLOOD = 600
ADDRESSES = 40  # 15 a piece: under the per-address cap, so it is the overall cap that must hold


async def test_600_stalled_connections_leave_a_download_served_within_a_second_and_the_server_bounded(
    tmp_path: Path,
) -> None:
    async with release_server(tmp_path, 1 << 20) as srv:
        assert hashlib.sha256(await download(srv)).hexdigest() == srv.sha256
        fds0, rss0 = srv.fds(), srv.rss_kib()
        sources = [f"127.0.0.{2 + i % ADDRESSES}" for i in range(FLOOD)]
        assert FLOOD // ADDRESSES <= MAX_PER_ADDRESS
        plain = [stalled_tcp(srv.port, s) for s in sources[: FLOOD // 2]]
        tls = await asyncio.gather(*(stalled_tls(srv, s) for s in sources[FLOOD // 2 :]))
        try:
            # Every one of the 600 has reached the server by now: the TLS ones finished their handshakes (or
            # were closed), and the plain ones queued before them were accepted first. The attacker keeps
            # its ends open.
            fds, rss = srv.fds(), srv.rss_kib()
            assert fds - fds0 <= MAX_CONNECTIONS + 8, f"{fds - fds0} more descriptors open under the flood"
            # A TLS connection costs asyncio a 256 KiB read buffer and more: 1 MiB a slot bounds it.
            assert rss - rss0 < MAX_CONNECTIONS * 1024, f"the server grew by {(rss - rss0) // 1024} MiB"
            t0 = time.monotonic()
            body = await download(srv)
            took = time.monotonic() - t0
            assert hashlib.sha256(body).hexdigest() == srv.sha256
            # The goal is under a second (0.01 s on an idle 2-core machine, printed with `-s`); the bound
            # here is loose so a busy CI machine does not flake it, and still far below the 30 to 60 s a
            # starved endpoint took before.
            print(f"download under a flood of {FLOOD}: {took:.3f} s")
            assert took < 10.0, f"the download took {took:.2f} s under the flood"
            # The operator is told, in a line, not a line per connection.
            await srv.wait_log("event=releases.dropped", timeout=5)
            assert sum("event=releases.dropped" in line for line in srv.log) <= 2, srv.log
        finally:
            for s in plain:
                s.close()
            for w in tls:
                if w is not None:
                    w.transport.abort()
