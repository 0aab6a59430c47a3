"""Tunnels across control-plane processes: the api that holds the operator's `Open` relays through the gateway
that holds the node's session (docs/access.md, "Gateways").

Each gateway process registers where it answers (`gateway_endpoints`, a TTL lease renewed by its
`gateway-registry` loop). An api process whose own gateway does not hold the node's session finds the
session's gateway in the store (`node_sessions`) and its address (`GatewayRoute.find`), dials it with its own
control-plane certificate (`gateway:<id>`, clientAuth) and calls `GatewayTunnels.Relay`; that gateway does
`TunnelHub.connect` to the node and pipes frames both ways (`RelayServicer`). The api splices the operator's
stream onto that call with the same bounded relay as a local tunnel, so the frames stay TLS between the CLI
and the node: neither process sees plaintext.

Who may call `Relay`: a control-plane process certificate only (`bc.api.admin_roles.PROCESS_ONLY`); an
operator's or a node's is refused UNAUTHENTICATED. The ticket was checked by the api (signature, owner,
issued and unused) and is checked again by the node; the gateway adds no authority of its own.

Closing: the api's relay owns the tunnel and its record. Ending it (`CloseTunnel`, the operator revoked, a
key rotation) cancels the `Relay` call, which ends the gateway's relay at once; the node revoked, or its
session leaving the gateway, ends the gateway's relay, which ends the call and so the api's relay. A gateway
that is gone answers within `ANSWER_S` (connection refused at once; a silent one by the timeout):
`node-unavailable`, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
from cryptography import x509

from bc.api.admin_roles import PROCESS_ONLY
from bc.api.peers import peer_of
from bc.errors import BcError, TicketRefused, Unavailable
from bc.gateway.tunnels import OFFER_TIMEOUT_S, Relay, TunnelHub
from bc.pki import exec_tickets
from bc.protocol.pb.tunnel_pb2 import TunnelFrame, TunnelOpen, TunnelRefused
from bc.store import Store
from bc.store import gateway_keys as gk_sql
from bc.wire.status import abort_with
from bc.wire.stubs import tunnel_pb2_grpc

log = logging.getLogger("bc.api.tunnels")

ANSWER_S = OFFER_TIMEOUT_S + 2.0
"""How long the api waits for the relaying gateway's first frame (the node's verdict, or the gateway's refusal)."""
GATEWAY_ENDPOINT_TTL_MS = 20_000
GATEWAY_ENDPOINT_RENEW_S = 5.0


class QueueEnd:
    """A stream whose frames down are written by a generator: `send` puts them in a one-frame queue, `recv`
    reads the stream's frames up."""

    def __init__(self, requests: AsyncIterator[TunnelFrame]) -> None:
        self.requests = requests
        self.down: asyncio.Queue[TunnelFrame | None] = asyncio.Queue(maxsize=1)

    async def send(self, frame: TunnelFrame) -> None:
        await self.down.put(frame)

    async def recv(self) -> TunnelFrame | None:
        return await anext(self.requests, None)


async def pump(
    lifetime: Callable[[], Coroutine[Any, Any, None]],
    end: QueueEnd,
    name: str,
    tasks: set[asyncio.Task[None]],
    gone: Callable[[], None] = lambda: None,
) -> AsyncGenerator[TunnelFrame, None]:
    """The frames down `end` while `lifetime` (a relay and what it leaves behind) runs in a task of its own, so a
    call cancelled under this generator cannot skip its end; once the stream goes first, `gone()` and the task
    is cancelled."""
    task = asyncio.create_task(lifetime(), name=name)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    try:
        while True:
            getter = asyncio.ensure_future(end.down.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                while not end.down.empty():
                    frame = end.down.get_nowait()
                    if frame is not None:
                        yield frame
                return
            frame = getter.result()
            if frame is None:
                return
            yield frame
    except BaseException as e:
        log.debug("event=tunnel.stream-closed task=%s why=%r", name, e)
        raise
    finally:
        if not task.done():
            gone()
            task.cancel()


def _refused(sid: str, reason: str, message: str) -> TunnelFrame:
    return TunnelFrame(refused=TunnelRefused(sid=sid, reason=reason, message=message))


# -- the gateway's side ---------------------------------------------------------------------------------------


class RelayServicer(tunnel_pb2_grpc.GatewayTunnelsServicer):
    """`GatewayTunnels.Relay` on a gateway process: the api's stream as the operator's end of a hub relay."""

    def __init__(self, hub: TunnelHub, ca_cert: x509.Certificate, gateway_id: str) -> None:
        self.hub, self.ca_cert, self.gateway_id = hub, ca_cert, gateway_id
        self._lifetimes: set[asyncio.Task[None]] = set()

    async def Relay(
        self, request_iterator: AsyncIterator[TunnelFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[TunnelFrame]:
        try:
            caller = peer_of(context, self.ca_cert, PROCESS_ONLY["Relay"][0])
        except BcError as e:
            await abort_with(context, e)
        first = await anext(request_iterator, None)
        if first is None or first.WhichOneof("msg") != "open" or not first.open.node_id or not first.open.sid:
            yield _refused("", "bad-request", "a relayed tunnel's first frame must be `open` with its node and sid")
            return
        node_id, sid = first.open.node_id, first.open.sid
        try:  # unverified (the api verified it, the node will): what the relay is recorded under here
            claimed = exec_tickets.peek(first.open.token)
        except TicketRefused as e:
            yield _refused(sid, e.reason, e.message)
            return
        if (claimed.node_id, claimed.sid) != (node_id, sid):
            yield _refused(sid, "bad-ticket", "the ticket names another node or sid than the relay asks for")
            return
        if not self.hub.listening(node_id):
            yield _refused(sid, "not-here", f"node {node_id} has no session on gateway {self.gateway_id}")
            return
        log.info("event=tunnel.relay-asked sid=%s node=%s by=%s", sid, node_id, caller.name)
        try:
            verdict, node_end, release = await self.hub.connect(node_id, sid, first.open.token)
        except Unavailable as e:
            yield _refused(sid, "node-unavailable", e.message)
            return
        try:
            yield verdict
            if verdict.WhichOneof("msg") != "accept":
                return
            end = QueueEnd(request_iterator)
            r = Relay(sid, node_id, claimed.operator, claimed.kid)
            lifetime = functools.partial(self.hub.relay, r, end, node_end)
            async with contextlib.aclosing(pump(lifetime, end, f"tunnel-relay-{sid}", self._lifetimes)) as frames:
                async for frame in frames:
                    yield frame
        finally:
            release.set()


# -- the api's side ------------------------------------------------------------------------------------------


class GatewayEnd:
    """The api's `Relay` call to a gateway as a relay end; `close` ends the call and its channel."""

    def __init__(self, channel: grpc.aio.Channel, call: Any) -> None:
        self.channel, self.call = channel, call

    async def send(self, frame: TunnelFrame) -> None:
        await self.call.write(frame)

    async def recv(self) -> TunnelFrame | None:
        m = await self.call.read()
        return None if m is grpc.aio.EOF else m

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


class GatewayRoute:
    """Finds the gateway holding a node's session and opens a relay through it, with this process's own
    control-plane certificate (read at each call)."""

    def __init__(
        self, store: Store, credentials: Callable[[], grpc.ChannelCredentials], answer_s: float = ANSWER_S
    ) -> None:
        self.store, self.credentials, self.answer_s = store, credentials, answer_s

    async def find(self, node_id: str) -> tuple[str, str]:
        """(gateway id, address) of the node's session; Unavailable when it has none or its gateway is gone."""
        now_ms = await self.store.now_ms()
        async with self.store.transaction(write=False) as tx:
            route = await gk_sql.session_route(tx, node_id, now_ms)
        if route is None:
            raise Unavailable(f"node {node_id} has no session on any gateway; is it connected?")
        gateway_id, address = route
        if not address:
            raise Unavailable(f"node {node_id}'s gateway {gateway_id} has no live address in the store; is it running?")
        return gateway_id, address

    async def open(
        self, gateway_id: str, address: str, node_id: str, sid: str, token: str
    ) -> tuple[TunnelFrame, GatewayEnd]:
        """The gateway's first frame (the node's verdict, or the gateway's refusal) and the call, within `answer_s`."""
        channel = grpc.aio.secure_channel(address, self.credentials())
        call = tunnel_pb2_grpc.GatewayTunnelsStub(channel).Relay()
        end = GatewayEnd(channel, call)
        try:
            async with asyncio.timeout(self.answer_s):
                await call.write(TunnelFrame(open=TunnelOpen(token=token, node_id=node_id, sid=sid)))
                first = await end.recv()
        except (TimeoutError, grpc.aio.AioRpcError) as e:
            await end.close()
            why = (
                f"no answer within {self.answer_s:g} s"
                if isinstance(e, TimeoutError)
                else f"{e.code().name}: {e.details()}"
            )
            raise Unavailable(
                f"node {node_id}'s gateway {gateway_id} ({address}) did not relay the tunnel; is it running? ({why})"
            ) from None
        except BaseException:
            await end.close()
            raise
        if first is None:
            await end.close()
            raise Unavailable(f"node {node_id}'s gateway {gateway_id} ({address}) ended the relay without an answer")
        return first, end
