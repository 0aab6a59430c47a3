"""The gateway's relay of a tunnel (bc.gateway.tunnels): order kept, bytes counted, and a bound on what it holds.

Two in-memory ends stand in for the operator's and the node's gRPC streams (the fake is at the transport's edge;
the relay is the production code). A fast sender and a reader that does not read must leave at most the bound
buffered in the relay (plus the one frame in each end's hand), whatever the sender offers.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from bc.gateway.tunnels import MAX_BUFFERED, ByteQueue, Relay, TunnelHub
from bc.protocol.pb.tunnel_pb2 import TunnelEnd, TunnelFrame


class End:
    """One end of a relay: frames it will send (`inbox`), frames it received (`got`), reading only when `open`."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[TunnelFrame | None] = asyncio.Queue()
        self.got: list[TunnelFrame] = []
        self.open = asyncio.Event()
        self.open.set()

    async def send(self, frame: TunnelFrame) -> None:
        await self.open.wait()
        self.got.append(frame)

    async def recv(self) -> TunnelFrame | None:
        return await self.inbox.get()


def data(n: int, fill: int = 1) -> TunnelFrame:
    return TunnelFrame(data=bytes([fill % 256]) * n)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 64 * 1024), min_size=1, max_size=40))
def test_frames_arrive_in_order_counted_and_the_relay_holds_at_most_its_bound(sizes: list[int]) -> None:
    async def go() -> None:
        operator, node = End(), End()
        node.open.clear()  # the node does not read yet: everything the operator sends piles up in the relay
        hub, r = TunnelHub(), Relay("t-1", "n1", "alice", "k1")
        task = asyncio.create_task(hub.relay(r, operator, node))
        for i, n in enumerate(sizes):
            operator.inbox.put_nowait(data(n, i))
        for _ in range(50):
            await asyncio.sleep(0)  # let the relay take what it may (no clock: just turns of the loop)
        assert r.bytes_up <= MAX_BUFFERED + 2 * 64 * 1024
        node.open.set()
        operator.inbox.put_nowait(TunnelFrame(end=TunnelEnd(reason="done", exit_code=3, has_exit_code=True)))
        node.inbox.put_nowait(TunnelFrame(end=TunnelEnd(reason="closed")))
        await asyncio.wait_for(task, 5)
        sent = [f.data for f in node.got if f.WhichOneof("msg") == "data"]
        assert sent == [bytes([i % 256]) * n for i, n in enumerate(sizes)]
        assert r.bytes_up == sum(sizes) and r.exit_code == 3
        assert r.peak_buffered <= max(MAX_BUFFERED, max(sizes))

    asyncio.run(go())


async def test_a_frame_of_another_kind_or_too_large_ends_the_tunnel() -> None:
    for bad in (TunnelFrame(data=b"x" * (128 * 1024 + 1)), TunnelFrame(open={"token": "x"})):
        operator, node = End(), End()
        r = Relay("t-1", "n1", "alice", "k1")
        task = asyncio.create_task(TunnelHub().relay(r, operator, node))
        operator.inbox.put_nowait(bad)
        await asyncio.wait_for(task, 5)
        assert "is not relayed" in r.end_reason
        # Nothing of it reached the node, only the relay's `end` saying why (so the node's side ends now too).
        assert [(f.WhichOneof("msg"), f.end.reason) for f in node.got] == [("end", r.end_reason)]


async def test_the_byte_queue_takes_one_oversized_item_rather_than_stick() -> None:
    q = ByteQueue(10)
    await q.put(data(100), 100)  # alone, it goes in
    put = asyncio.create_task(q.put(data(1), 1))
    await asyncio.sleep(0)
    assert not put.done() and q.size == 100
    await q.get()
    await asyncio.wait_for(put, 1)
    assert q.peak == 100
