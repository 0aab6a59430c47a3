"""The node's tunnels: offers in, one verified ticket per tunnel, bytes to a port on the node's loopback.

While a session runs over gRPC, the node takes its tunnels' offers on the session stream itself
(`GatewayMessage.tunnel_offer`, handed over by the session's runner through `SessionOffers`) once the
gateway's Welcome said it sends them there (`tunnel.offers`, bc.protocol.capabilities); from an older
gateway it holds one `NodeTunnels.Listen` stream on the same channel instead. Either way they come over the
session's TLS connection to whichever gateway holds it: no second connection, no inbound port. For each
`TunnelOffer{sid, token}` it:

1. verifies the ticket itself (`bc.pki.exec_tickets.verify`) against the JWKS pinned in its signed `access`
   section, for this node and exactly this `sid`, at server time;
2. records its `jti` as used in the journal (`AgentJournal.use_ticket`, fsynced): a replay, or a full set,
   is refused, saying so;
3. connects to `127.0.0.1:<port>` (the ticket's port; nothing else is reachable);
4. opens `NodeTunnels.Carry` on the same channel, sends `accept{sid}` (or `refused{sid, reason}` for any
   refusal above), and serves TLS over the frames with its own certificate (`bc.wire.tls_pipe`), the
   plaintext going to and from the TCP connection.

A new access section whose JWKS no longer holds a tunnel's key (a rotation) closes that tunnel
(`on_spec`); the session's end closes them all (`serve` returns when the channel's streams end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent import journal_tickets as jti_rules
from agent.journal_api import AgentJournal
from agent.session.tunnel_offers import SessionOffers
from bc.errors import TicketRefused
from bc.pki import exec_tickets
from bc.protocol.pb import spec_pb2
from bc.protocol.pb.tunnel_pb2 import TunnelAccept, TunnelEnd, TunnelFrame, TunnelListen, TunnelOffer, TunnelRefused
from bc.wire.stubs import tunnel_pb2_grpc
from bc.wire.tls_pipe import READ_CHUNK, SecureChannel, TunnelTampered, server_context

log = logging.getLogger("agent.tunnel")

CONNECT_TIMEOUT_S = 5.0
FINISH_S = 5.0
"""How long a tunnel whose local side closed waits for the gateway to end its stream (its last frames out)."""
DRAIN_S = 2.0
"""How long the local port may go on answering once the operator's frames have ended."""

Connect = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _connect(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        return await asyncio.open_connection(host, port)


class TunnelCut(Exception):
    """The gateway ended the tunnel (an admin's close, the operator's stream gone) before TLS's close."""


@dataclass
class _Open:
    kid: str
    task: asyncio.Task[None]


@dataclass
class TunnelService:
    """`jwks()` and `server_now_ms()` read the node's state; `tls_files` is (certificate, key) of the node's
    own TLS identity, or None where the key cannot be handed to OpenSSL (a TPM's: every tunnel is refused)."""

    node_id: str
    journal: AgentJournal
    jwks: Callable[[], str]
    server_now_ms: Callable[[], int]
    tls_files: tuple[Path, Path] | None
    connect: Connect = _connect
    open: dict[str, _Open] = field(default_factory=dict)
    opened: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    async def serve(self, channel: grpc.aio.Channel, offers: SessionOffers | None = None) -> None:
        """Take the session's offers until the session ends (this task is cancelled), or, when the gateway does not
        send them on the session (or `offers` is None), listen for them on `channel` until that stream ends; every
        tunnel it opened ends with it. Each accepted offer's `Carry` goes on `channel`."""
        stub = tunnel_pb2_grpc.NodeTunnelsStub(channel)
        call: Any = None
        if offers is not None and await offers.on_session():
            log.info("event=tunnel.offers via=session")
            source = offers.offers()
        else:  # an older gateway (or this agent told not to ask): a Listen stream beside the session
            log.info("event=tunnel.offers via=listen")
            call = stub.Listen(TunnelListen())
            source = _offers(call)
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for offer in source:
                t = asyncio.create_task(self._one(stub, offer), name=f"tunnel-{offer.sid[:32]}")
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        except grpc.aio.AioRpcError as e:
            log.info("event=tunnel.listen-ended code=%s", e.code().name)
        finally:
            if call is not None:
                call.cancel()
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def on_spec(self, spec: spec_pb2.NodeSpec) -> None:
        """A new spec: close every tunnel whose ticket's key left the JWKS (a rotation, or tunnels turned off)."""
        kids = exec_tickets.kids_of(spec.access.exec_ticket_jwks)
        for sid, o in list(self.open.items()):
            if o.kid not in kids:
                log.warning("event=tunnel.closed sid=%s why=key-rotated kid=%s", sid, o.kid)
                o.task.cancel()

    async def _check(self, offer: TunnelOffer) -> exec_tickets.Ticket:
        now_ms = self.server_now_ms()
        t = exec_tickets.verify(offer.token, self.jwks(), node_id=self.node_id, sid=offer.sid, now_ms=now_ms)
        refused = await self.journal.use_ticket(t.jti, t.exp_ms, now_ms)
        if refused:
            raise TicketRefused(refused, jti_rules.message(refused))
        if self.tls_files is None:
            raise TicketRefused("no-tls", "this node's key lives in its TPM, which cannot serve a tunnel's TLS")
        return t

    async def _one(self, stub: tunnel_pb2_grpc.NodeTunnelsStub, offer: TunnelOffer) -> None:
        sid = offer.sid[:128]
        try:
            t = await self._check(offer)
            reader, writer = await self.connect("127.0.0.1", t.port)
        except TicketRefused as e:
            await self._refuse(stub, sid, e.reason, e.message)
            return
        except (TimeoutError, OSError) as e:
            await self._refuse(stub, sid, "port-closed", f"nothing answers on this node's loopback port: {e}")
            return
        me = asyncio.current_task()
        assert me is not None
        self.open[sid] = _Open(t.kid, me)
        self.opened += 1
        log.info(
            "event=tunnel.opened sid=%s operator=%s purpose=%s port=%d recorded=%s",
            sid,
            t.operator,
            t.purpose,
            t.port,
            "promised" if t.record else "no",
        )
        call = stub.Carry()
        try:
            await call.write(TunnelFrame(accept=TunnelAccept(sid=sid)))
            await self._carry(call, reader, writer)
            log.info("event=tunnel.ended sid=%s why=closed", sid)
        except TunnelCut as e:
            log.info("event=tunnel.ended sid=%s why=cut said=%r", sid, str(e))
        except (
            grpc.aio.AioRpcError,
            asyncio.CancelledError,
            asyncio.InvalidStateError,  # the gateway ended the stream while a frame was going out
            TunnelTampered,
            OSError,
            ssl.SSLError,
        ) as e:
            log.info("event=tunnel.ended sid=%s why=%s", sid, type(e).__name__)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.open.pop(sid, None)
            call.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _refuse(self, stub: tunnel_pb2_grpc.NodeTunnelsStub, sid: str, reason: str, message: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        log.warning("event=tunnel.refused sid=%s reason=%s why=%s", sid, reason, message)
        call = stub.Carry()
        try:
            await call.write(TunnelFrame(refused=TunnelRefused(sid=sid, reason=reason, message=message)))
            await call.done_writing()
            async for _ in call:
                pass
        except grpc.aio.AioRpcError:
            pass

    async def _carry(self, call: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """TLS with the CLI over the frames of `call`, plaintext to and from the local connection."""
        assert self.tls_files is not None
        ends: list[str] = []
        frames = _data_frames(call, ends)

        async def write_frame(data: bytes) -> None:
            await call.write(TunnelFrame(data=data))

        async def read_frame() -> bytes | None:
            return await anext(frames, None)

        tls = SecureChannel(server_context(*self.tls_files), write_frame, read_frame, server_side=True)
        await tls.handshake()

        async def up() -> None:  # operator → local port, until the frames' end
            try:
                while (data := await tls.recv()) is not None:
                    writer.write(data)
                    await writer.drain()
            except TunnelTampered:
                if ends:  # the frames ended before TLS's close, with the gateway's `end`: it cut the tunnel
                    raise TunnelCut(ends[0] or "closed") from None
                raise
            if writer.can_write_eof():
                writer.write_eof()
            # The operator's close_notify is a half-close, not the frames' end: read on to their `end` (or the
            # stream's), or the node never learns the tunnel is over and its side lingers with the session.
            async for _ in frames:
                pass

        async def down() -> None:  # local port → operator
            while data := await reader.read(READ_CHUNK):
                await tls.send(data)
            await tls.close()
            await call.write(TunnelFrame(end=TunnelEnd(reason="the node's port closed")))
            await call.done_writing()

        ups, downs = asyncio.create_task(up()), asyncio.create_task(down())
        try:
            # The operator's side ending (their half-close or the stream's end) leaves the local port a moment to
            # answer; the local port closing ends the tunnel. Either failing ends it at once.
            done, _pending = await asyncio.wait({ups, downs}, return_when=asyncio.FIRST_COMPLETED)
            for d in done:
                if d.exception() is not None:
                    raise d.exception()  # type: ignore[misc]
            if not downs.done():
                # `up` ends at the frames' end, not at a half-close (TLS close_notify), which keeps the tunnel while
                # the port answers.
                await asyncio.wait({downs}, timeout=DRAIN_S)
            if downs.done() and not downs.cancelled() and downs.exception() is None:
                # Our `end` is written: read on to the gateway's end of the stream (gRPC reports a call's end only
                # once its frames are read). Cancelling the read in `up` now would cancel the call, and the frames
                # still on their way with it.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FINISH_S):
                        await asyncio.wait({ups})
                        async for _ in call:
                            pass
                        await call.code()
        finally:
            for t in (ups, downs):
                t.cancel()
            await asyncio.gather(ups, downs, return_exceptions=True)


async def _offers(call: Any) -> AsyncIterator[TunnelOffer]:
    async for offer in call:
        yield offer


async def _data_frames(call: Any, ends: list[str]) -> AsyncIterator[bytes]:
    """The data of the gateway's frames, until an `end` (its reason appended to `ends`) or the stream's end."""
    async for frame in call:
        kind = frame.WhichOneof("msg")
        if kind == "data":
            yield frame.data
        elif kind == "end":
            ends.append(frame.end.reason[:200])
            return
