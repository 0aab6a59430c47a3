"""Finding the gateway that holds a node's session, and the bound on a gateway that does not answer
(`bc.api.tunnel_route`, docs/access.md "Gateways"); SQLite and PostgreSQL.

The relay itself, across real processes, is tests/e2e/test_tunnel_route.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from bc.api.tunnel_route import GatewayRoute
from bc.control.base.bus import Bus
from bc.control.trust import tunnels as tunnels_ctl
from bc.errors import Unavailable
from bc.pki import keys
from bc.pki.identity import make_csr
from bc.pki.secrets_source import SystemSecrets, p256_key
from bc.protocol.pb.tunnel_pb2 import TunnelFrame, TunnelOpen
from bc.store import gateway_keys as gk_sql
from bc.wire.stubs import tunnel_pb2_grpc
from bc.wire.tls import channel_credentials
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.test_tunnels import client, closed_within, read_exactly, ready


@pytest.fixture
async def lab(tmp_path: Path, store_url: str) -> AsyncIterator[InprocLab]:
    async with open_lab(tmp_path, store=store_url, tunnels=True) as lab:
        yield lab


def _insecure() -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials()


async def test_the_route_is_the_sessions_gateway_while_its_registration_lives(lab: InprocLab) -> None:
    store = lab.server.store
    assert store is not None
    route = GatewayRoute(store, _insecure)
    await lab.join("n1")
    await lab.start_node("n1")
    await lab.wait_connected("n1")
    await asyncio.wait_for(lab.server.gateway_registered.wait(), 10)

    assert await route.find("n1") == (lab.server.gateway_id, lab.server.gateway_address)
    with pytest.raises(Unavailable, match="no session on any gateway"):
        await route.find("n9")

    # The gateway's registration gone (a gateway stopped, or its lease expired): no address to dial.
    async with store.transaction() as tx:
        await gk_sql.unregister_gateway(tx, lab.server.gateway_id)
    with pytest.raises(Unavailable, match="no live address"):
        await route.find("n1")
    now_ms = await store.now_ms()
    async with store.transaction() as tx:  # expired a moment ago: the same
        await gk_sql.register_gateway(tx, lab.server.gateway_id, lab.server.gateway_address, now_ms - 10, 5)
    with pytest.raises(Unavailable, match="no live address"):
        await route.find("n1")


async def test_a_gateway_that_accepts_and_stays_silent_is_answered_within_the_bound(lab: InprocLab) -> None:
    """A hung gateway (its port accepts, nothing answers): `open` gives up after `answer_s`, never hangs."""
    store = lab.server.store
    assert store is not None
    held: list[asyncio.StreamWriter] = []

    async def silent(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        held.append(w)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    route = GatewayRoute(store, _insecure, answer_s=0.5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        with pytest.raises(Unavailable, match=r"gateway gw-x .* did not relay the tunnel.*no answer within 0.5 s"):
            await route.open("gw-x", f"127.0.0.1:{port}", "n1", "t-1", "token")
        assert loop.time() - t0 < 2.0
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


async def test_a_close_asked_by_another_api_process_closes_the_tunnel_within_2_s(
    lab: InprocLab, echo_port: int
) -> None:
    """`CloseTunnel` on an api process that does not relay the tunnel asks through the store; the relaying
    process's relay sees it (here through its poll alone: the ask is made on another bus, as another process's
    would be without PostgreSQL's NOTIFY) and ends the tunnel, writing the record with the ask's reason."""
    store = lab.server.store
    assert store is not None
    await ready(lab)
    async with client(lab) as c:
        t = await c.connect("n1", "forward", echo_port)
        await t.send(b"ping")
        assert await read_exactly(t, 4) == b"ping"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await tunnels_ctl.ask_close(store, Bus(), "n1", t.ticket.sid, "closed by root: elsewhere")
        await closed_within(lab, t, 0, 2.0)
        assert loop.time() - t0 < 2.0
    row = await tunnels_ctl.session(store, t.ticket.sid)
    assert row["state"] == "closed" and row["end_reason"] == "closed by root: elsewhere", dict(row)
    assert not await tunnels_ctl.ask_close(store, Bus(), "n1", t.ticket.sid, "again"), "a closed tunnel is not asked"


async def _relay_first(
    lab: InprocLab, creds: grpc.ChannelCredentials, node_id: str, sid: str, token: str
) -> TunnelFrame:
    async with grpc.aio.secure_channel(lab.server.address, creds) as channel:
        call = tunnel_pb2_grpc.GatewayTunnelsStub(channel).Relay()
        await call.write(TunnelFrame(open=TunnelOpen(token=token, node_id=node_id, sid=sid)))
        first = await asyncio.wait_for(call.read(), 15)
        call.cancel()
    assert isinstance(first, TunnelFrame)
    return first


async def _relay_refused(lab: InprocLab, creds: grpc.ChannelCredentials) -> grpc.StatusCode:
    """The status of a relay the gateway refuses at its start. Nothing is written: a write racing the refusal's
    trailers fails in grpc's core, which then reports INTERNAL in place of the server's status (CI saw it)."""
    async with grpc.aio.secure_channel(lab.server.address, creds) as channel:
        call = tunnel_pb2_grpc.GatewayTunnelsStub(channel).Relay()
        code = await asyncio.wait_for(call.code(), 15)
    assert isinstance(code, grpc.StatusCode)
    return code


async def test_the_relay_answers_a_control_plane_certificate_only_and_checks_what_it_is_asked(
    lab: InprocLab, echo_port: int
) -> None:
    """`GatewayTunnels.Relay` on a gateway: a node's certificate is refused; a control-plane one is answered,
    but a ticket for another node or sid than the relay names is refused before any offer reaches the node,
    and a node without a session here is `not-here`."""
    server = lab.server
    assert server.ca is not None and server.store is not None
    await ready(lab)
    key = p256_key(SystemSecrets())
    cert = server.ca.issue_gateway_cert(make_csr(key, "api-2"), "api-2", ["127.0.0.1"], 600)
    process = channel_credentials(server.ca.ca_pem, keys.key_to_pem(key), keys.cert_to_pem(cert))
    node_dir = lab.node_dir("n1")
    node_creds = channel_credentials(
        server.ca.ca_pem, (node_dir / "node.key").read_bytes(), (node_dir / "node.crt").read_bytes()
    )
    await lab.join("n2")  # joined, never started: no session anywhere
    async with client(lab) as c:
        ticket = await c.issue("n1", "forward", echo_port)
        elsewhere = await c.issue("n2", "forward", echo_port)

    assert await _relay_refused(lab, node_creds) == grpc.StatusCode.UNAUTHENTICATED

    first = await _relay_first(lab, process, "n2", ticket.sid, ticket.token)
    assert (first.WhichOneof("msg"), first.refused.reason) == ("refused", "bad-ticket")
    first = await _relay_first(lab, process, "n1", "t-other", ticket.token)
    assert (first.WhichOneof("msg"), first.refused.reason) == ("refused", "bad-ticket")
    first = await _relay_first(lab, process, "n2", elsewhere.sid, elsewhere.token)
    assert (first.WhichOneof("msg"), first.refused.reason) == ("refused", "not-here")
    # None of these reached the node: the real ticket still opens its tunnel, once.
    async with client(lab) as c:
        t = await c.open(ticket)
        await t.send(b"still")
        assert await read_exactly(t, 5) == b"still"
        await t.close()
