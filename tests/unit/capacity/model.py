"""A model of the store around the placement pass: what the wiring will do, kept small enough to check.

`Lab` holds the facts the store will hold (nodes, pending reservations, live bookings, usage spans,
committed usage windows, releases, connectivity transitions) and applies operator and fleet events to
them. After every event it runs the pass once on those facts (a quiet step), carries the plan out as the
wiring must (placements book and start billing, failures leave the queue, ended windows release with
`window-ended`), flushes usage, and runs every invariant checker. The planner is a parameter, so a test
can hand it a broken one and see a checker catch it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bc.control.capacity.invariants import (
    Release,
    Transition,
    check_billing_conservation,
    check_estimates,
    check_host_resources,
    check_no_overlap,
    check_no_release_on_disconnect,
    check_nothing_placeable_pending,
)
from bc.control.capacity.placement_plan import Booking, NodeInfo, Placement, Plan, Request, Wait, plan
from bc.control.capacity.usage_windows import Span, UsageWindow, last_flushed_end, open_window, windows_to_flush

Planner = Callable[[Sequence[NodeInfo], Sequence[Booking], Sequence[Request], int], Plan]


@dataclass
class Lab:
    nodes: dict[str, NodeInfo]
    now: int
    planner: Planner = plan
    pending: dict[str, Request] = field(default_factory=dict)
    live: dict[str, Booking] = field(default_factory=dict)
    past: list[Booking] = field(default_factory=list)  # bookings that ended: I1 is over all time
    spans: dict[str, Span] = field(default_factory=dict)
    windows: dict[tuple[str, int], UsageWindow] = field(default_factory=dict)
    releases: list[Release] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    last: Plan | None = None
    last_facts: tuple[list[NodeInfo], list[Booking], list[Request], int] | None = None
    seq: int = 0
    flushing: bool = True  # False while a crash keeps flushes from committing

    # ---- events ----

    def reserve(self, rid: str, **kw: object) -> None:
        self.seq += 1
        self.pending[rid] = Request(rid, seq=self.seq, **kw)  # type: ignore[arg-type]
        self.step()

    def release(self, rid: str) -> None:
        if rid in self.pending:  # unbooked: it just leaves the queue
            del self.pending[rid]
        elif rid in self.live:
            self._end(rid, "released")
        self.step()

    def advance(self, ms: int) -> None:
        self.now += ms
        self.step()

    def set_node(self, node_id: str, **facts: object) -> None:
        before = self.nodes[node_id]
        after = dataclasses.replace(before, **facts)  # type: ignore[arg-type]
        self.nodes[node_id] = after
        if after.connectivity != before.connectivity:
            self.transitions.append(Transition(node_id, self.now, after.connectivity))
        self.step()

    def crash(self, *, lose_flushes: bool) -> None:
        """The pass restarts from the rows: the same facts must give the same plan. `lose_flushes`: the
        flushes of this step never commit (they are done again, from the last committed end, next time)."""
        assert self.last_facts is not None
        nodes, live, pending, now = self.last_facts  # the crash hit after the pass, before its transaction
        again = self.planner(nodes[::-1], live[::-1], pending[::-1], now)
        assert again == self.last, "the pass gave a different plan on the same facts"
        self.flushing = not lose_flushes
        self.step()
        self.flushing = True

    # ---- the wiring, as a model ----

    def step(self) -> None:
        self.last_facts = (list(self.nodes.values()), list(self.live.values()), list(self.pending.values()), self.now)
        p = self.planner(*self.last_facts)
        self.last = p
        for rid in p.ended:
            self._end(rid, "window-ended")
        for o in p.outcomes:
            req = self.pending[o.reservation_id]
            if isinstance(o, Placement):
                del self.pending[o.reservation_id]
                self.live[o.reservation_id] = o.booking()
                self.spans[o.reservation_id] = Span(
                    o.reservation_id, o.node_id, "t", req.device_class, len(o.atoms), req.start_ms, o.end_ms, self.now
                )
            elif not isinstance(o, Wait):
                del self.pending[o.reservation_id]
                self.failed[o.reservation_id] = o.reason
        self.flush()

    def _end(self, rid: str, reason: str) -> None:
        b = self.live.pop(rid)
        if b.start_ms < self.now:  # what was booked until now stays booked history; a hold never started leaves none
            self.past.append(dataclasses.replace(b, end_ms=self.now if b.end_ms is None else min(b.end_ms, self.now)))
        s = self.spans[rid]
        self.spans[rid] = dataclasses.replace(s, released_at_ms=self.now)
        self.releases.append(Release(rid, b.node_id, self.now, reason))

    def flush(self) -> None:
        if not self.flushing:
            return
        committed = list(self.windows.values())
        for rid, s in sorted(self.spans.items()):
            for w in windows_to_flush(s, last_flushed_end(committed, rid), self.now):
                old = self.windows.setdefault(w.key, w)  # insert ... on conflict do nothing
                assert old == w, f"a retried flush wrote a different window under {w.key}"

    def usage(self) -> list[UsageWindow]:
        """The committed windows and each hold's open one up to now: what `bc usage` adds up."""
        committed = list(self.windows.values())
        opened = [open_window(s, last_flushed_end(committed, rid), self.now) for rid, s in sorted(self.spans.items())]
        return committed + [w for w in opened if w is not None]

    # ---- the invariants ----

    def violations(self) -> list[str]:
        assert self.last is not None
        held = {w.reservation_id: w.held for w in self.last.waits}
        waiting = [(r, held.get(r.reservation_id)) for r in self.pending.values()]
        found = [
            check_no_overlap([*self.past, *self.live.values()]),
            check_host_resources(list(self.nodes.values()), [*self.past, *self.live.values()]),
            check_no_release_on_disconnect(self.releases, self.transitions),
            check_nothing_placeable_pending(list(self.nodes.values()), list(self.live.values()), waiting, self.now),
            check_estimates(list(self.nodes.values()), list(self.live.values()), waiting, self.now),
            check_billing_conservation(list(self.spans.values()), self.usage(), self.now),
        ]
        return [v.sentence for v in found if v is not None]
