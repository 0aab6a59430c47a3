"""The `Tunnels` service: exec tickets, opening a tunnel, listing and closing them (docs/access.md).

Every RPC goes through the role guard (`bc.api.admin_roles.guard_service`, one table for every operator
service); `Open` is a stream, so the guard checks its caller again every second and ends it once they are
revoked or lowered, which closes the tunnel. `Open` needs this process's gateway (`TunnelHub`) to hold the
node's session; its relay moves ciphertext only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509

from bc.api.admin_roles import guard_service
from bc.api.calls import AdminCalls
from bc.api.peers import operator_of
from bc.api.tunnel_route import GatewayEnd, GatewayRoute, QueueEnd, pump
from bc.control.base import actor
from bc.control.base.bus import Bus
from bc.control.signing.signer import Signer
from bc.control.trust import operators, typescripts
from bc.control.trust import tunnels as tunnels_ctl
from bc.errors import BcError, TicketRefused, Unavailable
from bc.gateway.tunnels import FrameEnd, Relay, TunnelHub
from bc.pki import exec_tickets
from bc.pki.identity import PeerIdentity
from bc.pki.secrets_source import Secrets
from bc.protocol.pb import tunnel_pb2
from bc.protocol.pb.tunnel_pb2 import TunnelAccept, TunnelFrame, TunnelRefused
from bc.store import Row, Store
from bc.wire.status import abort_with
from bc.wire.stubs import tunnel_pb2_grpc

log = logging.getLogger("bc.api.tunnels")

CLOSE_POLL_S = 0.5
"""How often a relay checks whether another api process asked it to close (docs/access.md, "Gateways")."""
CLOSE_WAIT_S = 5.0
"""How long `CloseTunnel` waits for the relay's end to write the record."""


def record(row: Row, now_ms: int) -> tunnel_pb2.TunnelRecord:
    exit_code = row.get("exit_code")
    return tunnel_pb2.TunnelRecord(
        sid=str(row["sid"]),
        node_id=str(row["node_id"]),
        operator=str(row["operator"]),
        purpose=str(row["purpose"]),
        port=int(row["port"]),
        reason=str(row["reason"]),
        state=str(row["state"]),
        gateway_id=str(row["gateway_id"]),
        issued_at_ms=int(row["issued_at_ms"]),
        opened_at_ms=int(row["opened_at_ms"] or 0),
        ended_at_ms=int(row["ended_at_ms"] or 0),
        bytes_up=int(row["bytes_up"]),
        bytes_down=int(row["bytes_down"]),
        exit_code=int(exit_code) if exit_code is not None else 0,
        has_exit_code=exit_code is not None,
        end_reason=str(row["end_reason"]),
        expires_at_ms=int(row["expires_at_ms"]),
        kid=str(row["kid"]),
        record=bool(int(row.get("record_promised") or 0)),
        typescript=typescripts.state(row, now_ms),
        typescript_bytes=int(row.get("typescript_bytes") or 0),
    )


def _refused(sid: str, reason: str, message: str) -> TunnelFrame:
    return TunnelFrame(refused=TunnelRefused(sid=sid, reason=reason, message=message))


@guard_service(tunnel_pb2.DESCRIPTOR.services_by_name["Tunnels"])
class TunnelsServicer(AdminCalls, tunnel_pb2_grpc.TunnelsServicer):
    def __init__(
        self,
        store: Store,
        bus: Bus,
        ca_cert: x509.Certificate,
        *,
        signer: Signer,
        rng: random.Random,
        secrets: Secrets,
        key_dir: Path,
        hub: TunnelHub | None,
        gateway_id: str,
        route: GatewayRoute | None = None,
    ) -> None:
        self.store, self.bus, self.ca_cert, self.signer = store, bus, ca_cert, signer
        self.rng, self.secrets, self.key_dir, self.hub, self.gateway_id = rng, secrets, key_dir, hub, gateway_id
        self.route = route  # the other gateways, for a node whose session is not on `hub` (bc.api.tunnel_route)
        # Every tunnel this process relays, local or through another gateway (closing, rotation): the gateway's
        # own hub, or a hub that only relays in a process without the gateway role.
        self.relays = hub if hub is not None else TunnelHub()
        self._lifetimes: set[asyncio.Task[None]] = set()  # each open tunnel's relay and record

    # what the role guard needs (bc.api.admin_roles.Guarded)
    def _identity(self, context: grpc.aio.ServicerContext) -> PeerIdentity:
        return operator_of(context, self.ca_cert)

    async def _authorize(self, peer: PeerIdentity, need: str, what: str) -> actor.Caller:
        return await operators.authorize(self.store, peer, need, what)

    async def _caller(self, context: grpc.aio.ServicerContext, need: str, what: str) -> actor.Caller:
        return await self._authorize(self._identity(context), need, what)

    async def IssueTicket(
        self, request: tunnel_pb2.IssueTicketRequest, context: grpc.aio.ServicerContext
    ) -> tunnel_pb2.ExecTicket:
        async def go(operator: str) -> tunnel_pb2.ExecTicket:
            req = tunnels_ctl.TicketRequest(
                request.node_id, request.purpose, request.port, request.reason, request.ttl_s, request.record
            )
            token, t = await tunnels_ctl.issue(
                self.store, self.bus, self.key_dir, self.rng, self.secrets, req, operator
            )
            return tunnel_pb2.ExecTicket(
                token=token,
                sid=t.sid,
                node_id=t.node_id,
                purpose=t.purpose,
                port=t.port,
                expires_at_ms=t.exp_ms,
                kid=t.kid,
                record=t.record,
            )

        return await self._call_as(context, go)

    async def GetRecordPolicy(
        self, request: tunnel_pb2.GetRecordPolicyRequest, context: grpc.aio.ServicerContext
    ) -> tunnel_pb2.RecordPolicy:
        async def go() -> tunnel_pb2.RecordPolicy:
            return tunnel_pb2.RecordPolicy(policy=await typescripts.get_policy(self.store))

        return await self._call(context, go)

    async def SetRecordPolicy(
        self, request: tunnel_pb2.RecordPolicy, context: grpc.aio.ServicerContext
    ) -> tunnel_pb2.RecordPolicy:
        async def go() -> tunnel_pb2.RecordPolicy:
            return tunnel_pb2.RecordPolicy(policy=await typescripts.set_policy(self.store, self.bus, request.policy))

        return await self._call(context, go)

    async def UploadTypescript(
        self, request: tunnel_pb2.TypescriptChunk, context: grpc.aio.ServicerContext
    ) -> tunnel_pb2.TypescriptAck:
        async def go(operator: str) -> tunnel_pb2.TypescriptAck:
            stored = await typescripts.upload(
                self.store, request.sid, request.offset, request.data, request.done, operator
            )
            return tunnel_pb2.TypescriptAck(stored=stored)

        return await self._call_as(context, go)

    async def GetTypescript(
        self, request: tunnel_pb2.GetTypescriptRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tunnel_pb2.TypescriptChunk]:
        try:
            chunks = await typescripts.read(self.store, request.sid)
        except BcError as e:
            await abort_with(context, e)
        offset = 0
        for data in chunks:
            yield tunnel_pb2.TypescriptChunk(sid=request.sid, offset=offset, data=data)
            offset += len(data)

    async def ListTunnels(
        self, request: tunnel_pb2.ListTunnelsRequest, context: grpc.aio.ServicerContext
    ) -> tunnel_pb2.ListTunnelsResponse:
        async def go() -> tunnel_pb2.ListTunnelsResponse:
            rows = await tunnels_ctl.sessions(self.store, request.node_id, request.open_only, request.limit)
            now_ms = await self.store.now_ms()
            return tunnel_pb2.ListTunnelsResponse(tunnels=[record(r, now_ms) for r in rows])

        return await self._call(context, go)

    async def CloseTunnel(
        self, request: tunnel_pb2.CloseTunnelRequest, context: grpc.aio.ServicerContext
    ) -> tunnel_pb2.TunnelRecord:
        async def go(operator: str) -> tunnel_pb2.TunnelRecord:
            row = await tunnels_ctl.session(self.store, request.sid)
            now_ms = await self.store.now_ms()
            if str(row["state"]) != "open":
                return record(row, now_ms)
            why = f"closed by {operator}" + (f": {request.reason[:200]}" if request.reason else "")
            # Relayed here: end it now. Else ask, through the store, the api process that relays it (its relay
            # watches for the ask: `_watch_close`).
            if not self.relays.close(request.sid, why) and not await tunnels_ctl.ask_close(
                self.store, self.bus, str(row["node_id"]), request.sid, why
            ):
                return record(await tunnels_ctl.session(self.store, request.sid), now_ms)  # it ended meanwhile
            # The relay's end writes the record; wait for it so the answer shows the tunnel closed.
            try:
                async with asyncio.timeout(CLOSE_WAIT_S):
                    while str(row["state"]) == "open":
                        await self.bus.wait_events(0.5)
                        row = await tunnels_ctl.session(self.store, request.sid)
            except TimeoutError:
                raise Unavailable(
                    f"tunnel {request.sid} was asked to close, but no process relaying it (through gateway"
                    f" {row['gateway_id']}) closed it within {CLOSE_WAIT_S:.0f} s; is that api process running?"
                ) from None
            return record(row, await self.store.now_ms())

        return await self._call_as(context, go)

    async def RotateTicketKey(
        self, request: tunnel_pb2.RotateTicketKeyRequest, context: grpc.aio.ServicerContext
    ) -> tunnel_pb2.TicketKeyInfo:
        async def go() -> tunnel_pb2.TicketKeyInfo:
            kid, jwks, changed = await tunnels_ctl.rotate(
                self.store, self.bus, self.signer, self.key_dir, self.secrets, self.rng
            )
            # the nodes close them too, from their next spec
            old = {r.kid for r in self.relays.relays.values()} - exec_tickets.kids_of(jwks)
            self.relays.close_kid(old, "key rotated")
            return tunnel_pb2.TicketKeyInfo(kid=kid, jwks=jwks, nodes_changed=changed)

        return await self._call(context, go)

    async def Open(
        self, request_iterator: AsyncIterator[TunnelFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[TunnelFrame]:
        peer = self._identity(context)
        first = await anext(request_iterator, None)
        if first is None or first.WhichOneof("msg") != "open":
            yield _refused("", "bad-request", "a tunnel's first frame must be `open` with its ticket")
            return
        try:
            t = await tunnels_ctl.check_open(self.store, first.open.token, peer.name)
        except TicketRefused as e:
            yield _refused("", e.reason, e.message)
            return
        except BcError as e:
            yield _refused("", "bad-ticket", e.message)
            return
        if self.hub is None or not self.hub.listening(t.node_id):
            if self.route is None:
                yield _refused(
                    t.sid, "not-here", f"node {t.node_id} has no session on this gateway ({self.gateway_id})"
                )
                return
            async with contextlib.aclosing(self._routed(t, first.open.token, request_iterator)) as frames:
                async for frame in frames:
                    yield frame
            return
        try:
            await tunnels_ctl.opened(self.store, self.bus, t, self.gateway_id)
            verdict, node_end, release = await self.hub.connect(t.node_id, t.sid, first.open.token)
        except TicketRefused as e:
            yield _refused(t.sid, e.reason, e.message)
            return
        except Unavailable as e:
            await tunnels_ctl.ended(self.store, self.bus, t, tunnels_ctl.Ending("refused", e.message))
            yield _refused(t.sid, "node-unavailable", e.message)
            return
        try:
            if verdict.WhichOneof("msg") != "accept":
                refusal = verdict.refused
                await tunnels_ctl.ended(
                    self.store, self.bus, t, tunnels_ctl.Ending("refused", f"{refusal.reason}: {refusal.message}")
                )
                yield _refused(t.sid, refusal.reason or "refused", refusal.message or "the node refused the tunnel")
                return
            yield TunnelFrame(accept=TunnelAccept(sid=t.sid))
            async with contextlib.aclosing(self._relay(t, QueueEnd(request_iterator), node_end)) as frames:
                async for frame in frames:
                    yield frame
        finally:
            release.set()

    async def _watch_close(self, sid: str) -> None:
        """Close `sid` once another api process asked for it in the store (`CloseTunnel` there): checked at each
        event wake-up (the ask publishes one) and at least every `CLOSE_POLL_S`."""
        while True:
            await self.bus.wait_events(CLOSE_POLL_S)
            try:
                asks = await tunnels_ctl.close_asks(self.store, [sid])
            except BcError as e:
                log.warning("event=tunnel.close-watch-failed sid=%s why=%s", sid, e.message)
                continue
            if sid in asks and self.relays.close(sid, asks[sid]):
                return

    def _relay(
        self, t: exec_tickets.Ticket, operator: QueueEnd, node: FrameEnd, via: GatewayEnd | None = None
    ) -> AsyncGenerator[TunnelFrame, None]:
        """The frames down to the operator while the relay runs (`tunnel_route.pump`): the relay and the record it
        leaves run in a task of their own, so a call cancelled under this generator cannot skip the record."""
        r = Relay(t.sid, t.node_id, t.operator, t.kid)

        def gone() -> None:
            r.end_reason = r.end_reason or "the operator's stream ended"

        lifetime = functools.partial(self._lifetime, t, r, operator, node, via)
        return pump(lifetime, operator, f"tunnel-{t.sid}", self._lifetimes, gone)

    async def _lifetime(
        self, t: exec_tickets.Ticket, r: Relay, operator: QueueEnd, node: FrameEnd, via: GatewayEnd | None
    ) -> None:
        watch = asyncio.create_task(self._watch_close(t.sid), name=f"tunnel-close-watch-{t.sid}")
        try:
            await self.relays.relay(r, operator, node)
        finally:
            watch.cancel()
            if via is not None:  # a relay through another gateway: its call ends with ours (and so its relay)
                with contextlib.suppress(Exception):
                    await via.close()
            ending = tunnels_ctl.Ending("closed", r.end_reason or "closed", r.bytes_up, r.bytes_down, r.exit_code)
            try:
                await tunnels_ctl.ended(self.store, self.bus, t, ending)
            except BcError as e:
                log.warning("event=tunnel.record-failed sid=%s why=%s", t.sid, e.message)

    async def _routed(
        self, t: exec_tickets.Ticket, token: str, requests: AsyncIterator[TunnelFrame]
    ) -> AsyncGenerator[TunnelFrame, None]:
        """The tunnel through the gateway that holds the node's session (`GatewayTunnels.Relay`)."""
        assert self.route is not None
        try:
            gateway_id, address = await self.route.find(t.node_id)
        except Unavailable as e:
            yield _refused(t.sid, "node-unavailable", e.message)
            return
        try:
            await tunnels_ctl.opened(self.store, self.bus, t, gateway_id)
        except TicketRefused as e:
            yield _refused(t.sid, e.reason, e.message)
            return
        try:
            verdict, via = await self.route.open(gateway_id, address, t.node_id, t.sid, token)
        except Unavailable as e:
            await tunnels_ctl.ended(self.store, self.bus, t, tunnels_ctl.Ending("refused", e.message))
            yield _refused(t.sid, "node-unavailable", e.message)
            return
        log.info("event=tunnel.routed sid=%s node=%s gateway=%s", t.sid, t.node_id, gateway_id)
        if verdict.WhichOneof("msg") != "accept":
            await via.close()
            refusal = verdict.refused
            await tunnels_ctl.ended(
                self.store, self.bus, t, tunnels_ctl.Ending("refused", f"{refusal.reason}: {refusal.message}")
            )
            yield _refused(t.sid, refusal.reason or "refused", refusal.message or "the node refused the tunnel")
            return
        yield TunnelFrame(accept=TunnelAccept(sid=t.sid))
        async with contextlib.aclosing(self._relay(t, QueueEnd(requests), via, via)) as frames:
            async for frame in frames:
                yield frame


class _NodeEnd:
    """A node's Carry stream (server side) as a relay end."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.context = context

    async def send(self, frame: TunnelFrame) -> None:
        await self.context.write(frame)

    async def recv(self) -> TunnelFrame | None:
        m = await self.context.read()
        return None if m is grpc.aio.EOF else m


class NodeTunnelsServicer(tunnel_pb2_grpc.NodeTunnelsServicer):
    """The node's side: authenticated by its certificate (revoked serials refused, as a session is)."""

    def __init__(self, hub: TunnelHub, ca_cert: x509.Certificate, refuse_revoked: Any) -> None:
        self.hub, self.ca_cert, self.refuse_revoked = hub, ca_cert, refuse_revoked

    async def _node(self, context: grpc.aio.ServicerContext) -> str:
        from bc.api.peers import peer_of
        from bc.wire.status import abort_with

        try:
            peer = peer_of(context, self.ca_cert, "node")
            await self.refuse_revoked(peer.serial)
        except BcError as e:
            await abort_with(context, e)
        return peer.name

    async def Listen(
        self, request: tunnel_pb2.TunnelListen, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tunnel_pb2.TunnelOffer]:
        """The offers of an agent that does not take them on its session (no `tunnel.offers` in its Hello, or a
        gateway that did not answer it): kept for older agents (bc.protocol.capabilities)."""
        node_id = await self._node(context)
        async for offer in self.hub.listen(node_id):
            yield offer

    async def Carry(  # type: ignore[override]
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        node_id = await self._node(context)
        end = _NodeEnd(context)
        first = await end.recv()
        if first is None:
            return
        await self.hub.attach(node_id, first, end)
