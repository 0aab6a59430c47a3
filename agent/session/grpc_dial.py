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
import random
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


def grpc_dial(data_dir: Path, identity: Identity, ca_pem: bytes, offload: Offload, rng: random.Random) -> Dial:
    """The dial of a joined node: its server, its CA, and the key pair on disk at each dial; `rng` (the
    agent's injected Random) orders the gateways after the first."""

    def read_pair() -> tuple[bytes, bytes]:
        return identity.read(data_dir, "key"), identity.read(data_dir, "cert")

    rotation = Rotation([a.strip() for a in identity.server.split(",") if a.strip()], rng)

    async def dial() -> Link[GatewayMessage, NodeMessage]:
        key_pem, cert_pem = await offload(read_pair)
        creds = channel_credentials(ca_pem, key_pem, cert_pem)
        loop = asyncio.get_running_loop()
        timeout = rotation.timeout(CONNECT_TIMEOUT_S if len(rotation.addrs) == 1 else PER_ADDRESS_TIMEOUT_S)
        several = len(rotation.addrs) > 1
        for addr in rotation.order(loop.time()):
            channel = grpc.aio.secure_channel(addr, creds, options=list(CHANNEL_OPTIONS))
            try:
                async with asyncio.timeout(timeout):
                    ready = await _ready(channel, give_up_on_failure=several)
            except TimeoutError:
                ready = False
            except BaseException:
                await channel.close()
                raise
            if not ready:
                await channel.close()
                continue
            rotation.connected(addr, loop.time())
            return GrpcClientLink(session_pb2_grpc.NodeSessionStub(channel).Session(), channel)
        rotation.missed()
        raise LinkClosed("UNAVAILABLE", f"cannot connect to {identity.server}")

    return dial


async def _ready(channel: grpc.aio.Channel, *, give_up_on_failure: bool) -> bool:
    """Wait until the channel is READY. With other gateways to try, a first TRANSIENT_FAILURE (a refused
    or reset connection: a gateway that is gone) gives up at once instead of retrying until the timeout."""
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if give_up_on_failure and state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return False
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)
    return True


PER_ADDRESS_TIMEOUT_S = 2.0
"""With several gateways, how long one may take to answer before the next is tried (at first: `Rotation.timeout`)."""

MAX_CONNECT_TIMEOUT_S = 30.0
"""The longest one address is waited for, after dials in a row that reached none."""

STICKY_S = 10.0
"""A session shorter than this (a gateway that refuses, a fenced one) sends the next dial to the next address."""


class Rotation:
    """Which gateway a node dials first: the one it last reached, unless that session was short-lived.

    Pure: the dial reports where it connected and when, and asks for the order of the next attempt. With an
    `rng`, the gateways after the first come in a random order at each attempt: when a gateway dies, its nodes
    spread over all the others instead of every one of them landing on the one listed after it (nodes joined
    with the same `--server` list share that order), which would take the whole reconnect storm alone.
    """

    def __init__(self, addrs: list[str], rng: random.Random | None = None) -> None:
        self.addrs = addrs
        self.rng = rng
        self.first = 0
        self.connected_at: float | None = None
        self.misses = 0  # dials in a row that reached no address

    def timeout(self, base: float) -> float:
        """How long one address may take to become ready: `base`, doubled for every dial in a row that reached
        none, up to `MAX_CONNECT_TIMEOUT_S`.

        A gateway that is gone refuses at once (TRANSIENT_FAILURE); one that is slow is busy with handshakes,
        as in a reconnect storm. A fixed short timeout then closes every channel just before its handshake
        would have finished, and the next dial queues a new one behind the rest: with 10,000 nodes on three
        gateways, no session opened at all. Growing the patience lets the handshakes already queued finish."""
        return min(MAX_CONNECT_TIMEOUT_S, base * float(2 ** min(self.misses, 8)))

    def missed(self) -> None:
        self.misses += 1

    def order(self, now: float) -> list[str]:
        if self.connected_at is not None and now - self.connected_at < STICKY_S and len(self.addrs) > 1:
            self.first = (self.first + 1) % len(self.addrs)  # the last one did not keep us: go on to the next
        self.connected_at = None
        n = len(self.addrs)
        rest = [self.addrs[(self.first + k) % n] for k in range(1, n)]
        if self.rng is not None:
            self.rng.shuffle(rest)
        return [self.addrs[self.first], *rest]

    def connected(self, addr: str, now: float) -> None:
        self.first = self.addrs.index(addr)
        self.connected_at = now
        self.misses = 0
