"""Tunnels end to end in process: a real `bc serve`, a real agent, real gRPC and TLS, a TCP port on the node.

What an operator observes: bytes reach the node's loopback port and come back, through the node's own
outbound connection; a ticket opens one tunnel only; a ticket for another node or sid is refused by the node;
the tunnel is recorded with who, which node, start, end and bytes (docs/access.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent.session.dialing import SessionLoop
from bc.client.tunnel import OpenTunnel, TunnelClient
from bc.errors import BcError, Conflict, NotFound, TicketRefused, Unauthenticated, UsageError
from bc.gateway import core as gateway_core
from bc.gateway.tunnels import FrameEnd, Relay
from bc.pki import exec_tickets
from bc.pki.secrets_source import SystemSecrets, ed25519_key
from bc.protocol.pb.tunnel_pb2 import TunnelFrame
from bc.wire.tls_pipe import TunnelTampered
from tests.integration.conftest import InprocLab, open_lab
from tests.integration.conftest import tunnel_client as client
from tests.integration.operators_lab import add_operator


@pytest.fixture
async def lab(tmp_path: Path, store_url: str) -> AsyncIterator[InprocLab]:
    """The conftest's lab, with tunnels on (`bc serve --tunnels`)."""
    async with open_lab(tmp_path, store=store_url, tunnels=True) as lab:
        yield lab


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


async def read_exactly(t: OpenTunnel, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = await t.recv()
        assert chunk is not None, f"the tunnel ended after {len(got)} of {n} bytes"
        got += chunk
    return got


async def test_a_ticket_opens_one_tunnel_only(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    async with client(lab) as c:
        ticket = await c.issue("n1", "forward", echo_port)
        t = await c.open(ticket)
        await t.close()
        with pytest.raises(TicketRefused) as e:
            await c.open(ticket)
        assert e.value.reason == "replayed"


async def test_a_viewer_gets_no_ticket_and_a_shell_needs_a_reason(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    viewer = await add_operator(lab, "vera", "viewer")
    async with TunnelClient(viewer) as c:
        with pytest.raises(Unauthenticated, match="operator"):
            await c.issue("n1", "forward", echo_port)
    async with client(lab) as c:
        with pytest.raises(UsageError, match="reason"):
            await c.issue("n1", "shell")
        with pytest.raises(UsageError, match="at most 300"):
            await c.issue("n1", "forward", echo_port, ttl_s=301)
        with pytest.raises(NotFound):
            await c.issue("n9", "forward", echo_port)


# -- a compromised gateway: it offers the node what it likes ----------------------------------------------


async def offer(lab: InprocLab, node_id: str, sid: str, token: str) -> tuple[str, str]:
    """What a compromised gateway can do: offer any token under any sid on the node's Listen stream."""
    verdict, _end, release = await lab.server.gateway.tunnels.connect(node_id, sid, token)
    release.set()
    kind = verdict.WhichOneof("msg")
    return (kind, verdict.refused.reason) if kind == "refused" else (kind, "")


async def test_the_node_refuses_a_replayed_ticket_even_from_its_gateway(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    async with client(lab) as c:
        ticket = await c.issue("n1", "forward", echo_port)
        t = await c.open(ticket)
        await t.close()
    # The gateway kept the token and the sid, and offers them again.
    assert await offer(lab, "n1", ticket.sid, ticket.token) == ("refused", "replayed")
    assert lab.agents["n1"].tunnels.refused["replayed"] == 1


async def test_the_node_refuses_a_ticket_for_another_sid_node_or_key(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    await lab.join("n2")  # known to the control plane, so a ticket can be issued for it
    async with client(lab) as c:
        for_n1 = await c.issue("n1", "forward", echo_port)
        for_n2 = await c.issue("n2", "forward", echo_port)
    assert await offer(lab, "n1", "t-made-up", for_n1.token) == ("refused", "wrong-sid")
    assert await offer(lab, "n1", for_n2.sid, for_n2.token) == ("refused", "wrong-node")
    # A ticket the gateway signs itself, with a key of its own under the real key's id.
    real = exec_tickets.peek(for_n1.token)
    forged_key = exec_tickets.new_key(real.kid, ed25519_key(SystemSecrets()))
    forged = exec_tickets.issue(forged_key, dataclasses.replace(real, jti="f" * 32, sid="t-forged"))
    assert await offer(lab, "n1", "t-forged", forged) == ("refused", "bad-ticket")
    # None of these used up the real ticket: it still opens its tunnel, once.
    async with client(lab) as c:
        t = await c.open(for_n1)
        await t.send(b"ping")
        assert await read_exactly(t, 4) == b"ping"
        await t.close()


def tamper(lab: InprocLab, flip_up: bool) -> None:
    """The gateway's relay, rewriting one byte of the first data frame after the TLS handshake, one way."""
    hub = lab.server.gateway.tunnels
    real = hub.relay

    class Flip:
        def __init__(self, inner: FrameEnd, recv_flip: bool) -> None:
            self.inner, self.recv_flip, self.seen = inner, recv_flip, 0

        async def send(self, frame: TunnelFrame) -> None:
            await self.inner.send(frame)

        async def recv(self) -> TunnelFrame | None:
            f = await self.inner.recv()
            if f is not None and self.recv_flip and f.WhichOneof("msg") == "data":
                self.seen += 1
                if self.seen == 3:  # past the handshake's records: application data
                    data = bytearray(f.data)
                    data[len(data) // 2] ^= 0x01
                    f = TunnelFrame(data=bytes(data))
            return f

    async def relay(r: Relay, operator: FrameEnd, node: FrameEnd) -> None:
        await real(r, Flip(operator, flip_up), Flip(node, not flip_up))

    hub.relay = relay  # type: ignore[method-assign]


@pytest.mark.parametrize("flip_up", [True, False], ids=["to-node", "to-operator"])
async def test_frames_a_gateway_alters_are_detected(lab: InprocLab, flip_up: bool) -> None:
    received = bytearray()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            received.extend(data)
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    await ready(lab)
    tamper(lab, flip_up)
    sent = [bytes([i]) * 1000 for i in range(1, 6)]
    async with client(lab) as c:
        t = await c.connect("n1", "forward", port)
        with pytest.raises(TunnelTampered):
            for chunk in sent:
                await t.send(chunk)
                await read_exactly(t, len(chunk))
        await t.close()
    server.close()
    # Harmless as well as detected: whatever reached the node's port is a prefix of what the operator sent.
    assert b"".join(sent).startswith(bytes(received))
    ev = await lab.wait_event("tunnel.closed", lambda ev, d: ev.subject == "n1")
    assert json.loads(ev.data_json)["bytes_up"] > 0


# -- revocation closes the tunnels it authorised within 2 s -----------------------------------------------


async def open_echo(c: TunnelClient, port: int) -> OpenTunnel:
    t = await c.connect("n1", "forward", port)
    await t.send(b"x")
    assert await read_exactly(t, 1) == b"x"
    return t


async def closed_within(lab: InprocLab, t: OpenTunnel, after_seq: int, limit_s: float = 2.0) -> dict[str, object]:
    """The tunnel's `tunnel.closed` event, published within `limit_s` (loop time); the operator's end sees EOF."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    ev = await lab.wait_event("tunnel.closed", lambda ev, d: ev.seq > after_seq and d["sid"] == t.ticket.sid, 10)
    elapsed = loop.time() - start
    assert elapsed < limit_s, f"the tunnel closed {elapsed:.2f} s after the revocation"
    with contextlib.suppress(BcError, grpc.aio.AioRpcError):
        assert await t.recv() is None
    return dict(json.loads(ev.data_json))


async def test_revoking_the_operator_closes_their_tunnel(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    olga = await add_operator(lab, "olga", "operator")
    async with TunnelClient(olga) as c:
        t = await open_echo(c, echo_port)
        info = await lab.admin.revoke_operator("olga", reason="left the team")
        data = await closed_within(lab, t, (await lab.admin.server_info()).event_seq - 5)
    assert data["operator"] == "olga"
    assert info.name == "olga"


async def test_revoking_the_node_closes_its_tunnels(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    async with client(lab) as c:
        t = await open_echo(c, echo_port)
        seq = (await lab.admin.server_info()).event_seq
        await lab.admin.revoke_node("n1", reason="stolen disk")
        await closed_within(lab, t, seq)


async def test_rotating_the_ticket_key_closes_the_tunnels_of_the_old_key(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    async with client(lab) as c:
        t = await open_echo(c, echo_port)
        seq = (await lab.admin.server_info()).event_seq
        info = await c.rotate_key()
        await closed_within(lab, t, seq)
        assert info.kid != t.ticket.kid and info.nodes_changed == 1
        # A ticket of the new key opens once the node holds the new key set.
        await lab.wait_observed("n1", (await lab.admin.get_spec("n1")).generation)
        t2 = await open_echo(c, echo_port)
        await t2.close()


async def test_tunnels_are_listed_with_who_when_and_bytes(lab: InprocLab, echo_port: int) -> None:
    await ready(lab)
    async with client(lab) as c:
        t = await open_echo(c, echo_port)
        listed = await c.list(open_only=True)
        assert [r.sid for r in listed] == [t.ticket.sid] and listed[0].state == "open"
        await t.close(exit_code=3)
        await lab.wait_event("tunnel.closed", lambda ev, d: d["sid"] == t.ticket.sid)
        (r,) = await c.list(node_id="n1")
    assert (r.operator, r.node_id, r.purpose, r.port, r.state) == ("local", "n1", "forward", echo_port, "closed")
    assert r.opened_at_ms and r.ended_at_ms >= r.opened_at_ms and r.bytes_up > 0 and r.bytes_down > 0
    assert r.has_exit_code and r.exit_code == 3


async def test_tunnels_are_off_until_there_is_a_ticket_key(tmp_path: Path) -> None:
    async with open_lab(tmp_path) as lab:  # `bc serve` without --tunnels
        await lab.join("n1")
        assert "exec_ticket_jwks" not in (await lab.admin.get_spec("n1")).spec_json
        async with client(lab) as c:
            with pytest.raises(Conflict, match="tunnels are off"):
                await c.issue("n1", "forward", 9100)
            info = await c.rotate_key()  # an admin turns them on
            assert info.nodes_changed == 1 and info.kid in info.jwks
            assert (await c.issue("n1", "forward", 9100)).kid == info.kid


# -- how offers reach the node: on its session, or on a Listen stream (an older agent or gateway) ---------


@pytest.mark.parametrize("peer", ["both new", "older agent", "older gateway"])
async def test_tunnels_work_alike_whichever_stream_carries_the_offers(
    lab: InprocLab, echo_port: int, peer: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent and a gateway that both know `tunnel.offers` carry the offers on the session stream (one server
    call a node); an older agent (which does not name it) or an older gateway (which does not answer it) keeps
    the tunnels' Listen stream. The operator sees the same tunnel either way, ended with the node's session."""
    caplog.set_level(logging.INFO, logger="agent.tunnel")
    if peer == "older agent":
        monkeypatch.setattr(SessionLoop, "tunnel_offers", False)
    elif peer == "older gateway":
        monkeypatch.setattr(gateway_core, "TUNNEL_OFFERS", "a-capability-this-gateway-does-not-know")
    await ready(lab)
    labels = dict((await lab.admin.get_node("n1")).labels)
    assert ("bc.dev/cap.tunnel.offers" in labels) is (peer != "older agent")
    async with client(lab) as c:
        t = await open_echo(c, echo_port)
        await t.send(b"through either stream")
        assert await read_exactly(t, 21) == b"through either stream"
        via = "event=tunnel.offers via=session" if peer == "both new" else "event=tunnel.offers via=listen"
        assert via in caplog.text and caplog.text.count("event=tunnel.offers via=") == 1
        seq = (await lab.admin.server_info()).event_seq
        await lab.stop_node("n1")  # the node's session ends: its tunnel with it
        await closed_within(lab, t, seq, limit_s=5.0)
    assert not lab.server.gateway.tunnels.listening("n1")  # nothing of the node's is left to offer to
