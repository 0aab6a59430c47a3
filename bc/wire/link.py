"""The gRPC adapters of the `Link` seam (`bc.seams.link`): the gateway's end and the agent's end of a session.

`grpc.aio` cannot take a custom transport, so the seam sits above gRPC: the
adapters here and the in-memory links (`bc.seams.network`) implement the
same `Link`, and the session cores cannot tell them apart.

A close carries a typed reason (`bc.protocol.closing`) besides the gRPC code
and details: the server end puts it in the trailing metadata of the status it
aborts with, and the client end reads it back into `LinkClosed.reason`, so the
agent decides "revoked", "expired" or "superseded" by code equality. A gateway shedding load says when
to come back the same way (`retry_after_ms`, metadata `bc-retry-after-ms`; `LinkClosed.retry_after_ms`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Generic, TypeVar

import grpc

from bc.protocol import closing
from bc.protocol.pb.session_pb2 import CloseReason
from bc.seams.link import LinkClosed

In = TypeVar("In", covariant=True)
Out = TypeVar("Out", contravariant=True)


def reason_metadata(reason: CloseReason, retry_after_ms: int | None = None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries `reason` (none for UNSPECIFIED) and a retry-after (none for None)."""
    md: tuple[tuple[str, str], ...] = ()
    if reason != closing.UNSPECIFIED:
        md += ((closing.METADATA_KEY, closing.name_of(reason)),)
    if retry_after_ms is not None:
        md += ((closing.RETRY_AFTER_KEY, str(max(0, retry_after_ms))),)
    return md


def reason_in(metadata: Iterable[tuple[str, str | bytes]] | None) -> CloseReason:
    """The reason in a status's trailing metadata (grpc's Metadata, or pairs); UNSPECIFIED when absent."""
    for key, value in metadata or ():
        if key == closing.METADATA_KEY:
            return closing.from_name(value.decode() if isinstance(value, bytes) else str(value))
    return closing.UNSPECIFIED


def retry_after_in(metadata: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    """The retry-after in a status's trailing metadata, in ms; None when absent or not a number."""
    for key, value in metadata or ():
        if key == closing.RETRY_AFTER_KEY:
            try:
                return max(0, int(value.decode() if isinstance(value, bytes) else str(value)))
            except ValueError:
                return None
    return None


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

    async def close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        md = reason_metadata(reason, retry_after_ms)
        await self._ctx.abort(getattr(grpc.StatusCode, code), details, trailing_metadata=md)


class GrpcClientLink(Generic[In, Out]):
    """The agent's end: a grpc.aio stream-stream call (and the channel it owns, if given: closed with the link).

    A write to a call the gateway already ended fails with that end (code, details, reason), like a read.
    One race is grpc's own: a write that reaches the core in the instant between the status arriving and
    Python seeing it makes grpc replace the status with INTERNAL "Internal error from Core", and the reason
    is lost. The node then redials as after any error; a certificate that is done is refused again at the
    next dial, with its reason, so the node stops one back-off later rather than never.
    """

    def __init__(self, call: grpc.aio.StreamStreamCall, channel: grpc.aio.Channel | None = None) -> None:
        self._call = call
        self._channel = channel
        self._write_lock = asyncio.Lock()

    async def send(self, msg: Out) -> None:
        try:
            # grpc.aio allows one write in flight per stream: two concurrent writes fail the whole call
            # with INTERNAL ("Internal error from Core"), and several tasks send on one session.
            async with self._write_lock:
                await self._call.write(msg)
        except grpc.aio.AioRpcError as e:
            raise _closed(e) from None
        except asyncio.InvalidStateError:
            # "RPC already finished": the gateway ended the stream while this frame was on its way; the
            # status it ended it with (and its reason) is what the session must see, not this error.
            raise await self._status() from None
        except grpc.aio.UsageError as e:
            raise LinkClosed("CANCELLED", str(e)) from None

    async def recv(self) -> In | None:
        try:
            m = await self._call.read()
        except grpc.aio.AioRpcError as e:
            raise _closed(e) from None
        if m is grpc.aio.EOF:
            if await self._call.code() != grpc.StatusCode.OK:
                raise await self._status()
            return None
        return m  # type: ignore[no-any-return]

    async def _status(self) -> LinkClosed:
        """How the finished call ended, as the LinkClosed the session reads."""
        code = await self._call.code()
        md = await self._call.trailing_metadata()
        return LinkClosed(code.name, await self._call.details() or "", reason_in(md), retry_after_in(md))

    async def close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        """The client has no status to send: cancel the call (the gateway sees the stream end) and drop the channel."""
        self._call.cancel()
        channel, self._channel = self._channel, None  # closed once, however often the link is
        if channel is not None:
            await channel.close()


def _closed(e: grpc.aio.AioRpcError) -> LinkClosed:
    md = e.trailing_metadata()
    return LinkClosed(e.code().name, e.details() or "", reason_in(md), retry_after_in(md))
