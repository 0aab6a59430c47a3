"""The typed close over real gRPC: what the gateway's link closes with, the agent's link reads back as a code.

The reason rides in the trailing metadata of the closing status (`bc-close-reason`), so it survives the
status message being reworded; an absent or unknown name reads as UNSPECIFIED. Wall clock, plain TCP on
127.0.0.1 (TLS is not what is tested here), and every wait is on an event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from bc.protocol import closing
from bc.protocol.pb import session_pb2
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.seams.link import LinkClosed
from bc.wire.link import GrpcClientLink, GrpcServerLink
from bc.wire.stubs import session_pb2_grpc

ServerEnd = Callable[[GrpcServerLink[NodeMessage, GatewayMessage], grpc.aio.ServicerContext], Awaitable[None]]
Serve = Callable[[ServerEnd], Awaitable[GrpcClientLink[GatewayMessage, NodeMessage]]]


class Scripted(session_pb2_grpc.NodeSessionServicer):
    def __init__(self, script: ServerEnd) -> None:
        self.script = script

    async def Session(  # type: ignore[override]
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        await self.script(GrpcServerLink(context), context)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[grpc.aio.Server] = []

    async def start(script: ServerEnd) -> GrpcClientLink[GatewayMessage, NodeMessage]:
        server = grpc.aio.server()
        session_pb2_grpc.add_NodeSessionServicer_to_server(Scripted(script), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        call = session_pb2_grpc.NodeSessionStub(channel).Session()
        return GrpcClientLink(call, channel)

    yield start
    for s in servers:
        await s.stop(None)


async def closed_by(link: GrpcClientLink[GatewayMessage, NodeMessage], *, close: bool = True) -> LinkClosed:
    """Read until the link ends; the LinkClosed it ends with (the link is then closed, unless `close` is False)."""
    try:
        async with asyncio.timeout(10):
            while True:
                if await link.recv() is None:
                    raise AssertionError("the stream ended cleanly, without a status")
    except LinkClosed as e:
        return e
    finally:
        if close:
            await link.close("CANCELLED", "test done")


@pytest.mark.parametrize(
    "reason",
    [closing.REVOKED, closing.IDENTITY_REPLACED, closing.EXPIRED, closing.SUPERSEDED, closing.GATEWAY_UNAVAILABLE],
)
async def test_every_reason_crosses_the_wire_as_itself(serve: Serve, reason: CloseReason) -> None:
    async def script(link: GrpcServerLink[NodeMessage, GatewayMessage], ctx: grpc.aio.ServicerContext) -> None:
        await link.close("UNAUTHENTICATED", "worded for people, not for code", reason)

    e = await closed_by(await serve(script))
    assert (e.code, e.details, e.reason) == ("UNAUTHENTICATED", "worded for people, not for code", reason)


async def test_the_reason_arrives_after_frames_already_sent(serve: Serve) -> None:
    """The revocation path: a notice frame first, then the close; the agent reads both."""

    async def script(link: GrpcServerLink[NodeMessage, GatewayMessage], ctx: grpc.aio.ServicerContext) -> None:
        notice = session_pb2.RevocationNotice(reason="stolen", serials=["ab"])
        await link.send(GatewayMessage(revocation=notice))
        await link.close("UNAUTHENTICATED", "certificate revoked: stolen", closing.REVOKED)

    client = await serve(script)
    first = await client.recv()
    assert first is not None and first.revocation.reason == "stolen"
    e = await closed_by(client)
    assert (e.code, e.reason) == ("UNAUTHENTICATED", closing.REVOKED)


async def test_a_close_without_a_reason_reads_unspecified(serve: Serve) -> None:
    async def script(link: GrpcServerLink[NodeMessage, GatewayMessage], ctx: grpc.aio.ServicerContext) -> None:
        await link.close("UNAUTHENTICATED", "certificate revoked: but said only in words")

    e = await closed_by(await serve(script))
    assert e.code == "UNAUTHENTICATED" and e.reason == closing.UNSPECIFIED


async def test_a_reason_this_build_does_not_know_reads_unspecified(serve: Serve) -> None:
    async def script(link: GrpcServerLink[NodeMessage, GatewayMessage], ctx: grpc.aio.ServicerContext) -> None:
        await ctx.abort(grpc.StatusCode.ABORTED, "a newer gateway", trailing_metadata=(("bc-close-reason", "CLOSE_X"),))

    e = await closed_by(await serve(script))
    assert e.code == "ABORTED" and e.reason == closing.UNSPECIFIED


async def test_a_write_after_the_close_fails_with_the_close_and_its_reason(serve: Serve) -> None:
    """A session ended while the node still writes: the write fails with the close, typed, not with an error."""

    async def script(link: GrpcServerLink[NodeMessage, GatewayMessage], ctx: grpc.aio.ServicerContext) -> None:
        await link.close("UNAUTHENTICATED", "certificate expired; renew and reconnect", closing.EXPIRED)

    client = await serve(script)
    read = await closed_by(client, close=False)
    with pytest.raises(LinkClosed) as wrote:
        await client.send(NodeMessage(heartbeat=session_pb2.Heartbeat()))
    await client.close("CANCELLED", "test done")
    assert (read.code, read.reason) == (wrote.value.code, wrote.value.reason) == ("UNAUTHENTICATED", closing.EXPIRED)
