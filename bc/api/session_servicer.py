"""NodeSession.Session over gRPC: authenticate the node by its certificate, then hand the stream to the gateway."""

from __future__ import annotations

import grpc
from cryptography import x509

from bc.api.peers import peer_of
from bc.errors import BcError, Overloaded
from bc.gateway.sessions import Gateway
from bc.protocol import closing
from bc.protocol.closing import SessionRefused
from bc.wire.link import GrpcServerLink, reason_metadata
from bc.wire.status import error_to_status
from bc.wire.stubs import session_pb2_grpc


class SessionServicer(session_pb2_grpc.NodeSessionServicer):
    def __init__(self, gateway: Gateway, ca_cert: x509.Certificate) -> None:
        self.gateway = gateway
        self.ca_cert = ca_cert

    # A read/write-style handler: it drives context.read() and context.write() itself and returns nothing.
    async def Session(  # type: ignore[override]
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        try:
            self.gateway.admit()
            peer = peer_of(context, self.ca_cert, "node")
            # grpcio cannot consult our revocation list during the TLS handshake, so a revoked serial is
            # refused here, before the stream carries a single frame (the Hello transaction checks again).
            await self.gateway.refuse_revoked(peer.serial)
        except SessionRefused as e:  # with its typed reason, so the node stops dialing with this certificate
            await GrpcServerLink(context).close("UNAUTHENTICATED", e.message, e.reason)
            return
        except BcError as e:
            code, msg = error_to_status(e)
            retry_after_ms = e.retry_after_ms if isinstance(e, Overloaded) else None  # an overloaded gateway's hint
            await context.abort(code, msg, trailing_metadata=reason_metadata(closing.UNSPECIFIED, retry_after_ms))
            return
        await self.gateway.serve(GrpcServerLink(context), peer)
