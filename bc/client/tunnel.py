"""The operator's end of a tunnel (docs/access.md): a ticket, the `Open` stream, TLS to the node itself.

`TunnelClient.connect(node, purpose, port, reason)` asks the control plane for an exec ticket, opens the
tunnel with it, and runs TLS over the stream's frames to the node (`bc.wire.tls_pipe`), accepting only the
certificate the cluster CA issued to that node: what comes back is an `OpenTunnel` whose `send`/`recv`
carry plaintext the gateways in between never see. A refusal (by the control plane or by the node) is a
`TicketRefused` naming its reason; a relay that altered the stream is a `TunnelTampered`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import grpc

from bc.client.reconnect import CHANNEL_OPTIONS
from bc.errors import BcError, ProtocolError, TicketRefused
from bc.pki import keys
from bc.protocol.limits import LIMITS
from bc.protocol.pb import tunnel_pb2
from bc.protocol.pb.tunnel_pb2 import TunnelEnd, TunnelFrame, TunnelOpen
from bc.runtime.config import OperatorConfig
from bc.seams.clock import Clock, SystemClock
from bc.wire.status import status_to_error
from bc.wire.stubs import tunnel_pb2_grpc
from bc.wire.tls import channel_credentials
from bc.wire.tls_pipe import SecureChannel, TunnelTampered, check_node, client_context

log = logging.getLogger("bc.client.tunnel")

TIMEOUT_S = 15.0
CLOSE_WAIT_S = 5.0
"""How long `OpenTunnel.close` waits for the server to end the call after the operator's `end`."""


class OpenTunnel:
    """An open tunnel: plaintext both ways; `close(exit_code)` ends it, recording the exit code."""

    def __init__(self, call: Any, ticket: tunnel_pb2.ExecTicket) -> None:
        self.call, self.ticket = call, ticket
        self.end_reason = ""
        self._wlock, self._rlock = asyncio.Lock(), asyncio.Lock()
        self._frames = self._data()
        self.tls = SecureChannel(client_context(), self._write, self._read, server_side=False)

    async def _send_frame(self, frame: TunnelFrame) -> None:
        """One write at a time (grpc allows one in flight), shielded: grpc cancels the whole call when a write is
        cancelled, and a local side that ends (ssh's proxy exiting) cancels what was sending; the tunnel must
        outlive that to carry the exit code."""

        async def locked() -> None:
            async with self._wlock:
                await self.call.write(frame)

        await asyncio.shield(locked())

    async def _write(self, data: bytes) -> None:
        await self._send_frame(TunnelFrame(data=data))

    async def _read(self) -> bytes | None:
        return await anext(self._frames, None)

    async def _read_frame(self) -> Any:
        async with self._rlock:
            return await self.call.read()

    async def _data(self) -> AsyncIterator[bytes]:
        while True:
            frame = await self._read_frame()
            if frame is grpc.aio.EOF:
                return
            kind = frame.WhichOneof("msg")
            if kind == "data":
                yield frame.data
            elif kind == "end":
                self.end_reason = frame.end.reason
                return

    async def send(self, data: bytes) -> None:
        await self.tls.send(data)

    async def recv(self) -> bytes | None:
        try:
            return await self.tls.recv()
        except TunnelTampered as e:
            if self.end_reason:  # what the server said when it ended the tunnel (a revocation, an admin's close)
                raise TunnelTampered(f"{e.message}; the server said: {self.end_reason}") from None
            raise

    async def close(self, exit_code: int | None = None) -> None:
        """close_notify, then `end` (with the exit code of what ran through it, if any)."""
        try:
            await self.tls.close()
            end = TunnelEnd(reason="closed by the operator")
            if exit_code is not None:
                end.exit_code, end.has_exit_code = exit_code, True
            await self._send_frame(TunnelFrame(end=end))
            async with self._wlock:
                await self.call.done_writing()
            # Until the server ends the call: it has read the `end` (a channel closed at once could beat it there).
            async with asyncio.timeout(CLOSE_WAIT_S):
                while await self._read_frame() is not grpc.aio.EOF:
                    pass
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, TimeoutError, BcError) as e:
            log.debug("event=tunnel.close-incomplete why=%r", e)


class TunnelClient:
    def __init__(self, config: OperatorConfig, *, timeout_s: float = TIMEOUT_S, clock: Clock | None = None) -> None:
        self.config, self.timeout_s = config, timeout_s
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> TunnelClient:
        creds = channel_credentials(self.config.ca_pem, self.config.key_pem, self.config.cert_pem)
        options = [*LIMITS.grpc_options(), *CHANNEL_OPTIONS]
        self._channel = grpc.aio.secure_channel(self.config.server, creds, options=options)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    @property
    def stub(self) -> tunnel_pb2_grpc.TunnelsStub:
        assert self._channel is not None, "use TunnelClient as an async context manager"
        return tunnel_pb2_grpc.TunnelsStub(self._channel)

    def _error(self, e: grpc.aio.AioRpcError) -> BcError:
        return status_to_error(e.code(), e.details() or "", server=self.config.server)

    async def issue(
        self, node_id: str, purpose: str, port: int = 0, reason: str = "", ttl_s: int = 0, record: bool = False
    ) -> tunnel_pb2.ExecTicket:
        req = tunnel_pb2.IssueTicketRequest(
            node_id=node_id, purpose=purpose, port=port, reason=reason, ttl_s=ttl_s, record=record
        )
        try:
            reply: tunnel_pb2.ExecTicket = await self.stub.IssueTicket(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from e
        return reply

    async def open(self, ticket: tunnel_pb2.ExecTicket) -> OpenTunnel:
        """Open the tunnel `ticket` names and finish TLS with its node; TicketRefused when refused."""
        call = self.stub.Open()
        try:
            await call.write(TunnelFrame(open=TunnelOpen(token=ticket.token)))
            first = await call.read()
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from e
        if first is grpc.aio.EOF:
            raise ProtocolError("the server ended the tunnel before answering its ticket")
        kind = first.WhichOneof("msg")
        if kind == "refused":
            raise TicketRefused(first.refused.reason, f"the tunnel was refused: {first.refused.message}")
        if kind != "accept" or first.accept.sid != ticket.sid:
            raise ProtocolError(f"the server answered the tunnel's ticket with {kind!r}")
        tunnel = OpenTunnel(call, ticket)
        try:
            await tunnel.tls.handshake()
            check_node(tunnel.tls.peer_der(), keys.load_cert_pem(self.config.ca_pem), ticket.node_id, self.clock.now())
        except BaseException:
            call.cancel()
            raise
        return tunnel

    async def connect(self, node_id: str, purpose: str, port: int = 0, reason: str = "") -> OpenTunnel:
        return await self.open(await self.issue(node_id, purpose, port, reason))

    async def list(self, node_id: str = "", open_only: bool = False, limit: int = 0) -> list[tunnel_pb2.TunnelRecord]:
        req = tunnel_pb2.ListTunnelsRequest(node_id=node_id, open_only=open_only, limit=limit)
        try:
            return list((await self.stub.ListTunnels(req, timeout=self.timeout_s)).tunnels)
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from e

    async def close_tunnel(self, sid: str, reason: str = "") -> tunnel_pb2.TunnelRecord:
        try:
            closed: tunnel_pb2.TunnelRecord = await self.stub.CloseTunnel(
                tunnel_pb2.CloseTunnelRequest(sid=sid, reason=reason), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from e
        return closed

    async def rotate_key(self) -> tunnel_pb2.TicketKeyInfo:
        try:
            info: tunnel_pb2.TicketKeyInfo = await self.stub.RotateTicketKey(
                tunnel_pb2.RotateTicketKeyRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from e
        return info

    async def record_policy(self, set_to: str = "") -> str:
        """The control plane's `--record` policy (set to `set_to` first, an admin's call, when given)."""
        try:
            if set_to:
                p = await self.stub.SetRecordPolicy(tunnel_pb2.RecordPolicy(policy=set_to), timeout=self.timeout_s)
            else:
                p = await self.stub.GetRecordPolicy(tunnel_pb2.GetRecordPolicyRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from e
        return str(p.policy)

    async def upload_typescript(self, sid: str, offset: int, data: bytes, done: bool = False) -> int:
        """Append one chunk (at most 64 KiB) of tunnel `sid`'s typescript; the bytes the control plane holds."""
        req = tunnel_pb2.TypescriptChunk(sid=sid, offset=offset, data=data, done=done)
        try:
            ack: tunnel_pb2.TypescriptAck = await self.stub.UploadTypescript(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from e
        return int(ack.stored)

    async def typescript(self, sid: str) -> AsyncIterator[bytes]:
        """Tunnel `sid`'s typescript, chunk by chunk (admin)."""
        try:
            async for chunk in self.stub.GetTypescript(tunnel_pb2.GetTypescriptRequest(sid=sid)):
                yield bytes(chunk.data)
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from e
