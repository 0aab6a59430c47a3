"""What one gateway did, counted: the `event=gateway.stats` line an operator (and `bench.rehome`) reads.

Cumulative since the process started, like every counter an exporter scrapes; the line is written every
`STATS_EVERY_S` seconds while something changed, so an idle gateway stays quiet.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

STATS_EVERY_S = 10.0


@dataclass
class GatewayCounters:
    sessions_opened: int = 0
    """Hello transactions committed: a node's session opened here."""
    streams_refused: int = 0
    """New streams turned away: fenced, draining, over the handshake rate or the pending-Hello bound."""
    status_written: int = 0
    """Status reports written to the store (latest-wins: a report a newer one replaced is not written)."""
    hellos_waited: int = 0
    """Hellos that waited for a slot (the pending-Hello bound was reached) instead of being refused."""

    def snapshot(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def line(self, gateway_id: str, sessions: int) -> str:
        counts = " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
        return f"event=gateway.stats gateway={gateway_id} sessions={sessions} {counts}"
