"""The gateway's half of tunnels: which nodes listen here, offers to them, and the relay of open tunnels.

A node takes its offers on its session stream (`GatewayMessage.tunnel_offer`: the session's driver `hold`s
the node here once it welcomed a node whose Hello named `tunnel.offers`) or, an older agent, on one
`NodeTunnels.Listen` stream on the channel of its session (`listen`); either way one `OfferSink` a node, the
newest, on the gateway that holds the node's session. An operator's `Tunnels.Open` (`bc.api.tunnel_servicer`)
asks the hub to `connect` to a node: the hub puts the ticket's offer in that node's sink and waits for the
node's `Carry` stream to `attach` with the same sid (only that node's: a Carry from another node, or for a sid
nobody waits for, is ended). The node's first
frame is its verdict (`accept` or `refused`); after an accept, `relay` moves the frames both ways.

The relay holds ciphertext only (TLS between the CLI and the node, `bc.wire.tls_pipe`): it reads and counts
`data` frames, and cannot read or change them unseen. Each direction has its own bounded buffer
(`ByteQueue`, `MAX_BUFFERED` bytes): a reader that finds it full waits, so the sender's gRPC stream stops
being read and HTTP/2's flow control pushes back to the sender; a tunnel never holds more than twice
`MAX_BUFFERED` (plus one frame a direction) in this process, however fast one end writes and slow the other
reads. Frames other than `data` and `end`, or over `MAX_FRAME` bytes, end the tunnel.

Tunnels end when either end closes, when `close`/`close_node`/`close_kid` says so (an admin's close, the
node's revocation, a key rotation), or when the node's sink is released (its session, or its Listen stream,
ended: the session left this gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from bc.errors import Unavailable
from bc.protocol.pb.tunnel_pb2 import TunnelEnd, TunnelFrame, TunnelOffer

log = logging.getLogger("bc.gateway.tunnels")

MAX_BUFFERED = 256 * 1024
"""Bytes a tunnel may hold in this process per direction, waiting for the slower end."""
MAX_FRAME = 128 * 1024
"""The largest `data` frame relayed (the ends write at most 64 KiB of plaintext plus TLS's overhead)."""
END_SEND_S = 1.0
"""How long a relay that ends waits to tell the operator why."""
OTHER_SIDE_S = 2.0
"""How long a relay one side of which ended waits for the other (the operator's `end` and its exit code)."""
OFFER_TIMEOUT_S = 10.0
"""How long an offer waits for the node's verdict."""


class FrameEnd(Protocol):
    """One end of a relay: the operator's Open stream or the node's Carry stream."""

    async def send(self, frame: TunnelFrame) -> None: ...

    async def recv(self) -> TunnelFrame | None: ...


class ByteQueue:
    """A FIFO of frames bounded by their bytes (one frame is always taken, however large, so nothing sticks)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size, self.peak = limit, 0, 0
        self._items: deque[tuple[TunnelFrame | None, int]] = deque()
        self._cond = asyncio.Condition()

    async def put(self, item: TunnelFrame | None, n: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.size == 0 or self.size + n <= self.limit)
            self._items.append((item, n))
            self.size += n
            self.peak = max(self.peak, self.size)
            self._cond.notify_all()

    async def get(self) -> TunnelFrame | None:
        async with self._cond:
            await self._cond.wait_for(lambda: bool(self._items))
            item, n = self._items.popleft()
            self.size -= n
            self._cond.notify_all()
            return item


@dataclass
class Relay:
    sid: str
    node_id: str
    operator: str
    kid: str
    bytes_up: int = 0
    bytes_down: int = 0
    exit_code: int | None = None
    end_reason: str = ""
    peak_buffered: int = 0
    task: asyncio.Task[None] | None = None


@dataclass
class _Waiting:
    node_id: str
    verdict: asyncio.Future[tuple[TunnelFrame, FrameEnd]]
    done: asyncio.Event = field(default_factory=asyncio.Event)


class OfferSink(Protocol):
    """Where a node's offers go: a Listen stream's `Offers`, or the node's session (`SessionDriver`). None says
    a newer sink of the node took over (or the node is closed here): offers not yet sent are dropped."""

    def put_nowait(self, item: TunnelOffer | None) -> None: ...


class Offers:
    """One Listen stream's offers, in order; None ends the stream.

    Every node session a gateway holds has one, waiting nearly always and carrying an offer only when an
    operator opens a tunnel, so it is kept small: an `asyncio.Queue` is four deques and an Event, about 3 KiB
    a session (docs/scale.md, the memory per session); this is a deque made at the first offer and one future
    while the stream waits. One reader (the Listen stream), any number of writers, never full."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[TunnelOffer | None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: TunnelOffer | None) -> None:
        if self._items is None:
            self._items = deque()
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> TunnelOffer | None:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class TunnelHub:
    def __init__(self) -> None:
        self._listeners: dict[str, OfferSink] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._carried: dict[str, asyncio.Event] = {}  # sid → set when the relay is over (the Carry may end)
        self.relays: dict[str, Relay] = {}

    # -- the node's streams -------------------------------------------------------------------------

    def hold(self, node_id: str, sink: OfferSink) -> None:
        """`sink` takes `node_id`'s offers from now on; the sink before it (a Listen stream, a session) is told
        None and gets no more."""
        old = self._listeners.get(node_id)
        if old is not None and old is not sink:
            old.put_nowait(None)
        self._listeners[node_id] = sink

    def release(self, node_id: str, sink: OfferSink) -> None:
        """`sink`'s session or stream ended: if it still held the node, the node's tunnels here end with it."""
        if self._listeners.get(node_id) is sink:
            del self._listeners[node_id]
            self.close_node(node_id, "the node's session left this gateway")

    async def listen(self, node_id: str) -> AsyncIterator[TunnelOffer]:
        """The offers for `node_id` on a Listen stream (an older agent), until its next sink replaces this one
        or `close_node`."""
        q = Offers()
        self.hold(node_id, q)
        try:
            while (offer := await q.get()) is not None:
                yield offer
        finally:
            self.release(node_id, q)

    def listening(self, node_id: str) -> bool:
        return node_id in self._listeners

    async def attach(self, node_id: str, first: TunnelFrame, end: FrameEnd) -> None:
        """A node's Carry stream, whose first frame is its verdict; returns once the tunnel is over."""
        kind = first.WhichOneof("msg")
        sid = first.accept.sid if kind == "accept" else first.refused.sid if kind == "refused" else ""
        w = self._waiting.get(sid)
        if w is None or w.node_id != node_id or w.verdict.done():
            log.warning("event=tunnel.stray-carry node=%s sid=%s kind=%s", node_id, sid[:64], kind)
            return
        w.verdict.set_result((first, end))
        await w.done.wait()

    # -- the operator's side ------------------------------------------------------------------------

    async def connect(self, node_id: str, sid: str, token: str) -> tuple[TunnelFrame, FrameEnd, asyncio.Event]:
        """Offer the ticket to `node_id`; its verdict frame, its end, and the event that releases its Carry."""
        q = self._listeners.get(node_id)
        if q is None:
            raise Unavailable(f"node {node_id} has no session on this gateway; is it connected?")
        w = _Waiting(node_id, asyncio.get_running_loop().create_future())
        self._waiting[sid] = w
        try:
            q.put_nowait(TunnelOffer(sid=sid, token=token))
            async with asyncio.timeout(OFFER_TIMEOUT_S):
                first, end = await w.verdict
        except TimeoutError:
            w.done.set()
            raise Unavailable(
                f"node {node_id} did not answer the tunnel's offer within {OFFER_TIMEOUT_S:.0f} s"
            ) from None
        except BaseException:
            w.done.set()
            raise
        finally:
            self._waiting.pop(sid, None)
        return first, end, w.done

    async def relay(self, r: Relay, operator: FrameEnd, node: FrameEnd) -> None:
        """Move frames both ways until either end stops; `r` counts them. Cancel it to close the tunnel."""
        self.relays[r.sid] = r
        r.task = asyncio.current_task()
        up_q, down_q = ByteQueue(MAX_BUFFERED), ByteQueue(MAX_BUFFERED)
        told_node = False  # whether the node got an `end` (it reads on to one, or to its stream's end)

        async def read(src: FrameEnd, q: ByteQueue, up: bool) -> None:
            try:
                while True:
                    f = await src.recv()
                    if f is None:
                        log.debug("event=tunnel.side-ended sid=%s side=%s", r.sid, "operator" if up else "node")
                        if up:  # tell the node now, not once the node's side had its moment
                            await q.put(TunnelFrame(end=TunnelEnd(reason="the operator's stream ended")), 0)
                        break
                    kind = f.WhichOneof("msg")
                    if kind == "end":
                        log.debug("event=tunnel.end sid=%s side=%s", r.sid, "operator" if up else "node")
                        if up and f.end.has_exit_code:
                            r.exit_code = f.end.exit_code
                        await q.put(f, 0)
                        break
                    if kind != "data" or len(f.data) > MAX_FRAME:
                        r.end_reason = r.end_reason or f"a {kind} frame of {f.ByteSize()} bytes is not relayed"
                        break
                    if up:
                        r.bytes_up += len(f.data)
                    else:
                        r.bytes_down += len(f.data)
                    await q.put(f, len(f.data))
            finally:
                await q.put(None, 0)

        async def write(dst: FrameEnd, q: ByteQueue) -> None:
            nonlocal told_node
            while (f := await q.get()) is not None:
                await dst.send(f)
                if f.WhichOneof("msg") == "end":
                    told_node = told_node or dst is node
                    return

        tasks = [
            asyncio.create_task(read(operator, up_q, True)),
            asyncio.create_task(write(node, up_q)),
            asyncio.create_task(read(node, down_q, False)),
            asyncio.create_task(write(operator, down_q)),
        ]
        try:
            # The tunnel lasts until one side is over: the operator's stream read to its `end` (or its end), or the
            # node's written out to the operator. The other side then has a moment to finish (the operator's `end`
            # carries the exit code of what ran through the tunnel, sent once ssh exits), never longer.
            sides = [tasks[0], tasks[3]]
            _done, rest = await asyncio.wait(sides, return_when=asyncio.FIRST_COMPLETED)
            if rest:
                await asyncio.wait(rest, timeout=OTHER_SIDE_S)
        finally:
            for t in tasks:
                t.cancel()
            # A write on a stream its peer already ended may not end at once on a cancel: give them a moment,
            # never the tunnel's record.
            await asyncio.wait(tasks, timeout=END_SEND_S)
            results = [t.exception() if t.done() and not t.cancelled() else None for t in tasks]
            r.peak_buffered = max(up_q.peak, down_q.peak)
            log.info(
                "event=tunnel.relay-ended sid=%s node=%s up=%d down=%d peak=%d why=%s",
                r.sid,
                r.node_id,
                r.bytes_up,
                r.bytes_down,
                r.peak_buffered,
                r.end_reason or "-",
            )
            for res in results:
                if isinstance(res, Exception) and not r.end_reason:
                    r.end_reason = f"{type(res).__name__}: {res}"[:200]
            self.relays.pop(r.sid, None)
            # Say why to the operator, if their stream still reads (a gone one must not hold the relay open), and to
            # the node if nothing did (a close, a revocation): its side ends now, not with its session.
            why = TunnelFrame(end=TunnelEnd(reason=r.end_reason or "closed"))
            for end, tell in ((operator, True), (node, not told_node)):
                if tell:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(END_SEND_S):
                            await end.send(why)

    # -- closing ------------------------------------------------------------------------------------

    def close(self, sid: str, reason: str) -> bool:
        r = self.relays.get(sid)
        if r is None or r.task is None:
            return False
        r.end_reason = reason
        r.task.cancel()
        return True

    def close_node(self, node_id: str, reason: str) -> int:
        q = self._listeners.pop(node_id, None)
        if q is not None:
            q.put_nowait(None)
        return sum(self.close(r.sid, reason) for r in list(self.relays.values()) if r.node_id == node_id)

    def close_kid(self, kids: set[str], reason: str) -> int:
        return sum(self.close(r.sid, reason) for r in list(self.relays.values()) if r.kid in kids)
