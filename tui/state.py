"""What the TUI knows, as plain data the feed writes and the screens read.

Pure: the feed passes `now` (monotonic seconds) to every call; nothing here reads a clock
or the network. `apply_event` is idempotent by seq: an event at or below the cursor is
ignored, so a stream that starts before the snapshot (or resumes after a reconnect)
never shows an event twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from bc.client.reconnect import Outage
from bc.protocol.pb import admin_pb2
from tui.fleet_model import Inflight, NodeRow, node_of, note_lag, parse_data

EVENTS_KEPT = 5000


@dataclass
class Link:
    """The connection as the banner tells it: live, or an outage (`bc.client.reconnect.Outage`, the policy every
    client shares: how long the server has been away, the attempts, when the next one starts)."""

    live: bool = False
    data_at: float | None = None  # monotonic, when the data on screen was last known current
    outage: Outage = field(default_factory=Outage)
    refused: str = ""  # bc serve refused this operator (revoked, role lowered): why, as it said
    notice: str = ""  # a message the banner shows whatever the link's state (e.g. why the server closed us out)

    @property
    def down_since(self) -> float | None:
        return self.outage.since

    @property
    def reason(self) -> str:
        return self.outage.reason

    @property
    def attempts(self) -> int:
        return self.outage.attempts


@dataclass
class FleetState:
    rows: dict[str, NodeRow] = field(default_factory=dict)
    inflight: Inflight = field(default_factory=Inflight)
    events: deque[admin_pb2.EventRecord] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    cursor: int = 0  # the seq of the last event applied
    server: admin_pb2.ServerInfoResponse = field(default_factory=admin_pb2.ServerInfoResponse)
    server_at: float = 0.0
    link: Link = field(default_factory=Link)
    seen_events: int = 0

    def server_now_ms(self, now: float) -> int:
        return self.server.server_time_ms + int((now - self.server_at) * 1000)

    def on_server(self, info: admin_pb2.ServerInfoResponse, now: float) -> None:
        self.server, self.server_at = info, now

    def on_nodes(self, reply: admin_pb2.ListNodesResponse, now: float) -> set[str]:
        """A full list: update every row in place (keeping detail already read); the ids that changed."""
        changed: set[str] = set()
        seen = set()
        for info in reply.nodes:
            seen.add(info.node_id)
            if self._put(info, now, detail=False, seq=reply.event_seq):
                changed.add(info.node_id)
        for gone in set(self.rows) - seen:
            if self.rows[gone].read_seq <= reply.event_seq:
                del self.rows[gone]
                changed.add(gone)
        return changed

    def on_node(self, info: admin_pb2.NodeInfo, now: float) -> bool:
        return self._put(info, now, detail=True, seq=info.event_seq)

    def _put(self, info: admin_pb2.NodeInfo, now: float, *, detail: bool, seq: int) -> bool:
        row = self.rows.get(info.node_id)
        if row is None:
            row = self.rows[info.node_id] = NodeRow(info, now, detail, read_seq=seq)
        elif seq < row.read_seq:
            return False  # read before the row on screen: replies may cross
        else:
            row.read_seq = seq
            if not detail and row.detail:
                # A list reply lacks capacity, inventory, sections: keep what GetNode told, and take the rest
                # from the list reply as it is. (Merging the reply into the old row appended its repeated
                # fields to the old ones, so no-schedule reasons grew "new, new, new" at each poll, and kept
                # a field the reply had cleared.)
                merged = admin_pb2.NodeInfo()
                merged.CopyFrom(info)
                merged.capacity.extend(row.info.capacity)
                merged.host_capacity.CopyFrom(row.info.host_capacity)
                merged.inventory.CopyFrom(row.info.inventory)
                merged.sections.extend(row.info.sections)
                merged.conditions.extend(row.info.conditions)
                info = merged
            row.info, row.fetched_at = info, now
            row.detail = row.detail or detail
        note_lag(row, self.server_now_ms(now))
        return True

    def forget_fleet(self) -> set[str]:
        """Drop every row (the server refused us: nothing on screen may look current); the ids dropped."""
        gone = set(self.rows)
        self.rows.clear()
        return gone

    def on_event(self, ev: admin_pb2.EventRecord) -> str | bool | None:
        """Apply one event; False when it was already applied, else the node to read again (or None)."""
        if ev.seq <= self.cursor:
            return False
        self.cursor = ev.seq
        self.events.append(ev)
        self.seen_events += 1
        data = parse_data(ev)
        cmd_node = self.inflight.on_event(ev, data)
        node = node_of(ev, data) or cmd_node
        if ev.type == "node.spec" and node in self.rows:
            row = self.rows[node]
            gen = data.get("generation")
            if isinstance(gen, int) and gen > row.info.generation:
                row.info.generation = gen
            note_lag(row, ev.at_ms, spec_at_ms=ev.at_ms)
        return node
