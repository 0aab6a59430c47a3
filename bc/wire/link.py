"""The seam under both session cores: send and receive protocol messages, close.

`grpc.aio` cannot take a custom transport, so the seam sits above gRPC: the
gRPC adapters here and the simulator's in-memory faulty links implement the
same `Link`, and the session cores cannot tell them apart.
"""

from __future__ import annotations

import asyncio
from typing import Generic, Protocol, TypeVar

import grpc

from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage

In = TypeVar("In", covariant=True)
Out = TypeVar("Out", contravariant=True)


class LinkClosed(Exception):
    """The peer or the transport ended the link; `code` and `details` say how."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class Link(Protocol[In, Out]):
    async def send(self, msg: Out) -> None: ...

    async def recv(self) -> In | None:
        """The next message, or None at a clean end of stream."""

    async def close(self, code: str, details: str) -> None: ...


class GrpcServerLink(Generic[In, Out]):
    """The gateway's end: a grpc.aio servicer context of a bidi stream."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._ctx = context
        self._write_lock = asyncio.Lock()

    async def send(self, msg: Out) -> None:
        async with self._write_lock:  # grpc.aio allows one write in flight per stream
            await self._ctx.write(msg)

    async def recv(self) -> In | None:
        m = await self._ctx.read()
        if m is grpc.aio.EOF:
            return None
        return m  # type: ignore[no-any-return]

    async def close(self, code: str, details: str) -> None:
        await self._ctx.abort(getattr(grpc.StatusCode, code), details)


class GrpcClientLink(Generic[In, Out]):
    """The agent's end: a grpc.aio stream-stream call."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        self._write_lock = asyncio.Lock()

    async def send(self, msg: Out) -> None:
        try:
            # grpc.aio allows one write in flight per stream: two concurrent writes fail the whole call
            # with INTERNAL ("Internal error from Core"), and several tasks send on one session.
            async with self._write_lock:
                await self._call.write(msg)
        except grpc.aio.AioRpcError as e:
            raise LinkClosed(e.code().name, e.details() or "") from None
        except grpc.aio.UsageError as e:
            raise LinkClosed("CANCELLED", str(e)) from None

    async def recv(self) -> In | None:
        try:
            m = await self._call.read()
        except grpc.aio.AioRpcError as e:
            raise LinkClosed(e.code().name, e.details() or "") from None
        if m is grpc.aio.EOF:
            code = await self._call.code()
            if code != grpc.StatusCode.OK:
                raise LinkClosed(code.name, await self._call.details() or "")
            return None
        return m  # type: ignore[no-any-return]

    async def close(self, code: str, details: str) -> None:
        self._call.cancel()


GatewayLink = Link[NodeMessage, GatewayMessage]
AgentLink = Link[GatewayMessage, NodeMessage]
