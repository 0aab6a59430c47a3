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

When the stream breaks the link goes down (the banner says for how long, and when the next
attempt is) and the feed tries again with the clients' one back-off (`bc.client.reconnect`: 0.2 s
doubling to 2 s) on the injected clock, opening a fresh connection each time. Whatever fails an
attempt (not only our errors: a grpc call cancelled under it, a bug) fails that attempt only: a
feed that stopped trying would leave every screen frozen behind a banner that never changes.
On a reconnect the fleet is read again at once (and every node's detail after it), so the rows
are current within a round trip of the server answering, not at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from bc.client.reconnect import CLIENT_BACKOFF, Backoff
from bc.errors import BcError, NotFound, Unauthenticated
from bc.protocol.pb import admin_pb2
from bc.seams.clock import Clock
from tui.source import Connect, Source
from tui.state import FleetState

log = logging.getLogger(__name__)

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
        backoff: Backoff = CLIENT_BACKOFF,
        detail_concurrency: int = 8,
    ) -> None:
        self._connect = connect
        self._clock = clock
        self.state = state
        self._listener = listener
        self._poll_s = poll_s
        self._backoff = backoff
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
        while True:
            try:
                async with self._connect() as src:
                    await self._session(src)
            except Unauthenticated as e:
                delay = self._refused(e.message)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the app is stopping the feed
                delay = self._down("the connection was cancelled")  # a call cancelled under us: try again
            except BcError as e:
                delay = self._down(e.message)
            except Exception as e:
                delay = self._down(f"{type(e).__name__}: {e}")
            finally:
                self.source = None
            await self._clock.sleep(delay)

    def _down(self, reason: str) -> float:
        """Record a failed attempt (the banner says it); the delay before the next one."""
        link = self.state.link
        link.live = False
        delay = link.outage.failed(reason.split(";")[0], self._clock.monotonic(), self._backoff)
        try:
            self._listener.link_changed()
        except Exception:
            log.exception("tui.link-changed-failed")
        return delay

    def _refused(self, reason: str) -> float:
        """bc serve refused this operator (revoked, or a role lowered mid-stream): the banner says why and
        the rows go, so a revoked screen shows no stale fleet; a later session (a new role) reads it again."""
        self.state.link.refused = reason
        self._snapshotted = False
        gone = self.state.forget_fleet()
        delay = self._down(reason)
        self._listener.nodes_changed(gone)
        return delay

    async def _session(self, src: Source) -> None:
        info = await src.server_info()
        self.state.on_server(info, self._clock.monotonic())
        if not self._snapshotted:
            await self._snapshot(src)
        else:
            await self._refresh(src)
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

    async def _refresh(self, src: Source) -> None:
        """Back after an outage: the fleet as it is now (heartbeats moved no event), every detail after it."""
        fleet = await src.fleet_snapshot()
        self._listener.nodes_changed(self.state.on_nodes(fleet, self._clock.monotonic()))
        self.mark_dirty(sorted(self.state.rows))

    def _up(self) -> None:
        link = self.state.link
        link.live = True
        link.outage.recovered()
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
