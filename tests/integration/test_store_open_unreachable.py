"""A store that is not there yet is waited for; one that answered with a refusal is said at once.

`bc serve` started while its PostgreSQL is still starting (or failing over) used to exit 5 at once, and
under systemd was restarted blind; now its start retries the open with back-off, logging why at each
attempt. What it must never wait for is an answer: a wrong database or password is the operator's to fix.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from bc.assembly.server import Seams, ServeOptions, Server
from bc.pki.secrets_source import SystemSecrets, os_seeded_random
from bc.seams.clock import Clock, SystemClock
from bc.store import Store, StoreError, StoreUnreachable, open_store
from tests.pg import postgres_url

TIMEOUT_S = 60.0


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that nothing listens on (bound, never listened: connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


async def test_a_postgresql_that_refuses_connections_is_unreachable(closed_port: int) -> None:
    with pytest.raises(StoreUnreachable, match="refused"):
        await open_store(f"postgresql://postgres@127.0.0.1:{closed_port}/test")


async def test_a_database_that_answers_with_a_refusal_is_not_waited_for() -> None:
    parts = urlsplit(postgres_url())
    missing = urlunsplit(parts._replace(path="/bc_no_such_database"))
    with pytest.raises(StoreError) as raised:
        await open_store(missing)
    assert not isinstance(raised.value, StoreUnreachable)
    assert "bc_no_such_database" in str(raised.value)


async def test_bc_serve_waits_for_a_store_not_reached_yet_then_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "bc.assembly.retry")
    attempts: list[str] = []
    tried = asyncio.Event()
    reachable = asyncio.Event()

    async def opener(url: str, clock: Clock) -> Store:
        attempts.append(url)
        tried.set()
        if not reachable.is_set():
            raise StoreUnreachable("cannot open the store (the test's): connection refused")
        return await open_store(url, clock)

    seams = Seams(SystemClock(), os_seeded_random(), SystemSecrets(), store_opener=opener)
    server = Server(ServeOptions(data_dir=tmp_path / "server", listen="127.0.0.1:0"), seams)
    start = asyncio.create_task(server.start())
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while len(attempts) < 2:  # a second attempt: the first failure was waited out, not fatal
                tried.clear()
                await tried.wait()
        assert not start.done(), "the start waits for the store instead of failing"
        lines = [m for m in caplog.messages if "event=start.retrying" in m]
        assert lines and "step=store-open attempt=1" in lines[0] and "connection refused" in lines[0]
        reachable.set()
        async with asyncio.timeout(TIMEOUT_S):
            await start
        assert server.loops
    finally:
        if start.done() and start.exception() is None:
            await server.stop()
        else:
            start.cancel()
