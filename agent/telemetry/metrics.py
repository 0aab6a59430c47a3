"""What the agent counts for telemetry, kept in plain Python whether or not anything exports it.

Counters are cumulative (an exporter that starts late still reports the
process's totals); durations wait in bounded lists until the next export
drains them into histograms, so a node without telemetry holds at most
`MAX_PENDING` of each. Gauges are not kept here: the loop asks for a
`Gauges` snapshot at each export.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.health.readings import GpuReading

MAX_PENDING = 4096


@dataclass(frozen=True)
class Gauges:
    journal_bytes: int = 0
    unacked_events: int = 0
    session_connected: bool = False
    sessions_started: int = 0
    gpus: tuple[GpuReading, ...] = ()


@dataclass
class AgentMetrics:
    commands: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(lane, kind, state) -> settled commands."""
    command_seconds: list[tuple[str, str, float]] = field(default_factory=list)
    converge_seconds: list[tuple[str, float]] = field(default_factory=list)
    converge_passes: int = 0

    def command_settled(self, lane: str, kind: str, state: str, seconds: float) -> None:
        self.commands[(lane, kind, state)] += 1
        if len(self.command_seconds) < MAX_PENDING:
            self.command_seconds.append((lane, kind, seconds))

    def converge_pass(self, durations: Mapping[str, float]) -> None:
        self.converge_passes += 1
        if len(self.converge_seconds) + len(durations) <= MAX_PENDING:
            self.converge_seconds.extend(durations.items())

    def drain(self) -> tuple[list[tuple[str, str, float]], list[tuple[str, float]]]:
        out = (self.command_seconds, self.converge_seconds)
        self.command_seconds, self.converge_seconds = [], []
        return out
