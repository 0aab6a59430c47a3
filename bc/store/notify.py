"""Wake-ups between `bc serve` processes on one PostgreSQL store: LISTEN/NOTIFY.

`bc.control.base.bus.Bus` wakes what lives in this process; `PgRelay` carries the same wake-ups to every
other process on the store. A wake-up carries no data and the receiver re-reads the store, so a
lost one costs latency, never correctness (the sessions' and watchers' backstops catch up): the
relay may drop under pressure and reconnects on its own.

Outgoing wake-ups are queued and sent by one task on one autocommit connection, a node's poke
queued once however often it is asked for meanwhile. Incoming ones arrive on a second connection
that only LISTENs; the relay ignores what its own sending connection sent (the sender's backend
pid), since this process's bus has already woken its own listeners.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from bc.runtime.aio import cancel_and_wait
from bc.seams.clock import Clock
from bc.store.postgres import application_name

log = logging.getLogger("bc.notify")

NODE = "bc_node"
EVENTS = "bc_events"
CHANNELS = (NODE, EVENTS)
RECONNECT_S = 1.0
MAX_QUEUED = 10_000


@dataclass
class Incoming:
    """What the relay calls when another process sent a wake-up."""

    node_changed: Callable[[str], None]
    events_published: Callable[[], None]


class PgRelay:
    def __init__(self, url: str, clock: Clock, schema: str | None = None) -> None:
        self.url = url
        self.clock = clock
        # Channels are per database: a schema of its own (tests, two fleets in one database) gets its own names.
        self._prefix = f"{schema}_" if schema else ""
        self._schema = schema
        self._queue: dict[tuple[str, str], None] = {}  # insertion-ordered, deduplicated
        self._wake = asyncio.Event()
        self._sender_pid = 0
        self._tasks: list[asyncio.Task[None]] = []
        self.sent = 0
        self.received = 0
        self.dropped = 0
        self.listening = asyncio.Event()

    def _channel(self, name: str) -> str:
        return self._prefix + name

    # -- outgoing ------------------------------------------------------------
    def node_changed(self, node_id: str) -> None:
        self._put(NODE, node_id)

    def events_published(self) -> None:
        self._put(EVENTS, "")

    def _put(self, channel: str, payload: str) -> None:
        if len(self._queue) >= MAX_QUEUED:
            self.dropped += 1
            return
        self._queue[(channel, payload)] = None
        self._wake.set()

    async def _send_loop(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, application_name=application_name(self._schema)
                ) as conn:
                    self._sender_pid = conn.info.backend_pid
                    while True:
                        if not self._queue:
                            self._wake.clear()
                            await self._wake.wait()
                        batch = list(self._queue)
                        self._queue.clear()
                        for channel, payload in batch:
                            await conn.execute("SELECT pg_notify(%s, %s)", (self._channel(channel), payload))
                            self.sent += 1
            except (psycopg.Error, OSError) as e:
                log.warning("event=notify.send-failed error=%s", str(e).strip().splitlines()[0] if str(e) else e)
                await self.clock.sleep(RECONNECT_S)

    # -- incoming ------------------------------------------------------------
    async def _listen_loop(self, incoming: Incoming) -> None:
        names = {self._channel(c): c for c in CHANNELS}
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, application_name=application_name(self._schema)
                ) as conn:
                    for channel in names:
                        await conn.execute(f'LISTEN "{channel}"')
                    self.listening.set()
                    # Whatever was missed while not listening: wake everything once.
                    incoming.events_published()
                    async for n in conn.notifies():
                        if n.pid == self._sender_pid:
                            continue
                        self.received += 1
                        self._deliver(names.get(n.channel, ""), n.payload, incoming)
            except (psycopg.Error, OSError) as e:
                self.listening.clear()
                log.warning("event=notify.listen-failed error=%s", str(e).strip().splitlines()[0] if str(e) else e)
                await self.clock.sleep(RECONNECT_S)

    @staticmethod
    def _deliver(channel: str, payload: str, incoming: Incoming) -> None:
        if channel == NODE:
            incoming.node_changed(payload)
        elif channel == EVENTS:
            incoming.events_published()

    # -- lifecycle -----------------------------------------------------------
    def start(self, incoming: Incoming) -> None:
        self._tasks = [
            asyncio.create_task(self._send_loop(), name="notify-send"),
            asyncio.create_task(self._listen_loop(incoming), name="notify-listen"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
