"""A gateway-only process's calls to an api process: Join, Renew, Rejoin, SessionCert and secret requests, over
the gateway's own mutual TLS.

The gateway's serving certificate is also a `gateway:<id>` client certificate, and that is what it
dials with. `bc.api.join_proxy` is handed an `ApiLink` rather than dialing itself, so a test can wrap
the production link in a tamperer (what a compromised gateway would run) and see the api refuse it.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from bc.protocol.pb import join_pb2, secrets_pb2
from bc.wire.stubs import join_pb2_grpc, secrets_pb2_grpc

RPC_TIMEOUT_S = 20.0
Metadata = tuple[tuple[str, bytes], ...]


class ApiLink:
    """One call per channel: a join or a renewal is rare, and each may go to another api process."""

    def __init__(self, credentials: Callable[[], grpc.ChannelCredentials]) -> None:
        self.credentials = credentials  # read at each call: the serving certificate is renewed in place

    async def join(self, address: str, request: join_pb2.JoinRequest) -> join_pb2.JoinResponse:
        async with grpc.aio.secure_channel(address, self.credentials()) as channel:
            response: join_pb2.JoinResponse = await join_pb2_grpc.JoinStub(channel).Join(request, timeout=RPC_TIMEOUT_S)
        return response

    async def rejoin(self, address: str, request: join_pb2.RejoinRequest) -> join_pb2.RenewResponse:
        async with grpc.aio.secure_channel(address, self.credentials()) as channel:
            response: join_pb2.RenewResponse = await join_pb2_grpc.JoinStub(channel).Rejoin(
                request, timeout=RPC_TIMEOUT_S
            )
        return response

    async def session_cert(self, address: str, request: join_pb2.SessionCertRequest) -> join_pb2.SessionCertResponse:
        async with grpc.aio.secure_channel(address, self.credentials()) as channel:
            response: join_pb2.SessionCertResponse = await join_pb2_grpc.JoinStub(channel).SessionCert(
                request, timeout=RPC_TIMEOUT_S
            )
        return response

    async def secret(self, address: str, request: secrets_pb2.SecretRequest) -> secrets_pb2.SecretResponse:
        """A node's secret request, forwarded as it came (`bc.api.secret_broker`)."""
        async with grpc.aio.secure_channel(address, self.credentials()) as channel:
            response: secrets_pb2.SecretResponse = await secrets_pb2_grpc.SecretBrokerStub(channel).Answer(
                request, timeout=RPC_TIMEOUT_S
            )
        return response

    async def renew(self, address: str, request: join_pb2.RenewRequest, metadata: Metadata) -> join_pb2.RenewResponse:
        async with grpc.aio.secure_channel(address, self.credentials()) as channel:
            response: join_pb2.RenewResponse = await join_pb2_grpc.JoinStub(channel).Renew(
                request, metadata=metadata, timeout=RPC_TIMEOUT_S
            )
        return response
