"""Join.Renew on a gateway-only process: proxied to an api process, which alone holds the CA.

The gateway forwards the node's TLS client certificate (`NODE_CERT_MD`, DER) with
the request, as it came, over its own mutual-TLS channel (its serving certificate
is also a `gateway:<id>` client certificate). The api trusts the gateway for
nothing but carrying it: it takes the forwarded certificate only from a caller
authenticated as a gateway, and then checks it like its own caller's (issued by
its CA, stored, unrevoked, unexpired, of the node's current identity) and the
node's proof of possession over the CSR and timestamp against that
certificate's key. A compromised gateway therefore cannot mint certificates.

Join is not proxied: a join leaf is not bound to the CSR it carries, so a
gateway in the middle could swap the CSR. A gateway-only process answers it
UNIMPLEMENTED, and `bc join` moves on to the next address of its `--server` list.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc
from cryptography.hazmat.primitives import serialization

from bc.protocol.pb import join_pb2
from bc.wire.stubs import join_pb2_grpc
from bc.wire.tls import peer_cert_from_context

log = logging.getLogger("bc.renew_proxy")

NODE_CERT_MD = "bc-node-cert-bin"
RPC_TIMEOUT_S = 20.0
JOIN_HERE = "this gateway holds no CA and does not serve Join; join through an api process"


class RenewProxy(join_pb2_grpc.JoinServicer):
    def __init__(
        self,
        api_addresses: Callable[[], Awaitable[list[str]]],
        credentials: Callable[[], grpc.ChannelCredentials],
    ) -> None:
        self.api_addresses, self.credentials = api_addresses, credentials

    async def Join(self, request: join_pb2.JoinRequest, context: grpc.aio.ServicerContext) -> join_pb2.JoinResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, JOIN_HERE)
        raise AssertionError("unreachable: abort raises")

    async def Renew(self, request: join_pb2.RenewRequest, context: grpc.aio.ServicerContext) -> join_pb2.RenewResponse:
        cert = peer_cert_from_context(context)
        if cert is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "renewal needs the node's current certificate")
            raise AssertionError("unreachable: abort raises")
        metadata = ((NODE_CERT_MD, cert.public_bytes(serialization.Encoding.DER)),)
        last = "no api process is registered in the store"
        for address in await self.api_addresses():
            try:
                async with grpc.aio.secure_channel(address, self.credentials()) as channel:
                    response: join_pb2.RenewResponse = await join_pb2_grpc.JoinStub(channel).Renew(
                        request, metadata=metadata, timeout=RPC_TIMEOUT_S
                    )
                log.info("event=renew-proxy.forwarded api=%s serial=%x", address, cert.serial_number)
                return response
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    await context.abort(e.code(), e.details() or "")
                last = f"{address}: {e.details()}"
                log.warning("event=renew-proxy.api-unavailable api=%s error=%s", address, e.details())
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"no api process answers to renew through ({last})")
        raise AssertionError("unreachable: abort raises")
