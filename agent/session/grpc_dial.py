"""The production `dial()`: a mutual-TLS gRPC channel to the gateway and one NodeSession stream over it.

Each dial reads the key pair anew (through the agent's offload), so the
session after a renewal presents the new certificate; the CA certificate and
the server address are read once, before the loop. The link owns its
channel: closing the link closes the channel.

Our back-off owns redialing (`agent.session.dialing`): a channel that cannot
connect within `CONNECT_TIMEOUT_S` is dropped (`LinkClosed("UNAVAILABLE")`)
rather than left to grpc's own reconnect back-off, which grows to minutes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from agent.identity import Identity
from agent.offload import Offload
from agent.session.dialing import Dial
from bc.protocol.limits import LIMITS
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.wire.link import GrpcClientLink, Link, LinkClosed
from bc.wire.stubs import session_pb2_grpc
from bc.wire.tls import channel_credentials

CONNECT_TIMEOUT_S = 5.0

CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # The table's message limits (bc.protocol.limits): this agent never writes a frame over
    # max_frame_bytes, and accepts what a gateway may write.
    *LIMITS.grpc_options(),
)


def grpc_dial(data_dir: Path, identity: Identity, ca_pem: bytes, offload: Offload) -> Dial:
    """The dial of a joined node: its server, its CA, and the key pair on disk at each dial."""

    def read_pair() -> tuple[bytes, bytes]:
        return identity.read(data_dir, "key"), identity.read(data_dir, "cert")

    async def dial() -> Link[GatewayMessage, NodeMessage]:
        key_pem, cert_pem = await offload(read_pair)
        channel = grpc.aio.secure_channel(
            identity.server, channel_credentials(ca_pem, key_pem, cert_pem), options=list(CHANNEL_OPTIONS)
        )
        try:
            await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
        except TimeoutError:
            await channel.close()
            raise LinkClosed("UNAVAILABLE", f"cannot connect to {identity.server}") from None
        except BaseException:
            await channel.close()
            raise
        return GrpcClientLink(session_pb2_grpc.NodeSessionStub(channel).Session(), channel)

    return dial
