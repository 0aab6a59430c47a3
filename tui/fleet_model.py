"""The fleet table's facts, as pure data: one row per node, the commands in flight, and the cells shown.

No I/O and no clock of its own: every function takes `now` (monotonic seconds) and the
server clock's offset, so the same inputs always render the same cells (snapshot tests
freeze `now`). Ages in replies are the server's, read at `fetched_at`; the age shown is
that age plus the time since the read, so a table on screen keeps ageing honestly while
no update comes.

Unknowns are n/a, never zero: the lanes and running columns come from the commands in
flight, which the TUI knows only when its snapshot of them was complete; GPUs come from
`GetNode`'s capacity, which `ListNodes` does not carry, so a row shows n/a there until
its detail is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bc.protocol import kinds
from bc.protocol.pb import admin_pb2
from tui import fmt

LANES = ("control", "provision", "bulk")
IN_FLIGHT = ("dispatched", "acked", "running")
_ORDER = {"pending": 0, "dispatched": 1, "acked": 2, "running": 3}

# (key, title) in display order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("node", "NODE"),
    ("conn", "CONNECTIVITY"),
    ("role", "ROLE"),
    ("labels", "LABELS"),
    ("gen", "GEN/APP/OBS"),
    ("lag", "LAG"),
    ("lanes", "LANES c/p/b"),
    ("run", "RUN"),
    ("sched", "CORDON/NOSCHED"),
    ("gpus", "GPUS"),
    ("heard", "HEARD"),
)

# A cell is its text and a style name from `STYLES` ("" for none).
Cell = tuple[str, str]
STYLES = {"bad": "bold reverse", "warn": "bold", "good": "", "dim": "dim", "": ""}


@dataclass
class NodeRow:
    info: admin_pb2.NodeInfo
    fetched_at: float
    detail: bool = False  # read with GetNode: capacity known
    lag_since_ms: int | None = None  # server ms when observed started to lag generation
    lag_exact: bool = False  # False: lag_since_ms is when the TUI first saw the lag (a lower bound)
    read_seq: int = 0  # the event seq the reply was read at: an older read never overwrites a newer one


@dataclass
class Inflight:
    """Commands not yet settled, per node, from a snapshot and then the command events."""

    known: bool = False
    by_id: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # id -> (node, lane, state)
    settled: set[str] = field(default_factory=set)

    def load(self, commands: Iterable[admin_pb2.CommandInfo], complete: bool) -> None:
        for c in commands:
            if c.state in _ORDER:
                self._put(c.id, c.node_id, c.lane or _lane(c.kind), c.state)
        self.known = complete

    def on_event(self, ev: admin_pb2.EventRecord, data: dict[str, object]) -> str | None:
        """Apply a command.* event; the node it concerns, or None."""
        if not ev.type.startswith("command."):
            return None
        node = str(data.get("node_id", ""))
        kind = str(data.get("kind", ""))
        if ev.type == "command.settled":
            self.by_id.pop(ev.subject, None)
            self.settled.add(ev.subject)
        elif ev.type == "command.enqueued":
            self._put(ev.subject, node, _lane(kind), "pending")
        elif ev.type == "command.updated":
            self._put(ev.subject, node, _lane(kind), str(data.get("state", "")))
        return node or None

    def _put(self, cid: str, node: str, lane: str, state: str) -> None:
        if cid in self.settled or state not in _ORDER:
            return
        old = self.by_id.get(cid)
        # Replayed events (the stream starts before the snapshot) never move a command back.
        if old is not None and _ORDER[old[2]] >= _ORDER[state]:
            return
        self.by_id[cid] = (node, lane, state)

    def lanes(self, node: str) -> dict[str, int] | None:
        if not self.known:
            return None
        out = dict.fromkeys(LANES, 0)
        for n, lane, state in self.by_id.values():
            if n == node and state in IN_FLIGHT:
                out[lane] = out.get(lane, 0) + 1
        return out

    def running(self, node: str) -> int | None:
        if not self.known:
            return None
        return sum(1 for n, _, s in self.by_id.values() if n == node and s == "running")


def _lane(kind: str) -> str:
    k = kinds.get(kind)
    return k.lane if k is not None else "control"


def node_of(ev: admin_pb2.EventRecord, data: dict[str, object]) -> str | None:
    """The fleet node an event changes, if any: its subject for node-level events, else `node_id` in its data."""
    if ev.type.startswith(("node.", "spec.", "security.node.")):
        return ev.subject or None
    node = data.get("node_id")
    return str(node) if node else None


def parse_data(ev: admin_pb2.EventRecord) -> dict[str, object]:
    try:
        doc = json.loads(ev.data_json or "{}")
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def note_lag(row: NodeRow, server_now_ms: int, spec_at_ms: int | None = None) -> None:
    """Keep when the row's observed generation started lagging; clear it once it caught up."""
    i = row.info
    if i.observed_generation >= i.generation:
        row.lag_since_ms, row.lag_exact = None, False
        return
    if spec_at_ms is not None and row.lag_since_ms is None:
        row.lag_since_ms, row.lag_exact = spec_at_ms, True
    elif row.lag_since_ms is None:
        row.lag_since_ms, row.lag_exact = server_now_ms, False


def _grown(age_ms: int, fetched_at: float, now: float) -> int:
    return -1 if age_ms < 0 else age_ms + int((now - fetched_at) * 1000)


def gpus(info: admin_pb2.NodeInfo, detail: bool) -> str:
    if not detail:
        return fmt.NA
    held = total = 0
    for c in info.capacity:
        if c.device_class == "gpu":
            held, total = held + c.booked_now, total + c.offered
    if not info.capacity:
        total = len(info.inventory.gpus)
    return f"{held}/{total}"


# The free-text columns and their widths when the table does not say (it sizes them to the terminal:
# `tui.columns`); a column missing from the widths given is shown whole.
FLEX: tuple[str, ...] = ("labels", "sched")
CLIP: dict[str, int] = {"labels": 24, "sched": 22}


def cells(
    row: NodeRow, inflight: Inflight, now: float, server_now_ms: int, widths: Mapping[str, int] = CLIP
) -> dict[str, Cell]:
    i = row.info
    conn_style = "" if i.state == "connected" else "bad"
    lag: Cell = ("-", "dim")
    gen_style = ""
    if i.observed_generation < i.generation:
        gen_style = "warn"
        if row.lag_since_ms is not None:
            lagged = fmt.age(max(0, server_now_ms - row.lag_since_ms))
            lag = (lagged if row.lag_exact else f"≥{lagged}", "warn")
        else:
            lag = (fmt.NA, "warn")
    lanes = inflight.lanes(i.node_id)
    lanes_text = fmt.NA if lanes is None else "/".join(str(lanes[x]) for x in LANES)
    # Node-reported texts as they show (escaped): the columns are sized and clipped on what the terminal draws.
    sched = fmt.flat(", ".join(["cordoned"] * i.cordoned + [r for r in i.no_schedule if r != "cordoned"]) or "-")
    labels = fmt.flat(",".join(f"{k}={v}" for k, v in sorted(i.labels.items()) if not k.startswith("bc.dev/")) or "-")
    heard = _grown(i.last_seen_age_ms, row.fetched_at, now)
    return {
        "node": (fmt.flat(i.node_id), ""),
        "conn": (fmt.flat(f"{i.state} {fmt.age(_grown(i.state_age_ms, row.fetched_at, now))}"), conn_style),
        "role": (fmt.flat(i.role or fmt.NA), ""),
        "labels": (fmt.clip(labels, widths.get("labels", len(labels))), "dim" if labels == "-" else ""),
        "gen": (f"{i.generation}/{i.applied_generation}/{i.observed_generation}", gen_style),
        "lag": lag,
        "lanes": (lanes_text, ""),
        "run": (fmt.count(inflight.running(i.node_id)), ""),
        "sched": (fmt.clip(sched, widths.get("sched", len(sched))), "warn" if sched != "-" else "dim"),
        "gpus": (gpus(i, row.detail), ""),
        "heard": ("never" if heard < 0 else fmt.age(heard), ""),
    }


def sort_value(row: NodeRow, column: str) -> tuple[object, ...]:
    """The order `s` cycles through; ties by node id, so an order never depends on arrival."""
    i = row.info
    by: dict[str, object] = {
        "node": "",
        "conn": i.state,
        "role": i.role,
        "gen": i.generation - i.observed_generation,
        "lag": -(row.lag_since_ms or 0),
        "heard": i.last_seen_age_ms,
        "sched": len(i.no_schedule) + i.cordoned,
    }
    return (by.get(column, ""), i.node_id)


def matches(row: NodeRow, text: str) -> bool:
    """The `/` filter: every word must appear in the node id, state, role, a label or a no-schedule reason."""
    i = row.info
    hay = " ".join(
        [i.node_id, i.state, i.role, *(f"{k}={v}" for k, v in i.labels.items()), *i.no_schedule]
        + (["cordoned"] if i.cordoned else [])
    ).lower()
    return all(w in hay for w in text.lower().split())
