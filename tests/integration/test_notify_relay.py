"""Wake-ups cross processes on PostgreSQL: two buses, each with its own relay, on one store's channels.

Each relay stands for one `bc serve` process: a poke or a new event on one bus wakes the other's
listeners, and no bus hears its own wake-up twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

import pytest

from bc.control.base.bus import Bus
from bc.seams.clock import SystemClock
from bc.store.notify import Incoming, PgRelay
from tests.pg import postgres_url

pytestmark = pytest.mark.postgres


@contextlib.asynccontextmanager
async def relayed(schema: str) -> AsyncIterator[tuple[Bus, PgRelay]]:
    bus = Bus()
    relay = PgRelay(postgres_url(), SystemClock(), schema)
    bus.relay_to(relay)
    relay.start(Incoming(bus.local_node_changed, bus.local_events_published))
    try:
        async with asyncio.timeout(10):
            await relay.listening.wait()
        yield bus, relay
    finally:
        await relay.stop()


def channel_prefix() -> str:
    """Channels are per database: a name of this run's own, so concurrent test runs never hear each other."""
    return "relay_" + secrets.token_hex(4)


async def test_a_poke_and_an_event_reach_the_other_process_once() -> None:
    one = channel_prefix()
    async with relayed(one) as (a, ra), relayed(one) as (b, rb):
        pokes_a: list[str] = []
        pokes_b: list[str] = []
        a.on_node_changed(pokes_a.append)
        b.on_node_changed(pokes_b.append)
        waiter = asyncio.create_task(b.wait_events(10))

        a.node_changed("n7")
        a.events_published()

        async with asyncio.timeout(10):
            await waiter  # the event was sent last, on one connection: the poke came before it
        assert pokes_b == ["n7"]
        assert pokes_a == ["n7"]  # its own listener, once, in process: the echo from the database is dropped
        assert rb.received == 2 and ra.received == 0  # (a's own count of sends may lag b's receipt)


async def test_another_schema_hears_nothing() -> None:
    mine, other = channel_prefix(), channel_prefix()
    async with relayed(mine) as (a, _), relayed(other) as (c, rc):
        heard: list[str] = []
        c.on_node_changed(heard.append)
        a.node_changed("n1")
        async with relayed(mine) as (b, _):
            # b listens on a's channels from here on: a second poke reaches b, never c.
            got: list[str] = []
            arrived = asyncio.Event()
            b.on_node_changed(lambda n: (got.append(n), arrived.set()))
            a.node_changed("n2")
            async with asyncio.timeout(10):
                await arrived.wait()
        assert got == ["n2"] and heard == [] and rc.received == 0
