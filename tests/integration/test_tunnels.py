"""Tunnels end to end in process: a real `bc serve`, a real agent, real gRPC and TLS, a TCP port on the node.

What an operator observes: bytes reach the node's loopback port and come back, through the node's own
outbound connection; a ticket opens one tunnel only; a ticket for another node or sid is refused by the node;
the tunnel is recorded with who, which node, start, end and bytes (docs/access.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from bc.client.tunnel import TunnelClient
from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()


def client(lab: InprocLab) -> TunnelClient:
    assert lab.server.operator_config is not None
    return TunnelClient(OperatorConfig.load(lab.server.operator_config))


async def ready(lab: InprocLab, node_id: str = "n1") -> None:
    await lab.join(node_id)
    await lab.start_node(node_id)
    await lab.wait_connected(node_id)
    # The node pins the exec-ticket JWKS from its access section.
    await lab.wait_event("node.observed", lambda ev, d: ev.subject == node_id, 15)


async def test_bytes_go_through_and_come_back(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    async with client(lab) as c:
        t = await c.connect("n1", "forward", echo_port)
        await t.send(b"hello through the gateway")
        got = b""
        while len(got) < 25:
            chunk = await t.recv()
            assert chunk is not None
            got += chunk
        assert got == b"hello through the gateway"
        await t.close()
    ev = await lab.wait_event("tunnel.closed", lambda ev, d: ev.subject == "n1")
    data = json.loads(ev.data_json)
    assert data["bytes_up"] > 25 and data["bytes_down"] > 25
