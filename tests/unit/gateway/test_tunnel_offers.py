"""A node's offers as the hub hands them: to a Listen stream (`bc.gateway.tunnels.Offers`, `TunnelHub.listen`, an
older agent's) in the order they were made, a waiting stream woken by the next one, a newer Listen of the node
ending the older; or to the node's session (`SessionDriver` as the hub's sink), which sends them on its stream
only when the node's Hello asked for them, and drops what it had not sent once a newer sink of the node took
over."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any, cast

from bc.gateway.session_driver import SessionDriver
from bc.gateway.tunnels import Offers, Relay, TunnelHub
from bc.pki.identity import PeerIdentity
from bc.protocol.capabilities import TUNNEL_OFFERS
from bc.protocol.pb import common_pb2, session_pb2
from bc.protocol.pb.session_pb2 import GatewayMessage, NodeMessage
from bc.protocol.pb.tunnel_pb2 import TunnelOffer


async def test_offers_come_out_in_order_and_none_ends_them() -> None:
    box = Offers()
    box.put_nowait(TunnelOffer(sid="a"))
    box.put_nowait(TunnelOffer(sid="b"))
    box.put_nowait(None)
    got = [await box.get(), await box.get(), await box.get()]
    assert [o.sid if o is not None else None for o in got] == ["a", "b", None]


async def test_a_waiting_stream_is_woken_by_the_next_offer() -> None:
    box = Offers()
    waiting = asyncio.create_task(box.get())
    await asyncio.sleep(0)  # the reader is parked on its future
    assert not waiting.done()
    box.put_nowait(TunnelOffer(sid="late"))
    offer = await asyncio.wait_for(waiting, 5)
    assert offer is not None and offer.sid == "late"


async def test_a_cancelled_wait_leaves_the_offer_for_the_next_reader() -> None:
    box = Offers()
    waiting = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    box.put_nowait(TunnelOffer(sid="kept"))
    offer = await asyncio.wait_for(box.get(), 5)
    assert offer is not None and offer.sid == "kept"


async def test_a_newer_listen_of_the_node_ends_the_older_one() -> None:
    hub = TunnelHub()
    seen: list[str] = []

    async def drain(name: str) -> None:
        async for offer in hub.listen("n1"):
            seen.append(f"{name}:{offer.sid}")

    older = asyncio.create_task(drain("older"))
    await asyncio.sleep(0)
    assert hub.listening("n1")
    newer = asyncio.create_task(drain("newer"))
    await asyncio.wait_for(older, 5)  # ended by the newer Listen, not by an offer
    assert hub.listening("n1")
    hub.close_node("n1", "the session left")
    await asyncio.wait_for(newer, 5)
    assert not hub.listening("n1") and seen == []


# -- the node's session as its sink (offers on the session stream, bc.protocol.capabilities) ---------------


class Sink:
    """A sink as the hub sees it: what it was handed, None included."""

    def __init__(self) -> None:
        self.got: list[str | None] = []

    def put_nowait(self, item: TunnelOffer | None) -> None:
        self.got.append(item.sid if item is not None else None)


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


async def test_the_newest_sink_of_a_node_takes_its_offers_and_its_end_ends_the_nodes_tunnels() -> None:
    hub = TunnelHub()
    session, newer = Sink(), Sink()
    hub.hold("n1", session)
    hub.hold("n1", newer)  # a newer session of the node (or an older agent's Listen) took over
    assert session.got == [None]
    hub.release("n1", session)  # the older one's end: the node's tunnels here are the newer one's
    assert hub.listening("n1")
    relay = Relay("t-1", "n1", "op", "kid")
    relay.task = asyncio.create_task(_forever())
    hub.relays[relay.sid] = relay
    hub.release("n1", newer)
    assert not hub.listening("n1")
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(relay.task, 5)
    assert relay.task.cancelled() and relay.end_reason == "the node's session left this gateway"


def _driver(hub: TunnelHub) -> tuple[SessionDriver, list[GatewayMessage]]:
    sent: list[GatewayMessage] = []

    class Link:
        async def send(self, msg: GatewayMessage) -> None:
            sent.append(msg)

    host: Any = SimpleNamespace(
        cfg=SimpleNamespace(heartbeat_interval_s=10.0), clock=SimpleNamespace(monotonic=lambda: 0.0), tunnels=hub
    )
    peer = PeerIdentity(kind="node", name="n1", serial="5a", not_after=0.0)
    return SessionDriver(host, cast(Any, Link()), peer), sent


def _open(d: SessionDriver, takes_offers: bool) -> None:
    hello = NodeMessage(hello=session_pb2.Hello(node_id="n1", capabilities=[TUNNEL_OFFERS] if takes_offers else []))
    d.core.on_message(hello, 0.0)
    d.core.opened(3, 0, 1_000, common_pb2.TrustBundle(), "gw-1")


async def test_a_session_that_takes_offers_sends_them_in_order_and_a_newer_sink_drops_the_unsent() -> None:
    hub = TunnelHub()
    d, sent = _driver(hub)
    _open(d, takes_offers=True)
    hub.hold("n1", d)
    d.put_nowait(TunnelOffer(sid="a"))
    d.put_nowait(TunnelOffer(sid="b"))
    await d._send_offers()
    assert [m.tunnel_offer.sid for m in sent] == ["a", "b"]
    d.put_nowait(TunnelOffer(sid="c"))
    hub.hold("n1", Sink())  # superseded before its task sent "c": dropped, as a Listen stream's end drops it
    await d._send_offers()
    assert [m.tunnel_offer.sid for m in sent] == ["a", "b"]


async def test_an_older_agents_session_sends_no_offer() -> None:
    d, sent = _driver(TunnelHub())
    _open(d, takes_offers=False)
    d.put_nowait(TunnelOffer(sid="a"))  # the hub never does this (the node listens), and nothing goes out if it did
    await d._send_offers()
    assert sent == []
