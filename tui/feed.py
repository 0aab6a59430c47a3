"""The live feed: a snapshot, then the Admin `Watch` stream from the seq the snapshot was read at.

One task per connection attempt:

1. `ServerInfo` (who we are, the server's clock).
2. On the first connection only, the snapshot: `ListNodes` and the commands in flight, each
   reply carrying the event seq it was read at (in the same transaction). The stream starts
   after the smallest of them, so nothing falls between a snapshot and the stream; an event
   the other snapshot already reflects is applied again harmlessly (state only moves forward,
   and a reply older than the row on screen is dropped by its seq). On a reconnect the stream
   resumes from the cursor, which holds every change since.
3. `Watch(after_seq=cursor)`; each event marks the node it names dirty, and a refetch task
   reads dirty nodes with `GetNode` (coalesced: a burst of events on one node is one read).
   `ListNodes` is polled every `poll_s` too: heartbeats move "last heard" without an event.

When the stream breaks the link goes down (the banner shows the data's age) and the feed
retries with capped back-off on the injected clock, opening a fresh connection each time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from bc.clock import Clock
from bc.errors import BcError, NotFound, Unauthenticated
from bc.protocol.pb import admin_pb2
from tui.source import Connect, Source
from tui.state import FleetState

IN_FLIGHT_LIMIT = 1000  # ListCommands' cap: a full page means the snapshot may be incomplete
HISTORY = 200  # events before the snapshot shown on the Events screen (read once, at the first connection)


@dataclass
class Listener:
    """What the app is told; every callback runs on the app's loop."""

    nodes_changed: Callable[[set[str]], None]
    event: Callable[[admin_pb2.EventRecord], None]
    link_changed: Callable[[], None]


class Feed:
    def __init__(
        self,
        connect: Connect,
        clock: Clock,
        state: FleetState,
        listener: Listener,
        *,
        poll_s: float = 5.0,
        backoff_s: tuple[float, float] = (0.2, 3.0),
        detail_concurrency: int = 8,
    ) -> None:
        self._connect = connect
        self._clock = clock
        self.state = state
        self._listener = listener
        self._poll_s = poll_s
        self._backoff = backoff_s
        self._concurrency = detail_concurrency
        self._dirty: dict[str, None] = {}  # insertion-ordered set
        self._wake = asyncio.Event()
        self._snapshotted = False
        self.source: Source | None = None  # the live connection, for screens' own reads and writes

    def mark_dirty(self, node_ids: set[str] | list[str]) -> None:
        for n in node_ids:
            self._dirty[n] = None
        if self._dirty:
            self._wake.set()

    async def run(self) -> None:
        delay = self._backoff[0]
        while True:
            try:
                async with self._connect() as src:
                    await self._session(src)
            except Unauthenticated as e:
                self._refused(e.message)
            except (BcError, OSError) as e:
                self._down(str(e))
            finally:
                self.source = None
            await self._clock.sleep(delay)
            delay = min(delay * 2, self._backoff[1])
            if self.state.link.live:
                delay = self._backoff[0]

    def _down(self, reason: str) -> None:
        link = self.state.link
        now = self._clock.monotonic()
        if link.live or link.down_since is None:
            link.down_since = now
        link.live = False
        link.reason = reason.split(";")[0]
        link.attempts += 1
        self._listener.link_changed()

    def _refused(self, reason: str) -> None:
        """bc serve refused this operator (revoked, or a role lowered mid-stream): the banner says why and
        the rows go, so a revoked screen shows no stale fleet; a later session (a new role) reads it again."""
        self.state.link.refused = reason
        self._snapshotted = False
        gone = self.state.forget_fleet()
        self._down(reason)
        self._listener.nodes_changed(gone)

    async def _session(self, src: Source) -> None:
        info = await src.server_info()
        self.state.on_server(info, self._clock.monotonic())
        if not self._snapshotted:
            await self._snapshot(src)
        self.source = src
        stream = src.watch(after_seq=self.state.cursor)
        tasks = [asyncio.create_task(self._poll(src)), asyncio.create_task(self._refetch(src))]
        self._up()  # the server just answered ServerInfo on this connection
        try:
            async for ev in stream:
                self._apply(ev)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, BcError, OSError):
                    await t
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        raise BcError("the event stream ended")

    async def _snapshot(self, src: Source) -> None:
        fleet = await src.fleet_snapshot()
        seqs = [fleet.event_seq]
        cmds: list[admin_pb2.CommandInfo] = []
        complete = True
        for s in ("pending", "dispatched", "acked", "running"):
            page = await src.commands_snapshot(state=s, limit=IN_FLIGHT_LIMIT)
            complete = complete and len(page.commands) < IN_FLIGHT_LIMIT
            cmds.extend(page.commands)
            seqs.append(page.event_seq)
        now = self._clock.monotonic()
        self.state.inflight.load(cmds, complete)
        changed = self.state.on_nodes(fleet, now)
        self.state.cursor = max(self.state.cursor, min(seqs))
        start = max(0, self.state.cursor - HISTORY)
        history = await src.list_events(after_seq=start, limit=HISTORY)
        self.state.events.extend(ev for ev in history if ev.seq <= self.state.cursor)
        self._snapshotted = True
        self.state.link.data_at = now
        self._listener.nodes_changed(changed)
        self.mark_dirty(sorted(self.state.rows))  # GPUs and sections need GetNode; read them in the background

    def _up(self) -> None:
        link = self.state.link
        link.live, link.down_since, link.reason, link.attempts = True, None, "", 0
        link.refused = ""
        link.data_at = self._clock.monotonic()
        self._listener.link_changed()

    def _apply(self, ev: admin_pb2.EventRecord) -> None:
        node = self.state.on_event(ev)
        if node is False:
            return
        self.state.link.data_at = self._clock.monotonic()
        if isinstance(node, str):
            if node in self.state.rows or ev.type.startswith("node."):
                self.mark_dirty([node])
            self._listener.nodes_changed({node} & set(self.state.rows))
        self._listener.event(ev)

    async def _poll(self, src: Source) -> None:
        while True:
            await self._clock.sleep(self._poll_s)
            fleet = await src.fleet_snapshot()
            now = self._clock.monotonic()
            self._listener.nodes_changed(self.state.on_nodes(fleet, now))
            if self.state.link.live:
                self.state.link.data_at = now

    async def _refetch(self, src: Source) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                batch = list(self._dirty)[: self._concurrency * 4]
                for n in batch:
                    self._dirty.pop(n, None)
                replies = await asyncio.gather(*(self._get(src, n) for n in batch))
                now = self._clock.monotonic()
                changed = set()
                for info in replies:
                    if info is not None and self.state.on_node(info, now):
                        changed.add(info.node_id)
                self._listener.nodes_changed(changed)

    async def _get(self, src: Source, node_id: str) -> admin_pb2.NodeInfo | None:
        try:
            return await src.get_node(node_id)
        except NotFound:
            return None
