"""The production `dial()`: a mutual-TLS gRPC channel to the gateway and one NodeSession stream over it.

The channels are kept (`agent.session.channels`): one per gateway address, made with credentials built
once per key pair (its files are stat'ed at each dial and read again only when they changed, so the session
after a renewal presents the new certificate), left open when a stream ends, closed once a session opens on
another address. The CA certificate and the server address are read once, before the loop.

Our back-off owns redialing (`agent.session.dialing`): a dial that finds no channel ready within its
patience (`Rotation.timeout`) raises `LinkClosed("UNAVAILABLE")` and the loop backs off, but the channels it
was waiting for are not closed: their handshakes go on, and the next dial takes whichever is ready. With
several gateways, the next address is tried when the last one failed (TRANSIENT_FAILURE: refused, reset) or
kept the node waiting `PER_ADDRESS_TIMEOUT_S` (at first); the earlier ones stay in the race, up to
`MAX_RACING` channels still connecting.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc

from agent.identity import Identity
from agent.offload import Offload
from agent.session.channels import Channels, KeyPair, PairSource
from agent.session.dialing import Dial
from bc.protocol import closing
from bc.protocol.limits import LIMITS
from bc.protocol.pb.session_pb2 import CloseReason, GatewayMessage, NodeMessage
from bc.seams.link import Link, LinkClosed
from bc.wire.link import GrpcClientLink
from bc.wire.stubs import session_pb2_grpc

CONNECT_TIMEOUT_S = 5.0
MAX_RACING = 2
"""Channels a dial waits for at once: a gateway slow to handshake (a storm) keeps its place in the race, and
one more is tried beside it, not every one the node knows: with three each, 10,000 nodes held 35,000
connections and asked the three gateways for as many handshakes."""

CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # A kept channel whose gateway went away reconnects by itself within 2 s (grpc's default grows to minutes).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # The table's message limits (bc.protocol.limits): this agent never writes a frame over
    # max_frame_bytes, and accepts what a gateway may write.
    *LIMITS.grpc_options(),
)


def new_channel(addr: str, creds: grpc.ChannelCredentials) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(addr, creds, options=list(CHANNEL_OPTIONS))


class GrpcDial:
    """The dial of a joined node: its server list, its CA, its key pair; `rng` (the agent's injected Random)
    orders the gateways after the first. Call it to dial; `aclose()` when the agent stops."""

    def __init__(
        self,
        data_dir: Path,
        identity: Identity,
        ca_pem: bytes,
        offload: Offload,
        rng: random.Random,
        pair: PairSource | None = None,
    ):
        """`pair`: where the TLS key pair comes from; left out, the identity's files (`KeyPair`). A TPM identity
        passes its session keys (`agent.session_key`), held in memory only."""
        self.server = identity.server
        self.offload = offload
        self.pair: PairSource = pair or KeyPair(data_dir / identity.files["key"], data_dir / identity.files["cert"])
        self.channels = Channels(ca_pem, new_channel)
        self.rotation = Rotation([a.strip() for a in identity.server.split(",") if a.strip()], rng)

    async def __call__(self) -> Link[GatewayMessage, NodeMessage]:
        pair = await self.offload(self.pair.changed)
        if pair is None and self.channels.creds is None:
            raise LinkClosed("UNAVAILABLE", "no session certificate yet: the node asks Join.SessionCert for one")
        await self.channels.use_pair(pair)
        rotation, loop = self.rotation, asyncio.get_running_loop()
        several = len(rotation.addrs) > 1
        timeout = rotation.timeout(PER_ADDRESS_TIMEOUT_S if several else CONNECT_TIMEOUT_S)
        racing: dict[asyncio.Task[bool], str] = {}
        try:
            for addr in rotation.order(loop.time()):
                if sum(1 for t in racing if not t.done()) >= MAX_RACING:
                    break  # slow, not gone: wait for these at the next dial rather than start one more handshake
                ch = self.channels.get(addr)
                if ch.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                    # Failed before this dial (a gateway that was gone): a new attempt now, not after grpc's back-off.
                    await self.channels.drop(addr)
                    ch = self.channels.get(addr)
                if ch.get_state() == grpc.ChannelConnectivity.READY and not racing:  # kept, and connected
                    rotation.connected(addr, loop.time())
                    await self.channels.keep_only(addr)
                    return _RotationLink(ch, rotation)
                newest = asyncio.create_task(_ready(ch, give_up_on_failure=several))
                racing[newest] = addr
                won = await _first_ready(racing, newest, timeout)
                if won is not None:
                    rotation.connected(won, loop.time())
                    await self.channels.keep_only(won)
                    return _RotationLink(self.channels.get(won), rotation)
        finally:
            for t in racing:
                t.cancel()
            await asyncio.gather(*racing, return_exceptions=True)
        rotation.missed()
        raise LinkClosed("UNAVAILABLE", f"cannot connect to {self.server}")

    async def aclose(self) -> None:
        await self.channels.close_all()


def grpc_dial(
    data_dir: Path,
    identity: Identity,
    ca_pem: bytes,
    offload: Offload,
    rng: random.Random,
    pair: PairSource | None = None,
) -> Dial:
    """The production dial (`GrpcDial`)."""
    return GrpcDial(data_dir, identity, ca_pem, offload, rng, pair)


async def _first_ready(
    racing: dict[asyncio.Task[bool], str], newest: asyncio.Task[bool], patience: float
) -> str | None:
    """The address of the first channel in the race to become READY within `patience` seconds; None when the
    newest failed first (go on to the next address: the earlier ones stay in the race) or none was ready in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while True:
        for t, addr in racing.items():
            if t.done() and not t.cancelled() and t.exception() is None and t.result():
                return addr
        pending = [t for t in racing if not t.done()]
        remaining = deadline - loop.time()
        if newest.done() or not pending or remaining <= 0:
            return None
        await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)


class _RotationLink(GrpcClientLink[GatewayMessage, NodeMessage]):
    """The session's stream, opened with its first frame (the Hello); a refusal that names when to come back
    (an overloaded gateway's retry-after) sends the next dial to the same gateway, over the channel still open
    to it: no new TLS handshake.

    The stream starts when the Hello is written, not when the channel is ready: a gateway gives a new stream
    10 s to send its Hello (`GatewayConfig.hello_timeout_s`), and a node whose process was slow between the
    two (10,000 agents in four processes on a loaded machine) lost its stream to that timer, then dialed,
    and lost the next."""

    def __init__(self, channel: grpc.aio.Channel, rotation: Rotation) -> None:
        super().__init__(None)  # the call comes with the first frame (`_start`)
        self.channel = channel  # the session's channel: the node's tunnels ride it too (agent.tunnel.service)
        self._stub: session_pb2_grpc.NodeSessionStub | None = session_pb2_grpc.NodeSessionStub(channel)
        self._rotation = rotation

    def _start(self) -> None:
        if self._stub is not None:
            self._call = self._stub.Session()  # the channel is the dial's (kept), not the link's
            self._stub = None

    async def send(self, msg: NodeMessage) -> None:
        self._start()
        try:
            await super().send(msg)
        except LinkClosed as e:
            self._ended(e)
            raise

    async def recv(self) -> GatewayMessage | None:
        self._start()
        try:
            return await super().recv()
        except LinkClosed as e:
            self._ended(e)
            raise

    async def close(
        self, code: str, details: str, reason: CloseReason = closing.UNSPECIFIED, *, retry_after_ms: int | None = None
    ) -> None:
        if self._stub is None:  # a stream was opened: cancel it
            await super().close(code, details, reason, retry_after_ms=retry_after_ms)

    def _ended(self, e: LinkClosed) -> None:
        if e.code == "RESOURCE_EXHAUSTED" and e.retry_after_ms is not None:
            self._rotation.come_back()


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
        self.returning = False  # the last session was refused with a retry-after: come back to the same gateway

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

    def come_back(self) -> None:
        """The gateway refused the session with a retry-after (overloaded, not gone): the next dial goes to it
        again, short as the session was. It named when it expects room; another gateway knows nothing of it."""
        self.returning = True

    def order(self, now: float) -> list[str]:
        short = self.connected_at is not None and now - self.connected_at < STICKY_S
        if short and len(self.addrs) > 1 and not self.returning:
            self.first = (self.first + 1) % len(self.addrs)  # the last one did not keep us: go on to the next
        self.connected_at = None
        self.returning = False
        n = len(self.addrs)
        rest = [self.addrs[(self.first + k) % n] for k in range(1, n)]
        if self.rng is not None:
            self.rng.shuffle(rest)
        return [self.addrs[self.first], *rest]

    def connected(self, addr: str, now: float) -> None:
        self.first = self.addrs.index(addr)
        self.connected_at = now
        self.misses = 0
