"""A tunnel that ends leaves nothing behind on its node: the node's side ends with it, not with its session.

What an operator observes: the node logs `tunnel.ended` with a normal reason (`closed`) within a bound after
the tunnel closed, whichever side ended it (the operator's `bc` with its exit code, the node's port, an admin's
close), and its count of open tunnels goes back to zero (docs/access.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from agent.tunnel.service import DRAIN_S
from bc.client.tunnel import OpenTunnel, TunnelClient
from bc.errors import BcError
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.conftest import tunnel_client as client

ENDED_WITHIN_S = 3.0
"""The node's side ends within this of the tunnel's end (the relay's own grace for the other side is 2 s)."""


class _Ended(logging.Handler):
    """The node's `tunnel.ended` lines, each setting the event of its sid as it is logged."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.why: dict[str, str] = {}
        self.seen: dict[str, asyncio.Event] = {}

    def event(self, sid: str) -> asyncio.Event:
        return self.seen.setdefault(sid, asyncio.Event())

    def emit(self, record: logging.LogRecord) -> None:
        m = re.match(r"event=tunnel\.ended sid=(\S+) why=(\S+)", record.getMessage())
        if m:
            self.why[m[1]] = m[2]
            self.event(m[1]).set()


@pytest.fixture
def ended() -> Iterator[_Ended]:
    h = _Ended()
    logger = logging.getLogger("agent.tunnel")
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(h)
    try:
        yield h
    finally:
        logger.removeHandler(h)
        logger.setLevel(old)


@pytest.fixture
async def lab(tmp_path: Path, store_url: str) -> AsyncIterator[InprocLab]:
    async with open_lab(tmp_path, store=store_url, tunnels=True) as lab:
        await lab.join("n1")
        await lab.start_node("n1")
        await lab.wait_connected("n1")
        await lab.wait_event("node.observed", lambda ev, d: ev.subject == "n1", 15)
        yield lab


async def open_echo(c: TunnelClient, port: int) -> OpenTunnel:
    t = await c.connect("n1", "forward", port)
    await t.send(b"ping")
    got = b""
    while len(got) < 4:
        chunk = await t.recv()
        assert chunk is not None
        got += chunk
    assert got == b"ping"
    return t


async def node_side_over(lab: InprocLab, ended: _Ended, sid: str, within_s: float = ENDED_WITHIN_S) -> str:
    """The node's reason for `sid`'s end, logged within `within_s`; the node holds no tunnel after it."""
    try:
        async with asyncio.timeout(within_s):
            await ended.event(sid).wait()
    except TimeoutError:
        raise AssertionError(f"the node's side of tunnel {sid} still runs {within_s} s after its end") from None
    tunnels = lab.agents["n1"].tunnels
    assert sid not in tunnels.open and not tunnels.open
    return ended.why[sid]


async def test_the_node_side_ends_when_the_operator_closes_with_an_exit_code(
    lab: InprocLab, echo_port: int, ended: _Ended
) -> None:
    async with client(lab) as c:
        t = await open_echo(c, echo_port)
        assert t.ticket.sid in lab.agents["n1"].tunnels.open
        await t.close(exit_code=0)
        assert await node_side_over(lab, ended, t.ticket.sid) == "closed"
        # The session goes on: the node still answers a new tunnel.
        t2 = await open_echo(c, echo_port)
        await t2.close()
        assert await node_side_over(lab, ended, t2.ticket.sid) == "closed"


async def test_the_node_side_ends_when_an_admin_closes_the_tunnel(
    lab: InprocLab, echo_port: int, ended: _Ended
) -> None:
    async with client(lab) as c:
        t = await open_echo(c, echo_port)
        rec = await c.close_tunnel(t.ticket.sid, reason="done here")
        assert rec.state == "closed"
        assert await node_side_over(lab, ended, t.ticket.sid) == "cut"


async def test_the_node_side_ends_when_the_operator_cuts_the_stream(
    lab: InprocLab, echo_port: int, ended: _Ended
) -> None:
    async with client(lab) as c:
        t = await open_echo(c, echo_port)
        t.call.cancel()  # `bc` killed: no close_notify, no `end`
        assert await node_side_over(lab, ended, t.ticket.sid) == "cut"


async def test_the_node_side_ends_when_its_port_keeps_the_connection_after_the_operator_closes(
    lab: InprocLab, ended: _Ended
) -> None:
    """A local service that answers the half-close with nothing and keeps its connection (the production case)."""

    done = asyncio.Event()

    async def keeps(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(4))
        await writer.drain()
        await reader.read()  # EOF from the node, then nothing: the connection stays open until the test's end
        await done.wait()
        writer.close()

    server = await asyncio.start_server(keeps, "127.0.0.1", 0)
    try:
        async with client(lab) as c:
            t = await open_echo(c, int(server.sockets[0].getsockname()[1]))
            with contextlib.suppress(BcError, grpc.aio.AioRpcError):
                await t.close(exit_code=0)
            assert await node_side_over(lab, ended, t.ticket.sid, DRAIN_S + ENDED_WITHIN_S) == "closed"
    finally:
        done.set()
        server.close()
