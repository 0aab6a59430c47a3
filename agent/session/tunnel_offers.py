"""One session's tunnel offers, from the session's runner to the node's tunnels (agent.tunnel.service).

The session loop makes one `SessionOffers` per session that has a gRPC channel for the tunnels' `Carry`
streams, and hands it to both: the runner names `tunnel.offers` in its Hello (bc.protocol.capabilities), says
once welcomed whether the gateway answered it (`welcomed`), and passes on each offer the session carries
(`offer`); the tunnels wait for that answer (`on_session`) and read the offers here, or, from a gateway that
did not answer it (an older one), open `NodeTunnels.Listen` as before. The session's end ends both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from bc.protocol.pb.tunnel_pb2 import TunnelOffer

log = logging.getLogger("agent.tunnel")


class SessionOffers:
    def __init__(self) -> None:
        self._answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._items: asyncio.Queue[TunnelOffer] = asyncio.Queue()

    def welcomed(self, on_session: bool) -> None:
        """The gateway's Welcome: whether it sends the offers on the session (said once a session)."""
        if not self._answer.done():
            self._answer.set_result(on_session)

    def offer(self, offer: TunnelOffer) -> None:
        if not self._answer.done() or not self._answer.result():
            # A gateway that did not say it sends offers on the session: its offers come on Listen (or nowhere).
            log.warning("event=tunnel.offer-unasked sid=%s", offer.sid[:64])
            return
        self._items.put_nowait(offer)

    async def on_session(self) -> bool:
        """Whether this session carries the offers; waits for the Welcome."""
        return await asyncio.shield(self._answer)

    async def offers(self) -> AsyncIterator[TunnelOffer]:
        """The offers in the order the session carried them, until the session ends (its task is cancelled)."""
        while True:
            yield await self._items.get()
